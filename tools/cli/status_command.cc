// simba status and simba release --force (docs/cli.md).
#include <algorithm>
#include <cstdio>

#include "simba/registry.h"
#include "tools/cli/cli.h"

namespace simba::cli {
namespace {

using std::chrono::milliseconds;

Deadline in(milliseconds d) { return std::chrono::steady_clock::now() + d; }

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

// Opens the store named by --store/$SIMBA_STORE, or prints why not.
Result<std::shared_ptr<Backend>> open_store(const Args& args, const char* command) {
  auto uri = store_uri(args);
  if (!uri.ok()) {
    return Status(uri.status().code(),
                  uri.status().message() + " (see 'simba " + command + " --help')");
  }
  return open_backend(*uri);
}

}  // namespace

int status_command(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.with_value = {"--store"};
  spec.switches = {"--json"};
  spec.positional = true;
  auto parsed = parse_args(argv, spec);
  if (!parsed.ok()) {
    print_error(parsed.status().message() + " (see 'simba status --help')");
    return kExitUsage;
  }
  const Args& args = *parsed;
  if (args.has("--help")) {
    std::fputs(help_for("status"), stdout);
    return kExitOk;
  }
  auto backend = open_store(args, "status");
  if (!backend.ok()) {
    print_error(backend.status().message());
    return exit_code_for(backend.status());
  }
  std::vector<ListedMutex> rows;
  if (args.positional.empty()) {
    auto listed = (*backend)->list(in(std::chrono::seconds(10)));
    if (!listed.ok()) {
      print_error(store_error(store_uri(args).value(), listed.status()));
      return exit_code_for(listed.status());
    }
    rows = std::move(*listed);
  } else {
    for (const auto& name : args.positional) {
      auto record = (*backend)->read(name, in(std::chrono::seconds(10)));
      if (!record.ok()) {
        print_error(store_error(store_uri(args).value(), record.status()));
        return exit_code_for(record.status());
      }
      rows.push_back(ListedMutex{name, *record});
    }
  }
  std::sort(rows.begin(), rows.end(),
            [](const ListedMutex& a, const ListedMutex& b) { return a.mutex < b.mutex; });

  if (args.has("--json")) {
    auto uri = store_uri(args);
    auto parsed_uri = Uri::parse(*uri);
    std::string out = "{\"store\":" + json_string(parsed_uri.ok() ? parsed_uri->to_string() : "") +
                      ",\"transport\":" + json_string((*backend)->capabilities().transport) +
                      ",\"mutexes\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      const MutexOwner& o = r.record.owner;
      const StoreTime now = r.record.store_now;
      const bool held = r.record.held();
      // A store that cannot know a holder's times (ZooKeeper's JVM
      // participants) reports them as 0: shown as null.
      const auto at = [](StoreTime t) {
        return t.count() != 0 ? std::to_string(t.count()) : "null";
      };
      const auto in = [&](StoreTime t) {
        return t.count() != 0 ? std::to_string((t - now).count()) : "null";
      };
      const auto ago = [&](StoreTime t) {
        return t.count() != 0 ? std::to_string((now - t).count()) : "null";
      };
      out += i == 0 ? "" : ",";
      out += "{\"mutex\":" + json_string(r.mutex) + ",\"held\":" + (held ? "true" : "false") +
             ",\"owner\":" + json_string(held ? o.owner_id : "") +
             ",\"fencing_token\":" + std::to_string(o.fencing_token);
      if (held) {
        out += ",\"acquired_ms_ago\":" + ago(o.acquired_at) +
               ",\"ttl_ends_in_ms\":" + in(o.ttl_at) +
               ",\"lease_ends_in_ms\":" + in(o.transition_at) +
               ",\"acquired_at\":" + at(o.acquired_at) + ",\"ttl_at\":" + at(o.ttl_at) +
               ",\"transition_at\":" + at(o.transition_at);
      }
      out += "}";
    }
    out += "]}\n";
    std::fputs(out.c_str(), stdout);
    return kExitOk;
  }

  // A free mutex shows no token: stores report 0 there, which is no token
  // anybody holds (the next owner's is above the last one handed out).
  const auto token_text = [](const ListedMutex& r) {
    return r.record.held() ? std::to_string(r.record.owner.fencing_token) : std::string("-");
  };
  std::size_t name_width = 5, owner_width = 5, token_width = 5;
  for (const auto& r : rows) {
    name_width = std::max(name_width, r.mutex.size());
    owner_width = std::max(owner_width, r.record.owner.owner_id.size());
    token_width = std::max(token_width, token_text(r).size());
  }
  std::string out = pad("MUTEX", name_width) + "  " + pad("OWNER", owner_width) + "  " +
                    pad("TOKEN", token_width) + "  ACQUIRED      TTL ENDS      LEASE ENDS\n";
  for (const auto& r : rows) {
    const MutexOwner& o = r.record.owner;
    const StoreTime now = r.record.store_now;
    const bool held = r.record.held();
    out += pad(r.mutex, name_width) + "  " + pad(held ? o.owner_id : "-", owner_width) + "  " +
           pad(token_text(r), token_width) + "  ";
    const auto in = [&](StoreTime t) {
      return t.count() != 0 ? "in " + human(t - now) : "unknown";
    };
    if (held) {
      out += pad(o.acquired_at.count() != 0 ? human(now - o.acquired_at) + " ago" : "unknown", 12) +
             "  " + pad(in(o.ttl_at), 12) + "  " + in(o.transition_at);
    } else {
      out += "free";
    }
    out += "\n";
  }
  if (rows.empty()) out += "(no mutexes)\n";
  // Last, so the table's header stays the first line for scripts.
  const auto shown = Uri::parse(store_uri(args).value());
  out += "store " + (shown.ok() ? shown->to_string() : std::string("(unparsed)")) + " over " +
         (*backend)->capabilities().transport + "\n";
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

int release_command(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.with_value = {"--store", "--mutex"};
  spec.switches = {"--force"};
  auto parsed = parse_args(argv, spec);
  auto usage = [](const std::string& message) {
    print_error(message + " (see 'simba release --help')");
    return kExitUsage;
  };
  if (!parsed.ok()) return usage(parsed.status().message());
  const Args& args = *parsed;
  if (args.has("--help")) {
    std::fputs(help_for("release"), stdout);
    return kExitOk;
  }
  const auto mutex = args.value("--mutex");
  if (!mutex) return usage("missing --mutex NAME");
  if (!args.has("--force")) {
    return usage("release takes the mutex away from whoever holds it; confirm with --force");
  }
  auto backend = open_store(args, "release");
  if (!backend.ok()) {
    print_error(backend.status().message());
    return exit_code_for(backend.status());
  }
  auto released = (*backend)->force_release(*mutex, in(std::chrono::seconds(10)));
  if (!released.ok()) {
    print_error(store_error(store_uri(args).value(), released.status()));
    return exit_code_for(released.status());
  }
  const MutexOwner& previous = released->previous;
  std::printf(
      "released mutex '%s' (%s); fencing floor is now %llu: later owners get greater "
      "tokens\n",
      mutex->c_str(),
      previous.has_owner_id() ? ("was held by " + previous.owner_id + " with token " +
                                 std::to_string(previous.fencing_token))
                                    .c_str()
                              : "it was free",
      static_cast<unsigned long long>(released->fencing_floor));
  return kExitOk;
}

int schema_command(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.with_value = {"--store"};
  auto parsed = parse_args(argv, spec);
  if (!parsed.ok()) {
    print_error(parsed.status().message() + " (see 'simba schema --help')");
    return kExitUsage;
  }
  if (parsed->has("--help")) {
    std::fputs(help_for("schema"), stdout);
    return kExitOk;
  }
  auto uri = store_uri(*parsed);
  if (!uri.ok()) {
    print_error(uri.status().message() + " (see 'simba schema --help')");
    return kExitUsage;
  }
  auto ddl = schema_sql(*uri);
  if (!ddl.ok()) {
    print_error(ddl.status().message());
    return kExitUsage;
  }
  std::fputs(ddl->c_str(), stdout);
  return kExitOk;
}

}  // namespace simba::cli
