// What a process started while its store is down or failing over must do
// (issue #34): wait for the store within its deadline, and say why it could
// not when the deadline comes first. One check for the replicated SQL stores'
// tests (a primary killed, its standby or replica promoted by the test).
#ifndef SIMBA_TESTING_FRESH_PROCESS_H_
#define SIMBA_TESTING_FRESH_PROCESS_H_

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace simba::testing {

// With the store of `store_uri` unreachable now (its primary dead):
//   - `simba run --timeout 1s` (the `simba` at `cli_path`) exits 69 after its
//     second, saying the store could not be reached and naming each of
//     `named` (the hosts and their causes);
//   - `simba run --timeout 30s` and a keyed try_acquire(30 s), started
//     alongside, still wait 2 s later;
//   - once `recover` has run (a promotion), both hold within `bound`.
void expect_fresh_processes_wait_for_the_store(const std::string& cli_path,
                                               const std::string& store_uri,
                                               const std::vector<std::string>& named,
                                               const std::function<void()>& recover,
                                               std::chrono::milliseconds bound);

}  // namespace simba::testing

#endif  // SIMBA_TESTING_FRESH_PROCESS_H_
