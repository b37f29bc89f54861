// The prelude of every documentation sample (see docs/samples/README.md).
//
// docs/samples/extract.cmake turns each ```cpp block of README.md and
// docs/**/*.md into a translation unit that starts with
// `#include "prelude.h"`. This file gives those units what a reader of the
// docs takes for granted: every public Simba header, the common standard
// headers, `std::chrono_literals`, and stubs of the "application" functions
// the samples call (StartLeading, RunReport, Deposit, ...). The samples are
// compiled, never linked or run.
//
// Adding an application function: append a stub to the section at the end,
// with the argument types the docs imply (so a sample passing a wrong type
// still fails to compile), and a body that does nothing.
#ifndef SIMBA_DOCS_SAMPLES_PRELUDE_H_
#define SIMBA_DOCS_SAMPLES_PRELUDE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "simba/backend.h"
#include "simba/clock.h"
#include "simba/clustered_lock.h"
#include "simba/contend_period.h"
#include "simba/contend_service.h"
#include "simba/contender.h"
#include "simba/events.h"
#include "simba/keyed_backend.h"
#include "simba/keyed_lock.h"
#include "simba/locker.h"
#include "simba/metrics.h"
#include "simba/mutex_owner.h"
#include "simba/registry.h"
#include "simba/scheduler.h"
#include "simba/status.h"
#include "simba/uri.h"

// The backends' own headers only declare (they include nothing beyond the
// standard library and the headers above), so a sample that names one
// compiles whichever backends this build links.
#include "simba/backends/etcd.h"
#include "simba/backends/memory.h"
#include "simba/backends/mysql.h"
#include "simba/backends/mysql_keyed.h"
#include "simba/backends/postgres.h"
#include "simba/backends/postgres_keyed.h"
#include "simba/backends/redis.h"
#include "simba/backends/sqlite.h"
#include "simba/backends/zookeeper.h"

using namespace std::chrono_literals;  // NOLINT(google-build-using-namespace)

namespace simba_docs {

// What a sample run inside a function body returns: anything. `return 1;`,
// `return status;` and `return metrics->expose();` all convert to it, so a
// sample can show the early return its real caller would make.
struct AnyReturn {
  AnyReturn() = default;
  template <typename T>
  AnyReturn(T&&) {}  // NOLINT(google-explicit-constructor)
};

}  // namespace simba_docs

// ---- the application the samples call (stubs; append here) -----------------

// README.md, "Leader election".
inline void start_leading(std::uint64_t /*fencing_token*/) {}
inline void stop_leading() {}
// README.md, "A blocking lock".
inline void run_report(std::uint64_t /*fencing_token*/, std::stop_token /*lost*/) {}
// README.md, "Leader-gated periodic work".
inline void compact(std::uint64_t /*fencing_token*/, std::stop_token /*stop*/) {}
// README.md and docs/keyed-locks.md: a wallet.
inline void deposit(const std::string& /*wallet*/, std::uint64_t /*fencing_token*/) {}
inline void deposit(const std::string& /*wallet*/, long /*amount*/,
                    std::uint64_t /*fencing_token*/) {}
inline simba::Status busy(const std::string& wallet) {
  return simba::unavailable_error("wallet " + wallet + " is busy");
}
// README.md and docs/clustered-locks.md: an export job.
inline void export_rows(std::uint64_t /*fencing_token*/) {}
inline void export_orders(std::uint64_t /*fencing_token*/, std::stop_token /*lost*/) {}
inline void log_error(const simba::Status& /*status*/) {}

#endif  // SIMBA_DOCS_SAMPLES_PRELUDE_H_
