// JSON string literals, for everything in the project that writes JSON by
// hand (lock events, the CLI, the benchmarks, the tests' WebDriver client):
// one escaper instead of one per file. Standard library only, so the CLI,
// the benchmarks and the tests may include it as "src/core/json.h".
#ifndef SIMBA_CORE_JSON_H_
#define SIMBA_CORE_JSON_H_

#include <string>
#include <string_view>

namespace simba::internal {

// Appends `s` as a JSON string literal, quotes included. Control characters
// become \u00XX (or their short forms); bytes >= 0x80 pass through, so
// UTF-8 text stays readable.
void AppendJsonString(std::string& out, std::string_view s);
// The same, returned.
std::string JsonString(std::string_view s);

}  // namespace simba::internal

#endif  // SIMBA_CORE_JSON_H_
