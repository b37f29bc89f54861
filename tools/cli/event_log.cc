// How `simba` writes to stderr: "simba: ..." lines, or one JSON object per
// line with --log-format json, and the lock events of --verbose
// (docs/cli.md, "Logging").
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

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

// Prints the events of a factory's services. Text: with --verbose only
// (without it the library's own warnings say what went wrong, as before).
// JSON: losses and store errors always, as they replace those warnings;
// acquisitions, renewals and releases with --verbose.
class EventPrinter final : public LockEventListener {
 public:
  EventPrinter(LogFormat format, bool verbose) : format_(format), verbose_(verbose) {}

  void on_event(const LockEvent& event) override {
    const bool problem =
        event.kind == LockEvent::Kind::kLost || event.kind == LockEvent::Kind::kStoreError;
    if (!verbose_ && !(problem && format_ == LogFormat::kJson)) return;
    if (event.kind == LockEvent::Kind::kStoreError && !verbose_) {
      // A store that stays down fails every retry: the first failure and
      // every tenth in a row are enough.
      std::lock_guard<std::mutex> lock(mu_);
      if (++failures_in_a_row_ != 1 && failures_in_a_row_ % 10 != 0) return;
    } else if (event.kind == LockEvent::Kind::kAcquired ||
               event.kind == LockEvent::Kind::kRenewed) {
      std::lock_guard<std::mutex> lock(mu_);
      failures_in_a_row_ = 0;
    }
    if (format_ == LogFormat::kJson) {
      std::fprintf(stderr, "%s\n", lock_event_json(event).c_str());
    } else {
      std::fprintf(stderr, "simba: %s\n", lock_event_text(event).c_str());
    }
  }

 private:
  const LogFormat format_;
  const bool verbose_;
  std::mutex mu_;
  int failures_in_a_row_ = 0;
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

std::shared_ptr<LockEventListener> make_event_printer(LogFormat format, bool verbose) {
  return std::make_shared<EventPrinter>(format, verbose);
}

void print_error(const std::string& message) { print_line("error", message); }

void print_info(const std::string& message) { print_line("info", message); }

}  // namespace simba::cli
