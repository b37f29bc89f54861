// simba status and simba release --force (docs/cli.md).
#include <algorithm>
#include <cstdio>

#include "simba/registry.h"
#include "tools/cli/cli.h"

namespace simba::cli {
namespace {

using std::chrono::milliseconds;

Deadline In(milliseconds d) { return std::chrono::steady_clock::now() + d; }

std::string Pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

// Opens the store named by --store/$SIMBA_STORE, or prints why not.
Result<std::shared_ptr<Backend>> OpenStore(const Args& args, const char* command) {
  auto uri = StoreUri(args);
  if (!uri.ok()) {
    return Status(uri.status().code(),
                  uri.status().message() + " (see 'simba " + command + " --help')");
  }
  return OpenBackend(*uri);
}

}  // namespace

int StatusCommand(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.with_value = {"--store"};
  spec.switches = {"--json"};
  spec.positional = true;
  auto parsed = ParseArgs(argv, spec);
  if (!parsed.ok()) {
    PrintError(parsed.status().message() + " (see 'simba status --help')");
    return kExitUsage;
  }
  const Args& args = *parsed;
  if (args.Has("--help")) {
    std::fputs(HelpFor("status"), stdout);
    return kExitOk;
  }
  auto backend = OpenStore(args, "status");
  if (!backend.ok()) {
    PrintError(backend.status().message());
    return ExitCodeFor(backend.status());
  }
  std::vector<ListedMutex> rows;
  if (args.positional.empty()) {
    auto listed = (*backend)->list(In(std::chrono::seconds(10)));
    if (!listed.ok()) {
      PrintError(StoreError(StoreUri(args).value(), listed.status()));
      return ExitCodeFor(listed.status());
    }
    rows = std::move(*listed);
  } else {
    for (const auto& name : args.positional) {
      auto record = (*backend)->read(name, In(std::chrono::seconds(10)));
      if (!record.ok()) {
        PrintError(StoreError(StoreUri(args).value(), record.status()));
        return ExitCodeFor(record.status());
      }
      rows.push_back(ListedMutex{name, *record});
    }
  }
  std::sort(rows.begin(), rows.end(),
            [](const ListedMutex& a, const ListedMutex& b) { return a.mutex < b.mutex; });

  if (args.Has("--json")) {
    auto uri = StoreUri(args);
    auto parsed_uri = Uri::Parse(*uri);
    std::string out = "{\"store\":" + JsonString(parsed_uri.ok() ? parsed_uri->ToString() : "") +
                      ",\"mutexes\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      const MutexOwner& o = r.record.owner;
      const StoreTime now = r.record.store_now;
      const bool held = r.record.held();
      // A store that cannot know a holder's times (ZooKeeper's JVM
      // participants) reports them as 0: shown as null.
      const auto at = [](StoreTime t) { return t.count() != 0 ? std::to_string(t.count()) : "null"; };
      const auto in = [&](StoreTime t) {
        return t.count() != 0 ? std::to_string((t - now).count()) : "null";
      };
      const auto ago = [&](StoreTime t) {
        return t.count() != 0 ? std::to_string((now - t).count()) : "null";
      };
      out += i == 0 ? "" : ",";
      out += "{\"mutex\":" + JsonString(r.mutex) + ",\"held\":" + (held ? "true" : "false") +
             ",\"owner\":" + JsonString(held ? o.owner_id : "") +
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
  std::string out = Pad("MUTEX", name_width) + "  " + Pad("OWNER", owner_width) + "  " +
                    Pad("TOKEN", token_width) + "  ACQUIRED      TTL ENDS      LEASE ENDS\n";
  for (const auto& r : rows) {
    const MutexOwner& o = r.record.owner;
    const StoreTime now = r.record.store_now;
    const bool held = r.record.held();
    out += Pad(r.mutex, name_width) + "  " + Pad(held ? o.owner_id : "-", owner_width) + "  " +
           Pad(token_text(r), token_width) + "  ";
    const auto in = [&](StoreTime t) { return t.count() != 0 ? "in " + Human(t - now) : "unknown"; };
    if (held) {
      out += Pad(o.acquired_at.count() != 0 ? Human(now - o.acquired_at) + " ago" : "unknown",
                 12) +
             "  " + Pad(in(o.ttl_at), 12) + "  " + in(o.transition_at);
    } else {
      out += "free";
    }
    out += "\n";
  }
  if (rows.empty()) out += "(no mutexes)\n";
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

int ReleaseCommand(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.with_value = {"--store", "--mutex"};
  spec.switches = {"--force"};
  auto parsed = ParseArgs(argv, spec);
  auto usage = [](const std::string& message) {
    PrintError(message + " (see 'simba release --help')");
    return kExitUsage;
  };
  if (!parsed.ok()) return usage(parsed.status().message());
  const Args& args = *parsed;
  if (args.Has("--help")) {
    std::fputs(HelpFor("release"), stdout);
    return kExitOk;
  }
  const auto mutex = args.Value("--mutex");
  if (!mutex) return usage("missing --mutex NAME");
  if (!args.Has("--force")) {
    return usage("release takes the mutex away from whoever holds it; confirm with --force");
  }
  auto backend = OpenStore(args, "release");
  if (!backend.ok()) {
    PrintError(backend.status().message());
    return ExitCodeFor(backend.status());
  }
  auto released = (*backend)->force_release(*mutex, In(std::chrono::seconds(10)));
  if (!released.ok()) {
    PrintError(StoreError(StoreUri(args).value(), released.status()));
    return ExitCodeFor(released.status());
  }
  const MutexOwner& previous = released->previous;
  std::printf("released mutex '%s' (%s); fencing floor is now %llu: later owners get greater "
              "tokens\n",
              mutex->c_str(),
              previous.has_owner_id()
                  ? ("was held by " + previous.owner_id + " with token " +
                     std::to_string(previous.fencing_token))
                        .c_str()
                  : "it was free",
              static_cast<unsigned long long>(released->fencing_floor));
  return kExitOk;
}

int SchemaCommand(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.with_value = {"--store"};
  auto parsed = ParseArgs(argv, spec);
  if (!parsed.ok()) {
    PrintError(parsed.status().message() + " (see 'simba schema --help')");
    return kExitUsage;
  }
  if (parsed->Has("--help")) {
    std::fputs(HelpFor("schema"), stdout);
    return kExitOk;
  }
  auto uri = StoreUri(*parsed);
  if (!uri.ok()) {
    PrintError(uri.status().message() + " (see 'simba schema --help')");
    return kExitUsage;
  }
  auto ddl = SchemaSql(*uri);
  if (!ddl.ok()) {
    PrintError(ddl.status().message());
    return kExitUsage;
  }
  std::fputs(ddl->c_str(), stdout);
  return kExitOk;
}

}  // namespace simba::cli
