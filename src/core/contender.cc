#include "simba/contender.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <random>

#include "simba/contend_period.h"

namespace simba {
namespace {

std::string random_hex(std::size_t digits) {
  static constexpr char kHex[] = "0123456789abcdef";
  auto random = Random::standard();
  std::string out;
  out.reserve(digits);
  for (std::size_t i = 0; i < digits; ++i) {
    out.push_back(kHex[random->uniform(0, 16)]);
  }
  return out;
}

std::string host_name() {
  std::array<char, 256> buffer{};
  if (gethostname(buffer.data(), buffer.size() - 1) != 0 || buffer[0] == '\0') {
    return "localhost";
  }
  std::string host(buffer.data());
  // Keep ids within every store's 128-byte limit whatever the hostname.
  if (host.size() > 64) host.resize(64);
  // '@@' is a delimiter in JVM Simba's Redis messages; a hostname cannot
  // contain '@', but be defensive about odd resolvers.
  for (char& c : host) {
    if (c == '@' || static_cast<unsigned char>(c) < 0x20) c = '_';
  }
  return host;
}

class FunctionContender final : public MutexContender {
 public:
  FunctionContender(std::string mutex, std::string contender_id,
                    std::function<void(const MutexState&)> on_acquired,
                    std::function<void(const MutexState&)> on_released)
      : MutexContender(std::move(mutex), std::move(contender_id)),
        on_acquired_(std::move(on_acquired)),
        on_released_(std::move(on_released)) {}
  void on_acquired(const MutexState& state) override {
    if (on_acquired_) on_acquired_(state);
  }
  void on_released(const MutexState& state) override {
    if (on_released_) on_released_(state);
  }

 private:
  std::function<void(const MutexState&)> on_acquired_;
  std::function<void(const MutexState&)> on_released_;
};

class FunctionRetriever final : public MutexRetriever {
 public:
  FunctionRetriever(std::string mutex, std::function<void(const MutexState&)> on_owner)
      : MutexRetriever(std::move(mutex)), on_owner_(std::move(on_owner)) {}
  void on_owner(const MutexState& state) override {
    if (on_owner_) on_owner_(state);
  }

 private:
  std::function<void(const MutexState&)> on_owner_;
};

}  // namespace

MutexRetriever::MutexRetriever(std::string mutex) : mutex_(std::move(mutex)) {}

void MutexRetriever::on_owner(const MutexState& /*state*/) {}

MutexContender::MutexContender(std::string mutex, std::string contender_id)
    : MutexRetriever(std::move(mutex)), contender_id_(std::move(contender_id)) {}

void MutexContender::on_acquired(const MutexState& /*state*/) {}
void MutexContender::on_released(const MutexState& /*state*/) {}

void MutexContender::on_owner(const MutexState& state) {
  // A lost lease followed at once by a new acquisition shows up as one
  // update whose token changed: report the loss before the gain.
  if (state.is_released(contender_id_)) on_released(state);
  if (state.is_acquired(contender_id_)) on_acquired(state);
}

std::string MutexContender::generate_host_contender_id() {
  static std::atomic<std::uint64_t> counter{0};
  static const std::string kHost = host_name();
  return std::to_string(counter.fetch_add(1)) + ":" + std::to_string(getpid()) + "@" + kHost + "/" +
         random_hex(8);
}

std::string MutexContender::generate_uuid_contender_id() {
  std::string hex = random_hex(32);
  // RFC 4122 version 4 and variant bits, so the value is a real UUID.
  hex[12] = '4';
  static constexpr char kVariant[] = "89ab";
  hex[16] = kVariant[Random::standard()->uniform(0, 4)];
  return hex;
}

std::shared_ptr<MutexContender> make_contender(std::string mutex,
                                               std::function<void(const MutexState&)> on_acquired,
                                               std::function<void(const MutexState&)> on_released,
                                               std::string contender_id) {
  return std::make_shared<FunctionContender>(std::move(mutex), std::move(contender_id),
                                             std::move(on_acquired), std::move(on_released));
}

std::shared_ptr<MutexRetriever> make_retriever(std::string mutex,
                                               std::function<void(const MutexState&)> on_owner) {
  return std::make_shared<FunctionRetriever>(std::move(mutex), std::move(on_owner));
}

}  // namespace simba
