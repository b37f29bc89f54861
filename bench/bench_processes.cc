#include "bench_processes.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "simba/contend_service.h"
#include "simba/contender.h"
#include "simba/keyed_lock.h"
#include "simba/locker.h"
#include "simba/registry.h"
#include "simba/uri.h"
#include "testing/child_output.h"
#include "testing/subprocess.h"

namespace simba::bench {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::emit_line;
using testing::Subprocess;

std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) fail("cannot read /proc/self/exe");
  return std::string(buf, static_cast<std::size_t>(n));
}

bool cross_process(const std::string& store) {
  auto uri = Uri::parse(store);
  return uri.ok() && uri->scheme != "memory";
}

// Shared by the contending processes through a mapped file: the start signal
// and the counter they increment under the lock, with a plain read and a
// plain write (relaxed atomics, so the program has no data race but an
// increment outside mutual exclusion would be lost).
struct SharedCounter {
  std::int64_t go_ns;  // steady clock (CLOCK_MONOTONIC: one per machine); 0 = wait
  std::int64_t counter;
};

class SharedCounterFile {
 public:
  // Creates the file (and removes it when destroyed).
  SharedCounterFile() {
    const char* tmp = std::getenv("TMPDIR");
    const std::string dir =
        access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (tmp != nullptr ? tmp : "/tmp");
    std::string path = dir + "/simba-bench-counter-XXXXXX";
    const int fd = mkstemp(path.data());
    if (fd < 0 || ftruncate(fd, sizeof(SharedCounter)) != 0) fail("cannot create " + path);
    close(fd);
    path_ = path;
    owner_ = true;
    map();
  }
  explicit SharedCounterFile(std::string path) : path_(std::move(path)) { map(); }
  ~SharedCounterFile() {
    if (shared_ != nullptr) munmap(shared_, sizeof(SharedCounter));
    if (owner_) unlink(path_.c_str());
  }
  SharedCounterFile(const SharedCounterFile&) = delete;
  SharedCounterFile& operator=(const SharedCounterFile&) = delete;

  const std::string& path() const { return path_; }
  std::atomic_ref<std::int64_t> go_ns() { return std::atomic_ref<std::int64_t>(shared_->go_ns); }
  std::atomic_ref<std::int64_t> counter() {
    return std::atomic_ref<std::int64_t>(shared_->counter);
  }

 private:
  void map() {
    const int fd = open(path_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) fail("cannot open " + path_);
    void* mapped = mmap(nullptr, sizeof(SharedCounter), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mapped == MAP_FAILED) fail("cannot map " + path_);
    shared_ = static_cast<SharedCounter*>(mapped);
  }
  std::string path_;
  bool owner_ = false;
  SharedCounter* shared_ = nullptr;
};

std::int64_t steady_nanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(BenchClock::now().time_since_epoch())
      .count();
}

milliseconds failover_bound(const Options& options) {
  return options.failover_ttl + options.failover_transition + seconds(1);
}

Row failover_row(const Options& options, const std::string& name, std::vector<double> takeovers) {
  const auto bound = failover_bound(options);
  const auto within = std::count_if(takeovers.begin(), takeovers.end(), [&](double micros) {
    return micros <= static_cast<double>(bound.count()) * 1000.0;
  });
  Row row{"failover", name, std::move(takeovers), 0, 0, {}};
  row.fields = {Field::integer("ttl_ms", options.failover_ttl.count()),
                Field::integer("transition_ms", options.failover_transition.count()),
                Field::integer("held_ms", options.failover_held.count()),
                Field::integer("bound_ms", bound.count()), Field::integer("within_bound", within)};
  return row;
}

// ---- the children ----

[[noreturn]] void sleep_until_killed() {
  for (;;) std::this_thread::sleep_for(seconds(1));
}

// mutex-holder URI MUTEX TTL_MS TRANSITION_MS: acquires, says
// "acquired <contender id>", holds until killed.
int mutex_holder(const std::string& store, const std::string& mutex, milliseconds ttl,
                 milliseconds transition) {
  FactoryOptions factory_options;
  factory_options.contend.ttl = ttl;
  factory_options.contend.transition = transition;
  auto factory = MutexContendServiceFactory::open(store, factory_options);
  if (!factory.ok()) fail(factory.status().to_string());
  const std::string id = MutexContender::generate_host_contender_id();
  auto contender = make_contender(
      mutex, [id](const MutexState&) { emit_line("acquired " + id); },
      [](const MutexState&) { emit_line("lost"); }, id);
  auto service = (*factory)->create_contend_service(contender);
  if (!service.ok() || !(*service)->start().ok()) fail("holder: cannot start");
  sleep_until_killed();
}

// key-holder URI KEY TTL_MS TRANSITION_MS: holds KEY until killed.
int key_holder(const std::string& store, const std::string& key, milliseconds ttl,
               milliseconds transition) {
  KeyedLockOptions keyed_options;
  keyed_options.lease.ttl = ttl;
  keyed_options.lease.transition = transition;
  auto provider = KeyedLockProvider::open(store, keyed_options);
  if (!provider.ok()) fail(provider.status().to_string());
  auto lease = (*provider)->acquire(key, std::chrono::hours(1));
  if (!lease.ok()) fail(lease.status().to_string());
  emit_line("acquired");
  sleep_until_killed();
}

// One way of taking the hot key in a contender process: a keyed provider's
// try_acquire, or a Locker on a mutex of that name (a peer's loop: acquire,
// work, release). Library defaults in both, as a new user would have them.
class HotKey {
 public:
  virtual ~HotKey() = default;
  // True once held (false: an error, counted).
  virtual bool acquire() = 0;
  virtual bool release() = 0;
};

class KeyedHotKey final : public HotKey {
 public:
  KeyedHotKey(const std::string& store, std::string key) : key_(std::move(key)) {
    auto provider = KeyedLockProvider::open(store);
    if (!provider.ok()) fail(provider.status().to_string());
    provider_ = std::move(*provider);
  }
  bool acquire() override {
    auto lease = provider_->try_acquire(key_, seconds(30), seconds(30));
    if (!lease.ok() || !lease->has_value()) return false;
    lease_ = std::move(**lease);
    return true;
  }
  bool release() override { return lease_.release().ok(); }

 private:
  const std::string key_;
  std::unique_ptr<KeyedLockProvider> provider_;
  Lease lease_;
};

class LockerHotKey final : public HotKey {
 public:
  LockerHotKey(const std::string& store, const std::string& mutex) {
    auto factory = MutexContendServiceFactory::open(store);
    if (!factory.ok()) fail(factory.status().to_string());
    factory_ = std::move(*factory);
    auto locker = Locker::create(*factory_, mutex);
    if (!locker.ok()) fail(locker.status().to_string());
    locker_ = std::move(*locker);
  }
  bool acquire() override {
    const Status status = locker_->acquire(seconds(30));
    if (!status.ok()) emit_line("error " + status.to_string());
    return status.ok();
  }
  bool release() override { return locker_->release().ok(); }

 private:
  std::unique_ptr<MutexContendServiceFactory> factory_;
  std::unique_ptr<Locker> locker_;
};

// contender URI KEY COUNTER_FILE SECONDS KIND (keyed|locker): says "ready",
// waits for the start, then increments the shared counter under KEY for
// SECONDS; says "waits N w1 w2 ..." (µs) and "done COUNT ERRORS".
int contender(const std::string& store, const std::string& key, const std::string& counter_path,
              int run_seconds, const std::string& kind) {
  std::unique_ptr<HotKey> hot;
  if (kind == "locker") {
    hot = std::make_unique<LockerHotKey>(store, key);
  } else {
    hot = std::make_unique<KeyedHotKey>(store, key);
  }
  SharedCounterFile shared(counter_path);
  emit_line("ready");
  while (shared.go_ns().load() == 0) std::this_thread::sleep_for(milliseconds(1));
  const auto end = BenchClock::time_point(std::chrono::nanoseconds(shared.go_ns().load())) +
                   seconds(run_seconds);
  long long count = 0;
  long long errors = 0;
  std::vector<long long> waits;
  while (BenchClock::now() < end) {
    const auto asked = BenchClock::now();
    if (!hot->acquire()) {
      ++errors;
      continue;
    }
    waits.push_back(static_cast<long long>(micros(BenchClock::now() - asked)));
    const std::int64_t seen = shared.counter().load(std::memory_order_relaxed);
    shared.counter().store(seen + 1, std::memory_order_relaxed);
    ++count;
    if (!hot->release()) ++errors;
  }
  std::string line = "waits " + std::to_string(waits.size());
  for (const long long w : waits) line += " " + std::to_string(w);
  emit_line(line);
  emit_line("done " + std::to_string(count) + " " + std::to_string(errors));
  return 0;
}

}  // namespace

int run_child(int argc, char** argv) {
  // A child outlives no benchmark: it dies with the process that started it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) return 1;
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (args.size() == 5 && args[0] == "mutex-holder") {
    return mutex_holder(args[1], args[2], milliseconds(std::atoll(args[3].c_str())),
                        milliseconds(std::atoll(args[4].c_str())));
  }
  if (args.size() == 5 && args[0] == "key-holder") {
    return key_holder(args[1], args[2], milliseconds(std::atoll(args[3].c_str())),
                      milliseconds(std::atoll(args[4].c_str())));
  }
  if (args.size() == 6 && args[0] == "contender") {
    return contender(args[1], args[2], args[3], std::atoi(args[4].c_str()), args[5]);
  }
  fail("bad --child arguments");
}

void failover_mutex(const Options& options, Report& report) {
  if (!cross_process(options.store)) return;
  FactoryOptions factory_options;
  factory_options.contend.ttl = options.failover_ttl;
  factory_options.contend.transition = options.failover_transition;
  auto factory = MutexContendServiceFactory::open(options.store, factory_options);
  if (!factory.ok()) fail(factory.status().to_string());
  const std::string mutex = "bench-failover";
  std::vector<double> takeovers;
  for (int i = 0; i < options.failovers; ++i) {
    Subprocess holder({self_path(), "--child", "mutex-holder", options.store, mutex,
                       std::to_string(options.failover_ttl.count()),
                       std::to_string(options.failover_transition.count())});
    if (!holder.started()) fail("cannot start the holder process");
    const auto line = holder.wait_for_line("acquired ", seconds(60));
    if (!line) fail("failover: the holder process never acquired");
    const auto holder_acquired_at = BenchClock::now();
    const std::string holder_id = line->substr(9);
    Signal acquired;
    auto service = (*factory)->create_contend_service(make_contender(
        mutex, [&](const MutexState&) { acquired.set(); }, nullptr));
    if (!service.ok() || !(*service)->start().ok()) fail("failover: cannot start the waiter");
    const auto looking = BenchClock::now();
    while ((*service)->after_owner().owner_id != holder_id) {
      if (BenchClock::now() - looking > seconds(20))
        fail("failover: the waiter never saw the holder");
      std::this_thread::sleep_for(milliseconds(1));
    }
    // A holder that has held a while, as holders do; one killed within a
    // few round trips of its acquisition is taken over at its lease's end
    // on the stores whose session backs a tenure only after it began.
    const auto held = holder_acquired_at + options.failover_held;
    if (BenchClock::now() < held) std::this_thread::sleep_until(held);
    const auto killed = BenchClock::now();
    holder.signal(SIGKILL);
    holder.wait();
    if (!acquired.wait(failover_bound(options) + seconds(10))) {
      fail("failover: no new owner within ttl + transition + 11 s");
    }
    takeovers.push_back(micros(acquired.at() - killed));
    if (!(*service)->stop().ok()) fail("failover: the waiter's stop failed");
  }
  Row row =
      failover_row(options, "mutex: holder SIGKILLed -> waiter acquires", std::move(takeovers));
  row.fields.push_back(
      Field::boolean("ends_with_session", (*factory)->backend()->capabilities().ends_with_session));
  report.add(row);
}

void failover_key(const Options& options, Report& report) {
  if (!cross_process(options.store)) return;
  KeyedLockOptions keyed_options;
  keyed_options.lease.ttl = options.failover_ttl;
  keyed_options.lease.transition = options.failover_transition;
  auto provider = KeyedLockProvider::open(options.store, keyed_options);
  if (!provider.ok()) fail(provider.status().to_string());
  const std::string key = "bench-failover-key";
  std::vector<double> takeovers;
  for (int i = 0; i < options.failovers; ++i) {
    Subprocess holder({self_path(), "--child", "key-holder", options.store, key,
                       std::to_string(options.failover_ttl.count()),
                       std::to_string(options.failover_transition.count())});
    if (!holder.started()) fail("cannot start the holder process");
    if (!holder.wait_for_line("acquired", seconds(60))) {
      fail("failover: the key holder process never acquired");
    }
    std::optional<BenchClock::time_point> got_at;
    std::thread waiter([&] {
      auto lease =
          (*provider)->try_acquire(key, failover_bound(options) + seconds(10), seconds(60));
      if (lease.ok() && lease->has_value()) {
        got_at = BenchClock::now();
        (void)(*lease)->release();
      }
    });
    // Long enough for the waiter to be waiting at the store.
    std::this_thread::sleep_for(milliseconds(100));
    const auto killed = BenchClock::now();
    holder.signal(SIGKILL);
    holder.wait();
    waiter.join();
    if (!got_at) fail("failover: no new key holder within ttl + transition + 11 s");
    takeovers.push_back(micros(*got_at - killed));
  }
  Row row = failover_row(options, "keyed: holder SIGKILLed -> waiter's try_acquire returns",
                         std::move(takeovers));
  row.fields.push_back(Field::text("mechanism", (*provider)->capabilities().mechanism));
  report.add(row);
}

void contended_processes(const Options& options, int contenders, bool locker, Report& report) {
  if (!cross_process(options.store)) return;
  SharedCounterFile shared;
  std::vector<std::unique_ptr<Subprocess>> children;
  for (int i = 0; i < contenders; ++i) {
    children.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{self_path(), "--child", "contender", options.store,
                                 locker ? "bench-hot-locker" : "bench-hot-processes", shared.path(),
                                 std::to_string(options.seconds), locker ? "locker" : "keyed"}));
    if (!children.back()->started()) fail("cannot start a contender process");
  }
  for (auto& child : children) {
    if (!child->wait_for_line("ready", seconds(60))) fail("a contender process never got ready");
  }
  shared.go_ns().store(steady_nanos());
  long long total = 0;
  long long least = -1;
  long long most = 0;
  std::vector<double> waits;
  for (auto& child : children) {
    std::vector<std::string> seen;
    const auto done = child->wait_for_line("done ", seconds(options.seconds + 120), &seen);
    if (!done) fail("a contender process did not finish");
    long long count = 0;
    long long errors = 0;
    std::istringstream(done->substr(5)) >> count >> errors;
    if (errors > 0) fail(std::to_string(errors) + " acquisitions or releases failed in a process");
    for (const auto& line : seen) {
      if (line.rfind("waits ", 0) != 0) continue;
      std::istringstream in(line.substr(6));
      std::size_t n = 0;
      in >> n;
      long long micros = 0;
      while (in >> micros) waits.push_back(static_cast<double>(micros));
    }
    total += count;
    least = least < 0 ? count : std::min(least, count);
    most = std::max(most, count);
    child->wait();
  }
  // Each child stops asking once its SECONDS from the start are over.
  const double elapsed = static_cast<double>(options.seconds);
  if (shared.counter().load() != total) {
    fail("lost updates under the lock between processes: counter " +
         std::to_string(shared.counter().load()) + ", " + std::to_string(total) + " increments");
  }
  Row row{"contended",
          std::to_string(contenders) + (locker ? " processes, Locker: wait for the hot mutex"
                                               : " processes: wait for the hot key"),
          std::move(waits),
          static_cast<double>(total) / elapsed,
          0,
          {}};
  row.fields = {Field::text("mode", locker ? "locker processes" : "processes"),
                Field::integer("contenders", contenders), Field::integer("count", total),
                Field::integer("least", least), Field::integer("most", most)};
  report.add(row);
}

}  // namespace simba::bench
