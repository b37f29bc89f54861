#include "core/json.h"

#include <cstdio>

namespace simba::internal {

void append_quoted(std::string& out, std::string_view s, const Quoting& quoting) {
  out += quoting.quote;
  for (const char c : s) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == quoting.quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte != 0 && quoting.short_forms.find(c) != std::string_view::npos) {
      out += '\\';
      out += "btnvfr"[byte - '\b'];  // \b \t \n \v \f \r are 8 to 13
    } else if (quoting.control != nullptr && (byte < 0x20 || byte == 0x7f)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, quoting.control, byte);
      out += buf;
    } else {
      out += c;
    }
  }
  out += quoting.quote;
}

std::string json_string(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  append_json_string(out, s);
  return out;
}

std::string fixed_point(std::int64_t value, int decimals) {
  std::string out;
  // Work on the magnitude as unsigned so INT64_MIN cannot overflow.
  std::uint64_t magnitude = static_cast<std::uint64_t>(value);
  if (value < 0) {
    out += '-';
    magnitude = ~magnitude + 1;
  }
  std::uint64_t scale = 1;
  for (int i = 0; i < decimals; ++i) scale *= 10;
  out += std::to_string(magnitude / scale);
  std::string digits = std::to_string(magnitude % scale + scale).substr(1);
  while (!digits.empty() && digits.back() == '0') digits.pop_back();
  if (!digits.empty()) out += '.' + digits;
  return out;
}

}  // namespace simba::internal
