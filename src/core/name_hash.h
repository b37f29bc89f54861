#ifndef SIMBA_CORE_NAME_HASH_H_
#define SIMBA_CORE_NAME_HASH_H_

#include <cstdint>
#include <string_view>

namespace simba::internal {

// FNV-1a, 64 bits: a stable hash of a name (the same in every process and
// build, unlike std::hash), for store-side names and lock offsets derived
// from a mutex or contender name. Not for anything an adversary chooses to
// collide: its callers fall back or tolerate a collision.
inline std::uint64_t fnv1a64(std::string_view text) {
  std::uint64_t hash = 14695981039346656037ULL;  // offset basis
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ULL;  // FNV prime
  }
  return hash;
}

}  // namespace simba::internal

#endif  // SIMBA_CORE_NAME_HASH_H_
