// simba doctor (docs/cli.md): connects to a store and reports what it found
// and what of it is unsafe for locks, with an exit code a deployment check
// can act on.
#include <algorithm>
#include <cstdio>

#include "simba/registry.h"
#include "simba/uri.h"
#include "tools/cli/cli.h"

namespace simba::cli {
namespace {

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

}  // namespace

int doctor_command(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.with_value = {"--store", "--timeout"};
  spec.switches = {"--json"};
  auto parsed = parse_args(argv, spec);
  auto usage = [](const std::string& message) {
    print_error(message + " (see 'simba doctor --help')");
    return kExitUsage;
  };
  if (!parsed.ok()) return usage(parsed.status().message());
  const Args& args = *parsed;
  if (args.has("--help")) {
    std::fputs(help_for("doctor"), stdout);
    return kExitOk;
  }
  auto timeout = args.duration("--timeout", std::chrono::seconds(10));
  if (!timeout.ok()) return usage(timeout.status().message());
  if (timeout->count() <= 0) return usage("--timeout must be > 0");
  auto store = store_uri(args);
  if (!store.ok()) return usage(store.status().message());
  auto uri = Uri::parse(*store);
  if (!uri.ok()) return usage("--store: " + uri.status().message());
  const std::string shown = uri->to_string();  // password masked

  auto backend = open_backend(*store);
  if (!backend.ok()) {
    print_error(store_error(*store, backend.status()));
    return exit_code_for(backend.status());
  }
  auto report = (*backend)->inspect(std::chrono::steady_clock::now() + *timeout);
  if (!report.ok()) {
    print_error(store_error(*store, report.status()));
    return exit_code_for(report.status());
  }
  const bool unsafe = report->unsafe();
  if (args.has("--json")) {
    std::string out = "{\"store\":" + json_string(shown) +
                      ",\"scheme\":" + json_string(std::string((*backend)->scheme())) +
                      ",\"unsafe\":" + (unsafe ? "true" : "false") + ",\"findings\":[";
    for (std::size_t i = 0; i < report->findings.size(); ++i) {
      const StoreFinding& f = report->findings[i];
      out += (i == 0 ? "{" : ",{");
      out += "\"severity\":" + json_string(severity_name(f.severity)) +
             ",\"topic\":" + json_string(f.topic) + ",\"text\":" + json_string(f.text) + "}";
    }
    out += "]}\n";
    std::fputs(out.c_str(), stdout);
  } else {
    std::size_t topic_width = 5;
    for (const StoreFinding& f : report->findings) {
      topic_width = std::max(topic_width, f.topic.size());
    }
    std::string out = "store " + shown + "\n";
    std::size_t unsafe_count = 0;
    for (const StoreFinding& f : report->findings) {
      if (f.severity == StoreFinding::Severity::kUnsafe) ++unsafe_count;
      out += pad(severity_name(f.severity), 7) + pad(f.topic, topic_width) + "  " + f.text + "\n";
    }
    out += unsafe ? "unsafe: " + std::to_string(unsafe_count) +
                        (unsafe_count == 1 ? " finding puts" : " findings put") +
                        " a lock guarantee at risk (exit 78)\n"
                  : "ok: nothing found that puts a lock guarantee at risk\n";
    std::fputs(out.c_str(), stdout);
  }
  return unsafe ? kExitUnsafeStore : kExitOk;
}

}  // namespace simba::cli
