#include "simba/backend.h"

#include <chrono>
#include <string>
#include <tuple>

namespace simba {
namespace {

// Length of the UTF-8 sequence starting with `lead`, or 0 if `lead` cannot
// start one.
std::size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

Status no_wait_queue(std::string_view scheme) {
  return unimplemented_error(std::string(scheme) + " keeps no wait queue: waiters poll");
}

}  // namespace

Status validate_name(std::string_view what, std::string_view name, std::size_t max_length) {
  std::string param(what);
  if (name.empty()) return invalid_argument_error(param + " must not be empty");
  if (name.size() > max_length) {
    return invalid_argument_error(param + " is " + std::to_string(name.size()) +
                                  " bytes; this store allows at most " +
                                  std::to_string(max_length));
  }
  for (std::size_t i = 0; i < name.size();) {
    const auto lead = static_cast<unsigned char>(name[i]);
    const std::size_t len = utf8_sequence_length(lead);
    if (len == 0 || i + len > name.size()) {
      return invalid_argument_error(param + " is not valid UTF-8 (byte " + std::to_string(i) + ")");
    }
    for (std::size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(name[i + k]) & 0xC0) != 0x80) {
        return invalid_argument_error(param + " is not valid UTF-8 (byte " + std::to_string(i) +
                                      ")");
      }
    }
    // Overlong and surrogate forms of 3- and 4-byte sequences.
    if (len == 3) {
      const auto second = static_cast<unsigned char>(name[i + 1]);
      if ((lead == 0xE0 && second < 0xA0) || (lead == 0xED && second > 0x9F)) {
        return invalid_argument_error(param + " is not valid UTF-8 (byte " + std::to_string(i) +
                                      ")");
      }
    } else if (len == 4) {
      const auto second = static_cast<unsigned char>(name[i + 1]);
      if ((lead == 0xF0 && second < 0x90) || (lead == 0xF4 && second > 0x8F)) {
        return invalid_argument_error(param + " is not valid UTF-8 (byte " + std::to_string(i) +
                                      ")");
      }
    }
    if (len == 1 && (lead < 0x20 || lead == 0x7F)) {
      return invalid_argument_error(param + " contains a control character (byte " +
                                    std::to_string(i) + ")");
    }
    i += len;
  }
  return ok_status();
}

Status Backend::validate_mutex(std::string_view mutex) const {
  SIMBA_RETURN_IF_ERROR(validate_name("mutex", mutex, capabilities().max_mutex_length));
  return validate_store_mutex(mutex);
}

Status Backend::validate_contender_id(std::string_view contender_id) const {
  SIMBA_RETURN_IF_ERROR(
      validate_name("contender_id", contender_id, capabilities().max_contender_id_length));
  return validate_store_contender_id(contender_id);
}

Status Backend::validate_store_mutex(std::string_view /*mutex*/) const { return ok_status(); }

Status Backend::validate_store_contender_id(std::string_view /*contender_id*/) const {
  return ok_status();
}

Result<OwnerRecord> Backend::acquire_or_renew(const AcquireRequest& request, Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(check_request(request));
  return do_acquire_or_renew(request, deadline);
}

Result<std::vector<OwnerRecord>> Backend::renew(const std::vector<AcquireRequest>& requests,
                                                Deadline deadline) {
  if (!capabilities().batch_renewals) {
    return unimplemented_error(std::string(scheme()) + ": this store renews one lease a call");
  }
  for (const AcquireRequest& request : requests) SIMBA_RETURN_IF_ERROR(check_request(request));
  if (requests.empty()) return std::vector<OwnerRecord>();
  SIMBA_ASSIGN_OR_RETURN(std::vector<OwnerRecord> records, do_renew(requests, deadline));
  if (records.size() != requests.size()) {
    return internal_error(std::string(scheme()) + ": a batched renewal answered " +
                          std::to_string(records.size()) + " of " +
                          std::to_string(requests.size()) + " requests");
  }
  return records;
}

Result<std::vector<OwnerRecord>> Backend::do_renew(const std::vector<AcquireRequest>&, Deadline) {
  return unimplemented_error(std::string(scheme()) + ": this store renews one lease a call");
}

Status Backend::check_request(const AcquireRequest& request) const {
  SIMBA_RETURN_IF_ERROR(validate_mutex(request.mutex));
  SIMBA_RETURN_IF_ERROR(validate_contender_id(request.contender_id));
  if (request.ttl <= std::chrono::milliseconds::zero() ||
      request.transition < std::chrono::milliseconds::zero()) {
    return invalid_argument_error("ttl must be positive and transition not negative");
  }
  const Capabilities& limits = capabilities();
  for (const auto& [what, value, max] :
       {std::tuple("ttl", request.ttl, limits.max_ttl),
        std::tuple("transition", request.transition, limits.max_transition)}) {
    if (value > max) {
      return invalid_argument_error(std::string(what) + " is " + std::to_string(value.count()) +
                                    " ms; this store allows at most " +
                                    std::to_string(max.count()) + " ms");
    }
  }
  return ok_status();
}

Result<bool> Backend::release(std::string_view mutex, std::string_view contender_id,
                              std::uint64_t fencing_token, Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(validate_mutex(mutex));
  SIMBA_RETURN_IF_ERROR(validate_contender_id(contender_id));
  return do_release(mutex, contender_id, fencing_token, deadline);
}

Status Backend::leave(std::string_view mutex, std::string_view contender_id, Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(validate_mutex(mutex));
  SIMBA_RETURN_IF_ERROR(validate_contender_id(contender_id));
  return do_leave(mutex, contender_id, deadline);
}

Status Backend::do_leave(std::string_view, std::string_view, Deadline) { return ok_status(); }

Result<OwnerRecord> Backend::read(std::string_view mutex, Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(validate_mutex(mutex));
  return do_read(mutex, deadline);
}

Result<std::unique_ptr<Subscription>> Backend::subscribe(
    std::string_view mutex, std::string_view contender_id,
    std::function<void(const MutexEvent&)> listener) {
  SIMBA_RETURN_IF_ERROR(validate_mutex(mutex));
  // Empty: a retriever.
  if (!contender_id.empty()) SIMBA_RETURN_IF_ERROR(validate_contender_id(contender_id));
  if (!listener) return invalid_argument_error("listener must not be empty");
  return do_subscribe(mutex, contender_id, std::move(listener));
}

Result<std::vector<ListedMutex>> Backend::list(Deadline deadline) { return do_list(deadline); }

Result<std::vector<std::string>> Backend::waiters(std::string_view mutex, Deadline deadline) {
  if (!capabilities().lists_waiters) return no_wait_queue(scheme());
  SIMBA_RETURN_IF_ERROR(validate_mutex(mutex));
  return do_waiters(mutex, deadline);
}

Result<ForcedRelease> Backend::force_release(std::string_view mutex, Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(validate_mutex(mutex));
  return do_force_release(mutex, deadline);
}

const char* severity_name(StoreFinding::Severity severity) {
  switch (severity) {
    case StoreFinding::Severity::kOk:
      return "ok";
    case StoreFinding::Severity::kNote:
      return "note";
    case StoreFinding::Severity::kUnsafe:
      return "unsafe";
  }
  return "ok";
}

bool StoreReport::unsafe() const {
  for (const StoreFinding& finding : findings) {
    if (finding.severity == StoreFinding::Severity::kUnsafe) return true;
  }
  return false;
}

Result<StoreReport> Backend::inspect(Deadline deadline) {
  StoreReport report;
  const Capabilities& capabilities = this->capabilities();
  const bool encrypted = capabilities.transport.rfind("TLS (", 0) == 0;
  const bool local =
      capabilities.transport == "local file" || capabilities.transport == "in process";
  std::string why;
  if (capabilities.transport == "plain text") {
    why = ": credentials and lock traffic cross the network unencrypted";
  } else if (!encrypted && !local) {
    why = ": the server is not verified, and the traffic may not be encrypted";
  }
  report.add(why.empty() ? StoreFinding::Severity::kOk : StoreFinding::Severity::kNote, "transport",
             capabilities.transport + why);
  report.add(
      StoreFinding::Severity::kOk, "fencing",
      capabilities.fencing_source.empty() ? "no fencing tokens" : capabilities.fencing_source);
  // One real round trip first, so an unreachable store (or one that refuses
  // us) is an error here, whatever the backend can tell beyond it.
  const auto started = std::chrono::steady_clock::now();
  SIMBA_RETURN_IF_ERROR(read("simba-doctor", deadline).status());
  const auto took = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - started);
  report.add(StoreFinding::Severity::kOk, "reachable",
             "a read of one mutex took " + std::to_string(took.count() / 1000) + "." +
                 std::to_string(took.count() % 1000 / 100) + " ms");
  SIMBA_RETURN_IF_ERROR(do_inspect(report, deadline));
  return report;
}

Status Backend::do_inspect(StoreReport& /*report*/, Deadline /*deadline*/) { return ok_status(); }

Result<std::unique_ptr<Subscription>> Backend::do_subscribe(
    std::string_view /*mutex*/, std::string_view /*contender_id*/,
    std::function<void(const MutexEvent&)> /*listener*/) {
  return unimplemented_error(std::string(scheme()) + " backend cannot push owner changes");
}

Result<std::vector<std::string>> Backend::do_waiters(std::string_view /*mutex*/,
                                                     Deadline /*deadline*/) {
  return no_wait_queue(scheme());
}

}  // namespace simba
