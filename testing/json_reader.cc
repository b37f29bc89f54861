#include "testing/json_reader.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace simba::testing {

const Json* Json::get(const std::string& key) const {
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] == key) return &values[i];
  }
  return nullptr;
}

bool Json::is_integer() const {
  if (type != Type::kNumber || number.empty()) return false;
  const std::size_t start = number[0] == '-' ? 1 : 0;
  return start < number.size() && number.size() - start < 19 &&
         std::all_of(number.begin() + static_cast<std::ptrdiff_t>(start), number.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
}

long long Json::as_int() const { return std::stoll(number); }

namespace {

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  std::optional<Json> document(std::string* error) {
    Json v;
    if (!value(&v, 0) || (ws(), i_ != s_.size())) {
      *error = "invalid JSON at offset " + std::to_string(i_) + ": " + s_.substr(0, 300);
      return std::nullopt;
    }
    return v;
  }

 private:
  void ws() {
    while (i_ < s_.size() && std::strchr(" \t\r\n", s_[i_]) != nullptr) ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool word(const char* w) {
    const std::size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  static void utf8(unsigned cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  bool hex4(unsigned* cp) {
    if (i_ + 4 > s_.size()) return false;
    *cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      if (std::isxdigit(static_cast<unsigned char>(c)) == 0) return false;
      *cp = *cp * 16 + static_cast<unsigned>(std::isdigit(static_cast<unsigned char>(c)) != 0
                                                 ? c - '0'
                                                 : std::tolower(c) - 'a' + 10);
    }
    return true;
  }
  bool string(std::string* out) {
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    ++i_;
    while (i_ < s_.size()) {
      const char c = s_[i_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return false;
      const char e = s_[i_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          unsigned cp = 0;
          if (!hex4(&cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && s_.compare(i_, 2, "\\u") == 0) {
            i_ += 2;
            unsigned low = 0;
            if (!hex4(&low)) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          utf8(cp, out);
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }
  bool number(std::string* out) {
    const std::size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    auto digits = [&] {
      const std::size_t from = i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_])) != 0) ++i_;
      return i_ > from;
    };
    if (!digits()) return false;
    if (i_ < s_.size() && s_[i_] == '.' && (++i_, !digits())) return false;
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digits()) return false;
    }
    *out = s_.substr(start, i_ - start);
    return true;
  }
  bool value(Json* v, int depth) {
    if (depth > 64) return false;
    ws();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v->type = Json::Type::kObject;
      if (eat('}')) return true;
      do {
        ws();
        std::string key;
        Json member;
        if (!string(&key) || !eat(':') || !value(&member, depth + 1)) return false;
        v->keys.push_back(std::move(key));
        v->values.push_back(std::move(member));
      } while (eat(','));
      return eat('}');
    }
    if (c == '[') {
      ++i_;
      v->type = Json::Type::kArray;
      if (eat(']')) return true;
      do {
        Json item;
        if (!value(&item, depth + 1)) return false;
        v->array.push_back(std::move(item));
      } while (eat(','));
      return eat(']');
    }
    if (c == '"') {
      v->type = Json::Type::kString;
      return string(&v->string);
    }
    if (word("true")) {
      v->type = Json::Type::kBool;
      v->boolean = true;
      return true;
    }
    if (word("false")) {
      v->type = Json::Type::kBool;
      return true;
    }
    if (word("null")) return true;
    v->type = Json::Type::kNumber;
    return number(&v->number);
  }

  const std::string& s_;
  std::size_t i_ = 0;
};

}  // namespace

std::optional<Json> parse_json(const std::string& text, std::string* error) {
  return Parser(text).document(error);
}

}  // namespace simba::testing
