// Shared pieces of the `simba` command line: exit codes, the parsed command
// line, and the commands. docs/cli.md is the user-facing contract.
#ifndef SIMBA_TOOLS_CLI_CLI_H_
#define SIMBA_TOOLS_CLI_CLI_H_

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "simba/contend_service.h"
#include "simba/status.h"
#include "src/core/json.h"

namespace simba::cli {

// Exit codes (docs/cli.md). 64, 69 and 75 follow sysexits.h.
inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 64;
inline constexpr int kExitUnavailable = 69;
inline constexpr int kExitNotAcquired = 75;
inline constexpr int kExitLeaseLost = 76;
// `doctor` found something that puts a guarantee at risk (EX_CONFIG).
inline constexpr int kExitUnsafeStore = 78;
inline constexpr int kExitCannotExecute = 126;
inline constexpr int kExitNotFound = 127;

// A command line after the command name, split into flags, positional
// arguments and the child command (everything after "--").
struct Args {
  std::map<std::string, std::string> values;  // --flag value / --flag=value
  std::map<std::string, bool> switches;       // --flag
  std::vector<std::string> positional;
  std::vector<std::string> command;
  bool has_command = false;  // "--" was given

  bool has(const std::string& flag) const {
    return values.count(flag) > 0 || switches.count(flag) > 0;
  }
  std::optional<std::string> value(const std::string& flag) const;
  // The duration value of `flag`, or `fallback` when absent. Errors name the
  // flag.
  Result<std::chrono::milliseconds> duration(const std::string& flag,
                                             std::chrono::milliseconds fallback) const;
};

struct FlagSpec {
  std::vector<std::string> with_value;  // e.g. "--store"
  std::vector<std::string> switches;    // e.g. "--json"
  bool positional = false;              // accepts positional arguments
  bool command = false;                 // accepts "-- CMD ..."
};

// Parses `argv` (after the command name) against `spec`. kInvalidArgument
// names the unknown flag or the flag missing its value.
Result<Args> parse_args(const std::vector<std::string>& argv, const FlagSpec& spec);

// How simba writes to stderr (--log-format).
enum class LogFormat { kText, kJson };

// What `run` and `elect` share: a store, a mutex, lease settings and a
// command to run while holding it.
struct LeaseJob {
  std::string store;
  std::string mutex;
  ContendOptions contend;
  std::chrono::milliseconds kill_after{10000};
  bool verbose = false;
  LogFormat log_format = LogFormat::kText;
  std::vector<std::string> command;
};

// Reads --store/$SIMBA_STORE, --mutex, --ttl, --transition, --kill-after,
// --verbose, --log-format and "-- CMD". kInvalidArgument names the flag at fault.
Result<LeaseJob> parse_lease_job(const Args& args);
// The factory for `job`'s store with its lease settings and an event printer
// (make_event_printer). It does not wait for the store: the first
// acquisition does (errors name the store).
Result<std::unique_ptr<MutexContendServiceFactory>> open_factory(const LeaseJob& job);
// Reads `job`'s mutex until the store answers: a store that cannot be
// reached yet (down, failing over) is asked again with a backoff, each new
// cause printed once; one that refuses the call (credentials, TLS
// verification) is the error at once. kCancelled once `cancel` is stopped.
Status wait_for_store(const LeaseJob& job, Backend& backend, std::stop_token cancel);
// `status`'s message prefixed with the store URI, password masked: a network
// store's own messages name only its host and port.
std::string store_error(const std::string& store, const Status& status);

// --log-format: text (the default) or json.
Result<LogFormat> parse_log_format(const Args& args);
// From now on PrintError/PrintInfo write in `format` (JSON: one object per
// line, {"event":"error"|"info","time":...,"message":...}).
void set_log_format(LogFormat format);
// Prints lock events to stderr: with `verbose` all of them, otherwise (JSON
// only) losses and store errors (event_log.cc says why).
std::shared_ptr<LockEventListener> make_event_printer(LogFormat format, bool verbose);
// `message` without what changes between retries of one cause (a reconnect
// countdown): what "print each new cause once" compares.
std::string cause_key(std::string_view message);
// Prints "simba: <message>" to stderr (or its JSON form).
void print_error(const std::string& message);
// The same for what --verbose reports.
void print_info(const std::string& message);
// The exit code for a status from opening or using a store.
int exit_code_for(const Status& status);
// The store URI: --store, else $SIMBA_STORE. kInvalidArgument when neither.
Result<std::string> store_uri(const Args& args);
// `s` as a JSON string literal, quotes included.
using internal::json_string;
// "1.5s", "250ms", "2m3s"-like text for humans.
std::string human(std::chrono::milliseconds d);

int run_command(const std::vector<std::string>& argv);
int elect_command(const std::vector<std::string>& argv);
int status_command(const std::vector<std::string>& argv);
int release_command(const std::vector<std::string>& argv);
int schema_command(const std::vector<std::string>& argv);
int dashboard_command(const std::vector<std::string>& argv);
int doctor_command(const std::vector<std::string>& argv);

// Help texts, one per command (nullptr for an unknown command).
const char* help_for(const std::string& command);

}  // namespace simba::cli

#endif  // SIMBA_TOOLS_CLI_CLI_H_
