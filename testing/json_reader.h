// A small JSON reader for tests (`simba status --json`, the CLI's JSON logs,
// the dashboard's API, WebDriver replies): strict RFC 8259 values, strings
// decoded to UTF-8, numbers kept as their literal. Writing JSON is
// src/core/json.h's.
#ifndef SIMBA_TESTING_JSON_READER_H_
#define SIMBA_TESTING_JSON_READER_H_

#include <optional>
#include <string>
#include <vector>

namespace simba::testing {

struct Json {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  std::string number;  // the literal
  std::string string;  // decoded (UTF-8)
  std::vector<Json> array;
  // An object's members, in order: keys[i] names values[i]. (Two vectors,
  // since a pair holding the incomplete Json does not compile on clang 14.)
  std::vector<std::string> keys;
  std::vector<Json> values;

  // The member `key` of an object, or nullptr.
  const Json* get(const std::string& key) const;
  bool is_null() const { return type == Type::kNull; }
  bool is_integer() const;
  long long as_int() const;  // REQUIRES: is_integer()
};

// The document, or nullopt (with `error`) unless `text` is exactly one value.
std::optional<Json> parse_json(const std::string& text, std::string* error);

}  // namespace simba::testing

#endif  // SIMBA_TESTING_JSON_READER_H_
