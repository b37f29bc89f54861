// Redis Cluster's addressing, as its specification defines it: the hash
// slot of a key, and the slot map CLUSTER SLOTS reports. Pure functions,
// tested on their own (tests/redis/redis_cluster_test.cc).
//
// Every key of one mutex is "<prefix>:{M}..." and the prefix has no braces
// (validate_key_prefix), so the hash tag is M and all of a mutex's keys and
// channels are in one slot: the slot of M.
#ifndef SIMBA_BACKENDS_REDIS_REDIS_CLUSTER_H_
#define SIMBA_BACKENDS_REDIS_REDIS_CLUSTER_H_

#include <hiredis/hiredis.h>

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace simba::internal::redis {

inline constexpr int kClusterSlots = 16384;

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum
// Redis Cluster hashes keys with.
inline std::uint16_t crc16_xmodem(std::string_view data) {
  std::uint16_t crc = 0;
  for (const char c : data) {
    crc = static_cast<std::uint16_t>(crc ^ (static_cast<std::uint8_t>(c) << 8));
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<std::uint16_t>(crc << 1);
    }
  }
  return crc;
}

// The slot of `key`: of its hash tag (what is between the first '{' and the
// next '}', when that is not empty), else of the whole key.
inline int key_slot(std::string_view key) {
  const std::size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const std::size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return crc16_xmodem(key) % kClusterSlots;
}

// One range of CLUSTER SLOTS: slots [first, last] served by the primary at
// host:port (and replicated by `replicas`, "host:port" each).
struct SlotRange {
  int first = 0;
  int last = 0;
  std::string host;
  int port = 0;
  std::vector<std::string> replicas;
};

// Parses a CLUSTER SLOTS reply; false for anything else. An empty host
// (a node that does not know its address) is `fallback_host`, as the
// specification says: the host the reply came from.
inline bool parse_cluster_slots(const redisReply* reply, const std::string& fallback_host,
                                std::vector<SlotRange>* out) {
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY) return false;
  auto text = [](const redisReply* r) -> std::string {
    return r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS
               ? std::string(r->str, r->len)
               : std::string();
  };
  out->clear();
  for (std::size_t i = 0; i < reply->elements; ++i) {
    const redisReply* range = reply->element[i];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
        range->element[0]->type != REDIS_REPLY_INTEGER ||
        range->element[1]->type != REDIS_REPLY_INTEGER) {
      return false;
    }
    SlotRange parsed;
    parsed.first = static_cast<int>(range->element[0]->integer);
    parsed.last = static_cast<int>(range->element[1]->integer);
    if (parsed.first < 0 || parsed.last >= kClusterSlots || parsed.first > parsed.last) {
      return false;
    }
    for (std::size_t n = 2; n < range->elements; ++n) {
      const redisReply* node = range->element[n];
      if (node->type != REDIS_REPLY_ARRAY || node->elements < 2 ||
          node->element[1]->type != REDIS_REPLY_INTEGER) {
        return false;
      }
      std::string host = text(node->element[0]);
      if (host.empty() || host == "?") host = fallback_host;
      const int port = static_cast<int>(node->element[1]->integer);
      if (n == 2) {
        parsed.host = host;
        parsed.port = port;
      } else {
        parsed.replicas.push_back(host + ":" + std::to_string(port));
      }
    }
    out->push_back(std::move(parsed));
  }
  return true;
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381": the slot and the
// node; false for any other reply text.
inline bool parse_redirect(std::string_view text, std::string_view kind, int* slot,
                           std::string* host, int* port) {
  if (text.substr(0, kind.size() + 1) != std::string(kind) + " ") return false;
  text.remove_prefix(kind.size() + 1);
  const std::size_t space = text.find(' ');
  if (space == std::string_view::npos) return false;
  const std::string_view slot_text = text.substr(0, space);
  const std::string_view address = text.substr(space + 1);
  const std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon + 1 >= address.size()) return false;
  auto number = [](std::string_view digits, int* value) {
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), *value);
    return error == std::errc() && end == digits.data() + digits.size();
  };
  if (!number(slot_text, slot) || !number(address.substr(colon + 1), port)) return false;
  *host = std::string(address.substr(0, colon));
  return *slot >= 0 && *slot<kClusterSlots&& * port> 0 && *port <= 65535;
}

}  // namespace simba::internal::redis

#endif  // SIMBA_BACKENDS_REDIS_REDIS_CLUSTER_H_
