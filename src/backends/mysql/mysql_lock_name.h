// How a key becomes a GET_LOCK name (docs/backends/mysql.md, "Keyed
// locks"). Stable: every process, and every version of Simba, must
// map a key to the same name, or they would not exclude each other.
#ifndef SIMBA_BACKENDS_MYSQL_MYSQL_LOCK_NAME_H_
#define SIMBA_BACKENDS_MYSQL_MYSQL_LOCK_NAME_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace simba::internal::sql::mysql {

// How the server compares lock names.
enum class LockNameCompare {
  // Byte for byte (MariaDB 10.11, as probed at the first connection): case,
  // accents and trailing spaces count.
  kExact,
  // Case-insensitively, or in some way we could not pin down (MySQL 5.7+
  // lower-cases names in its system character set): only names that no
  // folding can change are used as they are.
  kFolded,
};

// Longest name used as it is: MySQL counts 64 characters, MariaDB 192 bytes
// (64 three-byte characters); a name must fit both.
inline constexpr std::size_t kMaxPlainNameChars = 64;
inline constexpr std::size_t kMaxPlainNameBytes = 192;
// Hashed names are this prefix and the first 56 hex digits (224 bits) of the
// key's SHA-256: 64 characters. Keys that start with it are hashed too, so a
// plain name never equals a hashed one.
inline constexpr std::string_view kHashedNamePrefix = "#sha256:";
inline constexpr std::size_t kHashedNameDigits = 56;

// The GET_LOCK name of `key` (valid UTF-8, as validate_key checked).
std::string lock_name_of(std::string_view key, LockNameCompare compare);

// True when `key` is used as its own lock name.
bool is_plain_lock_name(std::string_view key, LockNameCompare compare);

// SHA-256 of `data` as 64 lower-case hex digits (FIPS 180-4).
std::string sha256_hex(std::string_view data);

}  // namespace simba::internal::sql::mysql

#endif  // SIMBA_BACKENDS_MYSQL_MYSQL_LOCK_NAME_H_
