// How `simba` writes to stderr: "simba: ..." lines, or one JSON object per
// line with --log-format json, and the lock events of --verbose
// (docs/cli.md, "Logging").
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <set>
#include <string>

#include "simba/events.h"
#include "tools/cli/cli.h"

namespace simba::cli {
namespace {

std::atomic<LogFormat> g_format{LogFormat::kText};

// "2026-11-21T21:40:13.123Z": the same form as LockEventJson's "time".
std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch());
  const std::time_t seconds = static_cast<std::time_t>(ms.count() / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms.count() % 1000));
  return buf;
}

void print_line(const char* level, const std::string& message) {
  // One fprintf per line keeps lines from different threads whole.
  if (g_format.load() == LogFormat::kJson) {
    std::fprintf(stderr, "{\"event\":\"%s\",\"time\":\"%s\",\"message\":%s}\n", level,
                 utc_now().c_str(), json_string(message).c_str());
  } else {
    std::fprintf(stderr, "simba: %s\n", message.c_str());
  }
}

// Prints the events of a factory's services. Store errors always ("store
// unreachable for mutex 'm', retrying in 400ms (...)"), each new cause once
// while the store stays down (every one with --verbose): with a listener the
// library's own warning for them is quiet. Text: the rest with --verbose
// only (the library's own warnings say what went wrong). JSON: losses
// always, as they replace those warnings; acquisitions, renewals and
// releases with --verbose.
class EventPrinter final : public LockEventListener {
 public:
  EventPrinter(LogFormat format, bool verbose) : format_(format), verbose_(verbose) {}

  void on_event(const LockEvent& event) override {
    const bool loss = event.kind == LockEvent::Kind::kLost;
    if (event.kind == LockEvent::Kind::kStoreError) {
      // A store that stays down fails every retry, mostly for the same
      // reason: each cause is printed once until a call succeeds again.
      std::lock_guard<std::mutex> lock(mu_);
      if (!causes_.insert(cause_key(event.error.to_string())).second && !verbose_) return;
      if (causes_.size() > kMaxCauses) causes_.clear();
    } else {
      if (event.kind == LockEvent::Kind::kAcquired || event.kind == LockEvent::Kind::kRenewed) {
        std::lock_guard<std::mutex> lock(mu_);
        causes_.clear();
      }
      if (!verbose_ && !(loss && format_ == LogFormat::kJson)) return;
    }
    if (format_ == LogFormat::kJson) {
      std::fprintf(stderr, "%s\n", lock_event_json(event).c_str());
    } else {
      std::fprintf(stderr, "simba: %s\n", lock_event_text(event).c_str());
    }
  }

 private:
  // Distinct causes remembered at most (then forgotten, and printed again).
  static constexpr std::size_t kMaxCauses = 64;
  const LogFormat format_;
  const bool verbose_;
  std::mutex mu_;
  std::set<std::string> causes_;  // printed since the last success
};

}  // namespace

Result<LogFormat> parse_log_format(const Args& args) {
  const auto text = args.value("--log-format");
  if (!text || *text == "text") return LogFormat::kText;
  if (*text == "json") return LogFormat::kJson;
  return invalid_argument_error("--log-format must be text or json (got '" + *text + "')");
}

void set_log_format(LogFormat format) {
  g_format = format;
  if (format == LogFormat::kJson) {
    // The library's own warnings are plain text lines; in JSON mode the
    // events carry the same news, so keep stderr parseable unless the user
    // asked for those lines by setting SIMBA_LOG.
    setenv("SIMBA_LOG", "error", /*overwrite=*/0);
  }
}

std::string cause_key(std::string_view message) {
  // "... (next reconnect in 175ms)": a reconnect backoff's countdown,
  // different at every retry of one cause.
  constexpr std::string_view kCountdown = " (next reconnect in ";
  std::string key;
  for (std::size_t at = 0; at < message.size();) {
    const std::size_t found = message.find(kCountdown, at);
    if (found == std::string_view::npos) {
      key.append(message.substr(at));
      break;
    }
    key.append(message.substr(at, found - at));
    const std::size_t close = message.find(')', found);
    at = close == std::string_view::npos ? message.size() : close + 1;
  }
  return key;
}

std::shared_ptr<LockEventListener> make_event_printer(LogFormat format, bool verbose) {
  return std::make_shared<EventPrinter>(format, verbose);
}

void print_error(const std::string& message) { print_line("error", message); }

void print_info(const std::string& message) { print_line("info", message); }

}  // namespace simba::cli
