// simba-bench's options, result rows and their printing (a table for people,
// one JSON object per line for bench/report.py). The JSON fields are listed
// in docs/benchmarks.md ("simba-bench's JSON lines").
#ifndef SIMBA_BENCH_BENCH_REPORT_H_
#define SIMBA_BENCH_BENCH_REPORT_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace simba::bench {

using BenchClock = std::chrono::steady_clock;

struct Options {
  std::string store;
  std::string scenario = "all";
  int iterations = 1000;  // uncontended pairs and floor round trips
  int handoffs = 100;
  // How long a holder holds, with its waiter queued, before it releases in
  // a hand-off: the parties are idle that long, as in an application that
  // works under the lock. On a VM a thread or server idle for a few
  // milliseconds wakes slowly (a PING after 20 ms idle: ~230 µs against
  // ~60 µs in a loop here), so the hand-off rows are compared with a floor
  // measured after the same pause.
  std::chrono::milliseconds handoff_pause{20};
  std::vector<int> contenders{1, 4, 16};
  bool contend_threads = true;
  bool contend_processes = true;
  int seconds = 5;  // per contended case
  int failovers = 5;
  std::chrono::milliseconds failover_ttl{2000};
  std::chrono::milliseconds failover_transition{1000};
  // How long the holder has held when it is killed.
  std::chrono::milliseconds failover_held{300};
  int scale = 10000;  // mutexes, and keys
  // The library's defaults: what a user who holds many locks runs.
  std::chrono::milliseconds scale_ttl{10000};
  std::chrono::milliseconds scale_transition{6000};
  int scale_seconds = 22;  // held after all are acquired: two renewals each
  bool json = false;
};

// A field of a row beyond the common ones: `json` is the encoded value.
struct Field {
  std::string key;
  std::string json;
  static Field integer(std::string key, long long value);
  static Field number(std::string key, double value);
  static Field text(std::string key, const std::string& value);
  static Field boolean(std::string key, bool value);
};

struct Row {
  std::string scenario;
  std::string name;            // the "case": stable across runs
  std::vector<double> micros;  // latency samples (may be empty)
  double ops_per_second = 0;
  int round_trips = 0;  // floor round trips the operation needs at least (0: no ratio)
  std::vector<Field> fields;
  double floor = 0;  // µs of the floor it is compared with; 0: the report's
};

class Report {
 public:
  Report(std::string scheme, bool json) : scheme_(std::move(scheme)), json_(json) {}
  void set_floor(double median_micros) { floor_ = median_micros; }
  void add(const Row& row);

 private:
  std::string scheme_;
  bool json_;
  double floor_ = 0;
  bool header_printed_ = false;
};

// Set by a callback, waited for by the benchmark.
class Signal {
 public:
  void set() {
    std::lock_guard<std::mutex> lock(mu_);
    set_ = true;
    at_ = BenchClock::now();
    cv_.notify_all();
  }
  bool wait(BenchClock::duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return set_; });
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    set_ = false;
  }
  // When Set() last ran.
  BenchClock::time_point at() {
    std::lock_guard<std::mutex> lock(mu_);
    return at_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
  BenchClock::time_point at_;
};

double micros(BenchClock::duration d);
// The nearest-rank percentile, p in [0, 1]; 0 for no samples.
double percentile(std::vector<double> samples, double p);
// Samples taken back to back: how many per second.
double ops_per_second(const std::vector<double>& micros);
// Prints to stderr and exits 1: a wrong answer or a store error.
[[noreturn]] void fail(const std::string& what);

// This process, from /proc/self: threads, open sockets, resident MiB.
int count_threads();
// Threads Simba started (named "simba:..."), not a client library's pool.
int count_simba_threads();
int count_sockets();
double resident_mi_b();

}  // namespace simba::bench

#endif  // SIMBA_BENCH_BENCH_REPORT_H_
