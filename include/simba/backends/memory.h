// File: simba/backends/memory.h
//
// The in-process store: `memory://NAME`. Backends opened with the same NAME
// in one process share their mutexes; nothing crosses a process boundary.
// It is the reference implementation of the SPI: exact, push-capable
// (release wakes waiters at once), with a fencing counter per mutex, and its
// clock can be a ManualClock so tests drive lease expiry without sleeping.
//
// Example:
//   auto clock = std::make_shared<simba::ManualClock>();
//   auto backend = simba::new_memory_backend({.name = "test", .clock = clock});
//
// Thread safety: thread-safe.

#ifndef SIMBA_BACKENDS_MEMORY_H_
#define SIMBA_BACKENDS_MEMORY_H_

#include <memory>
#include <string>

#include "simba/backend.h"
#include "simba/clock.h"
#include "simba/keyed_backend.h"
#include "simba/status.h"
#include "simba/uri.h"

namespace simba {

struct MemoryOptions {
  // Backends with the same name in one process share a store. Must not be
  // empty.
  std::string name;
  // The store's clock (its "server time"). Default: Clock::steady(). All
  // backends sharing a store use the clock of the first one opened.
  std::shared_ptr<Clock> clock;
};

// kInvalidArgument for an empty name.
Result<std::shared_ptr<Backend>> new_memory_backend(MemoryOptions options);

// memory://NAME (no user, port, path or query).
Result<MemoryOptions> memory_options_from_uri(const Uri& uri);

// Keyed locks inside one process (memory://NAME), KeyedLockProvider::open's
// memory backend.
struct MemoryKeyedOptions {
  // Backends with the same name share their keys. Must not be empty.
  std::string name;
};

// A per-key FIFO queue, no store (new_memory_keyed_lock_backend(name)).
Result<std::shared_ptr<KeyedLockBackend>> new_memory_keyed_lock_backend(MemoryKeyedOptions options);

// memory://NAME, checked as MemoryOptionsFromUri checks it.
Result<MemoryKeyedOptions> memory_keyed_options_from_uri(const Uri& uri);

}  // namespace simba

#endif  // SIMBA_BACKENDS_MEMORY_H_
