// Quoted strings and fixed-point numbers for everything in the project that
// writes text by hand: JSON (lock events, the CLI, the benchmarks, the
// tests' WebDriver client), Prometheus labels, log lines. One escaper
// instead of one per format. Standard library only, so the CLI, the
// benchmarks and the tests may include it as "src/core/json.h".
#ifndef SIMBA_CORE_JSON_H_
#define SIMBA_CORE_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace simba::internal {

// How AppendQuoted writes a string: between `quote`s, with a backslash
// before the quote and before a backslash; the control characters in
// `short_forms` as \b \f \n \r \t; other control characters (and DEL) as
// `control`, a printf format for the byte, or as they are when it is null.
struct Quoting {
  char quote;
  std::string_view short_forms;
  const char* control;
};
// A JSON string literal. Bytes >= 0x80 pass through, so UTF-8 text stays
// readable.
inline constexpr Quoting kJsonQuoting{'"', "\b\f\n\r\t", "\\u%04x"};
// A Prometheus label value: only backslash, double quote and line feed.
inline constexpr Quoting kLabelQuoting{'"', "\n", nullptr};
// A name in a log line: an odd name cannot break or fake the line.
inline constexpr Quoting kLogQuoting{'\'', "", "\\x%02x"};

void append_quoted(std::string& out, std::string_view s, const Quoting& quoting);

// Appends `s` as a JSON string literal, quotes included.
inline void append_json_string(std::string& out, std::string_view s) {
  append_quoted(out, s, kJsonQuoting);
}
// The same, returned.
std::string json_string(std::string_view s);

// `value` / 10^decimals in decimals, trailing zeros dropped:
// (12345, 3) -> "12.345", (12300, 3) -> "12.3", (12000, 3) -> "12".
std::string fixed_point(std::int64_t value, int decimals);

}  // namespace simba::internal

#endif  // SIMBA_CORE_JSON_H_
