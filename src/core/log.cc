#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace simba::internal {
namespace {

LogLevel configured_level() {
  const char* env = std::getenv("SIMBA_LOG");
  if (env == nullptr) return LogLevel::kWarn;
  if (std::strcmp(env, "error") == 0) return LogLevel::kError;
  if (std::strcmp(env, "info") == 0) return LogLevel::kInfo;
  if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
  return LogLevel::kWarn;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "E";
    case LogLevel::kWarn:
      return "W";
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kDebug:
      return "D";
  }
  return "?";
}

}  // namespace

bool log_enabled(LogLevel level) {
  static const LogLevel kConfigured = configured_level();
  return static_cast<int>(level) <= static_cast<int>(kConfigured);
}

void log_line(LogLevel level, const std::string& line) {
  // One fprintf per line keeps lines from different threads whole.
  std::fprintf(stderr, "simba[%s] %s\n", level_name(level), line.c_str());
}

}  // namespace simba::internal
