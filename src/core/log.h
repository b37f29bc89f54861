// Internal logging: a line to stderr per event, filtered by the SIMBA_LOG
// environment variable (error, warn (default), info, debug). Issue #10 will
// replace this with a user-supplied event hook; until then, keep log lines
// few and free of secrets (never a password or a full URI; use Uri::to_string).
#ifndef SIMBA_CORE_LOG_H_
#define SIMBA_CORE_LOG_H_

#include <sstream>
#include <string>

namespace simba::internal {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

bool log_enabled(LogLevel level);
void log_line(LogLevel level, const std::string& line);

}  // namespace simba::internal

#define SIMBA_LOG(level, expr)                                                                  \
  do {                                                                                          \
    if (::simba::internal::log_enabled(::simba::internal::LogLevel::level)) {                   \
      std::ostringstream simba_log_stream_;                                                     \
      simba_log_stream_ << expr;                                                                \
      ::simba::internal::log_line(::simba::internal::LogLevel::level, simba_log_stream_.str()); \
    }                                                                                           \
  } while (false)

#endif  // SIMBA_CORE_LOG_H_
