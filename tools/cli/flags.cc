#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "simba/uri.h"
#include "src/core/worker.h"
#include "tools/cli/cli.h"

namespace simba::cli {

std::optional<std::string> Args::value(const std::string& flag) const {
  auto it = values.find(flag);
  if (it == values.end()) return std::nullopt;
  return it->second;
}

Result<std::chrono::milliseconds> Args::duration(const std::string& flag,
                                                 std::chrono::milliseconds fallback) const {
  auto text = value(flag);
  if (!text) return fallback;
  return parse_duration(flag, *text);
}

Result<Args> parse_args(const std::vector<std::string>& argv, const FlagSpec& spec) {
  auto contains = [](const std::vector<std::string>& list, const std::string& s) {
    return std::find(list.begin(), list.end(), s) != list.end();
  };
  Args args;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--") {
      if (!spec.command) return invalid_argument_error("this command takes no '-- CMD'");
      args.has_command = true;
      args.command.assign(argv.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv.end());
      break;
    }
    if (arg.rfind("--", 0) == 0 || arg == "-h") {
      const std::string flag = arg == "-h" ? "--help" : arg.substr(0, arg.find('='));
      const bool inline_value = arg.find('=') != std::string::npos;
      if (contains(spec.with_value, flag)) {
        std::string value;
        if (inline_value) {
          value = arg.substr(arg.find('=') + 1);
        } else if (i + 1 < argv.size()) {
          value = argv[++i];
        } else {
          return invalid_argument_error(flag + " needs a value");
        }
        if (args.values.count(flag) > 0) return invalid_argument_error(flag + " given twice");
        args.values[flag] = value;
      } else if (contains(spec.switches, flag) || flag == "--help") {
        if (inline_value) return invalid_argument_error(flag + " takes no value");
        args.switches[flag] = true;
      } else {
        return invalid_argument_error("unknown flag " + flag);
      }
      continue;
    }
    if (!spec.positional) {
      return invalid_argument_error("unexpected argument '" + arg + "'" +
                                    (spec.command ? " (put the command after '--')" : ""));
    }
    args.positional.push_back(arg);
  }
  return args;
}

Result<LeaseJob> parse_lease_job(const Args& args) {
  LeaseJob job;
  SIMBA_ASSIGN_OR_RETURN(job.store, store_uri(args));
  const auto mutex = args.value("--mutex");
  if (!mutex) return invalid_argument_error("missing --mutex NAME");
  job.mutex = *mutex;
  if (!args.has_command || args.command.empty()) {
    return invalid_argument_error("missing '-- CMD [ARGS...]'");
  }
  job.command = args.command;
  job.verbose = args.has("--verbose");
  SIMBA_ASSIGN_OR_RETURN(job.log_format, parse_log_format(args));
  SIMBA_ASSIGN_OR_RETURN(job.contend.ttl, args.duration("--ttl", job.contend.ttl));
  SIMBA_ASSIGN_OR_RETURN(job.contend.transition,
                         args.duration("--transition", job.contend.transition));
  SIMBA_ASSIGN_OR_RETURN(job.kill_after, args.duration("--kill-after", job.kill_after));
  // The library's message names the option ("ttl must be > 0"); name the flag.
  if (Status s = job.contend.validate(); !s.ok()) return invalid_argument_error("--" + s.message());
  return job;
}

std::string store_error(const std::string& store, const Status& status) {
  auto parsed = Uri::parse(store);
  if (!parsed.ok()) return status.message();
  return "store " + parsed->to_string() + ": " + status.message();
}

Result<std::unique_ptr<MutexContendServiceFactory>> open_factory(const LeaseJob& job) {
  FactoryOptions options;
  options.contend = job.contend;
  options.events = make_event_printer(job.log_format, job.verbose);
  // Network stores connect lazily: a store that cannot be reached yet (down,
  // failing over) is waited for by the first acquisition, within its
  // deadline; one that refuses us fails it at once (docs/cli.md).
  return MutexContendServiceFactory::open(job.store, options);
}

Status wait_for_store(const LeaseJob& job, Backend& backend, std::stop_token cancel) {
  internal::Backoff backoff(std::chrono::milliseconds(100), std::chrono::milliseconds(2000));
  std::string last_cause;
  for (;;) {
    auto read =
        backend.read(job.mutex, std::chrono::steady_clock::now() + job.contend.operation_timeout);
    if (read.ok()) return ok_status();
    if (!is_retryable(read.status())) {
      return Status(read.status().code(), store_error(job.store, read.status()));
    }
    const std::chrono::milliseconds delay = backoff.failed(read.status());
    if (cause_key(read.status().message()) != last_cause) {
      last_cause = cause_key(read.status().message());
      print_error(store_error(job.store, read.status()) + " (store unreachable, retrying)");
    }
    const auto until = std::chrono::steady_clock::now() + delay;
    while (std::chrono::steady_clock::now() < until) {
      if (cancel.stop_requested()) return cancelled_error("cancelled while waiting for the store");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

int exit_code_for(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnimplemented:
      return kExitUsage;
    default:
      return kExitUnavailable;
  }
}

Result<std::string> store_uri(const Args& args) {
  if (auto store = args.value("--store")) return *store;
  if (const char* env = std::getenv("SIMBA_STORE"); env != nullptr && *env != '\0') {
    return std::string(env);
  }
  return invalid_argument_error("missing --store URI (or the SIMBA_STORE environment variable)");
}

std::string human(std::chrono::milliseconds d) {
  const bool negative = d.count() < 0;
  const long long ms = negative ? -d.count() : d.count();
  char buf[64];
  if (ms < 1000) {
    std::snprintf(buf, sizeof buf, "%lldms", ms);
  } else if (ms < 60'000) {
    std::snprintf(buf, sizeof buf, "%.1fs", static_cast<double>(ms) / 1000.0);
  } else if (ms < 3'600'000) {
    std::snprintf(buf, sizeof buf, "%lldm%llds", ms / 60'000, (ms % 60'000) / 1000);
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%lldm", ms / 3'600'000, (ms % 3'600'000) / 60'000);
  }
  return (negative ? "-" : "") + std::string(buf);
}

}  // namespace simba::cli
