#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace simba::internal {
namespace {

LogLevel ConfiguredLevel() {
  const char* env = std::getenv("SIMBA_LOG");
  if (env == nullptr) return LogLevel::kWarn;
  if (std::strcmp(env, "error") == 0) return LogLevel::kError;
  if (std::strcmp(env, "info") == 0) return LogLevel::kInfo;
  if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
  return LogLevel::kWarn;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "E";
    case LogLevel::kWarn: return "W";
    case LogLevel::kInfo: return "I";
    case LogLevel::kDebug: return "D";
  }
  return "?";
}

}  // namespace

bool LogEnabled(LogLevel level) {
  static const LogLevel kConfigured = ConfiguredLevel();
  return static_cast<int>(level) <= static_cast<int>(kConfigured);
}

void LogLine(LogLevel level, const std::string& line) {
  // One fprintf per line keeps lines from different threads whole.
  std::fprintf(stderr, "simba[%s] %s\n", LevelName(level), line.c_str());
}

}  // namespace simba::internal
