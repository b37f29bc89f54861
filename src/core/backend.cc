#include "simba/backend.h"

#include <string>

namespace simba {
namespace {

// Length of the UTF-8 sequence starting with `lead`, or 0 if `lead` cannot
// start one.
std::size_t Utf8SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

}  // namespace

Status ValidateName(std::string_view what, std::string_view name, std::size_t max_length) {
  std::string param(what);
  if (name.empty()) return InvalidArgumentError(param + " must not be empty");
  if (name.size() > max_length) {
    return InvalidArgumentError(param + " is " + std::to_string(name.size()) +
                                " bytes; this store allows at most " +
                                std::to_string(max_length));
  }
  for (std::size_t i = 0; i < name.size();) {
    const auto lead = static_cast<unsigned char>(name[i]);
    const std::size_t len = Utf8SequenceLength(lead);
    if (len == 0 || i + len > name.size()) {
      return InvalidArgumentError(param + " is not valid UTF-8 (byte " + std::to_string(i) + ")");
    }
    for (std::size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(name[i + k]) & 0xC0) != 0x80) {
        return InvalidArgumentError(param + " is not valid UTF-8 (byte " + std::to_string(i) + ")");
      }
    }
    // Overlong and surrogate forms of 3- and 4-byte sequences.
    if (len == 3) {
      const auto second = static_cast<unsigned char>(name[i + 1]);
      if ((lead == 0xE0 && second < 0xA0) || (lead == 0xED && second > 0x9F)) {
        return InvalidArgumentError(param + " is not valid UTF-8 (byte " + std::to_string(i) + ")");
      }
    } else if (len == 4) {
      const auto second = static_cast<unsigned char>(name[i + 1]);
      if ((lead == 0xF0 && second < 0x90) || (lead == 0xF4 && second > 0x8F)) {
        return InvalidArgumentError(param + " is not valid UTF-8 (byte " + std::to_string(i) + ")");
      }
    }
    if (len == 1 && (lead < 0x20 || lead == 0x7F)) {
      return InvalidArgumentError(param + " contains a control character (byte " +
                                  std::to_string(i) + ")");
    }
    i += len;
  }
  return OkStatus();
}

Status Backend::validate_mutex(std::string_view mutex) const {
  return ValidateName("mutex", mutex, capabilities().max_mutex_length);
}

Status Backend::validate_contender_id(std::string_view contender_id) const {
  return ValidateName("contender_id", contender_id, capabilities().max_contender_id_length);
}

Result<std::unique_ptr<Subscription>> Backend::subscribe(
    std::string_view /*mutex*/, std::string_view /*contender_id*/,
    std::function<void(const MutexEvent&)> /*listener*/) {
  return UnimplementedError(std::string(scheme()) + " backend cannot push owner changes");
}

Result<std::vector<std::string>> Backend::waiters(std::string_view /*mutex*/,
                                                  Deadline /*deadline*/) {
  return UnimplementedError(std::string(scheme()) + " keeps no wait queue: waiters poll");
}

}  // namespace simba
