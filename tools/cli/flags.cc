#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "simba/uri.h"
#include "tools/cli/cli.h"

namespace simba::cli {

std::optional<std::string> Args::Value(const std::string& flag) const {
  auto it = values.find(flag);
  if (it == values.end()) return std::nullopt;
  return it->second;
}

Result<std::chrono::milliseconds> Args::Duration(const std::string& flag,
                                                 std::chrono::milliseconds fallback) const {
  auto text = Value(flag);
  if (!text) return fallback;
  return ParseDuration(flag, *text);
}

Result<Args> ParseArgs(const std::vector<std::string>& argv, const FlagSpec& spec) {
  auto contains = [](const std::vector<std::string>& list, const std::string& s) {
    return std::find(list.begin(), list.end(), s) != list.end();
  };
  Args args;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--") {
      if (!spec.command) return InvalidArgumentError("this command takes no '-- CMD'");
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
          return InvalidArgumentError(flag + " needs a value");
        }
        if (args.values.count(flag) > 0) return InvalidArgumentError(flag + " given twice");
        args.values[flag] = value;
      } else if (contains(spec.switches, flag) || flag == "--help") {
        if (inline_value) return InvalidArgumentError(flag + " takes no value");
        args.switches[flag] = true;
      } else {
        return InvalidArgumentError("unknown flag " + flag);
      }
      continue;
    }
    if (!spec.positional) {
      return InvalidArgumentError("unexpected argument '" + arg + "'" +
                                  (spec.command ? " (put the command after '--')" : ""));
    }
    args.positional.push_back(arg);
  }
  return args;
}

Result<LeaseJob> ParseLeaseJob(const Args& args) {
  LeaseJob job;
  SIMBA_ASSIGN_OR_RETURN(job.store, StoreUri(args));
  const auto mutex = args.Value("--mutex");
  if (!mutex) return InvalidArgumentError("missing --mutex NAME");
  job.mutex = *mutex;
  if (!args.has_command || args.command.empty()) {
    return InvalidArgumentError("missing '-- CMD [ARGS...]'");
  }
  job.command = args.command;
  job.verbose = args.Has("--verbose");
  SIMBA_ASSIGN_OR_RETURN(job.log_format, ParseLogFormat(args));
  SIMBA_ASSIGN_OR_RETURN(job.contend.ttl, args.Duration("--ttl", job.contend.ttl));
  SIMBA_ASSIGN_OR_RETURN(job.contend.transition,
                         args.Duration("--transition", job.contend.transition));
  SIMBA_ASSIGN_OR_RETURN(job.kill_after, args.Duration("--kill-after", job.kill_after));
  // The library's message names the option ("ttl must be > 0"); name the flag.
  if (Status s = job.contend.Validate(); !s.ok()) return InvalidArgumentError("--" + s.message());
  return job;
}

std::string StoreError(const std::string& store, const Status& status) {
  auto parsed = Uri::Parse(store);
  if (!parsed.ok()) return status.message();
  return "store " + parsed->ToString() + ": " + status.message();
}

Result<std::unique_ptr<MutexContendServiceFactory>> OpenFactory(const LeaseJob& job) {
  FactoryOptions options;
  options.contend = job.contend;
  options.events = MakeEventPrinter(job.log_format, job.verbose);
  auto factory = MutexContendServiceFactory::open(job.store, options);
  if (!factory.ok()) return factory;
  // Network stores connect lazily and the services retry for ever; a store
  // that cannot be reached at all when simba starts is far more likely a
  // wrong URI, password or port than an outage, so say so now (exit 69).
  Backend& backend = *(*factory)->backend();
  if (backend.validate_mutex(job.mutex).ok()) {
    auto probe =
        backend.read(job.mutex, std::chrono::steady_clock::now() + job.contend.operation_timeout);
    if (!probe.ok()) return Status(probe.status().code(), StoreError(job.store, probe.status()));
  }
  return factory;
}

int ExitCodeFor(const Status& status) {
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

Result<std::string> StoreUri(const Args& args) {
  if (auto store = args.Value("--store")) return *store;
  if (const char* env = std::getenv("SIMBA_STORE"); env != nullptr && *env != '\0') {
    return std::string(env);
  }
  return InvalidArgumentError("missing --store URI (or the SIMBA_STORE environment variable)");
}

std::string Human(std::chrono::milliseconds d) {
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
