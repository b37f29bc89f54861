#include "testing/fresh_process.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <iostream>
#include <optional>
#include <thread>

#include "simba/keyed_lock.h"
#include "testing/status_matchers.h"
#include "testing/subprocess.h"

namespace simba::testing {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

void expect_fresh_processes_wait_for_the_store(const std::string& cli_path,
                                               const std::string& store_uri,
                                               const std::vector<std::string>& named,
                                               const std::function<void()>& recover,
                                               milliseconds bound) {
  const std::string run = cli_path + " run --store '" + store_uri +
                          "' --mutex fresh --ttl 2s --transition 1s --timeout ";
  const CommandRun short_run = run_command_line(run + "1s -- true");
  EXPECT_EQ(short_run.exit_code, 69) << short_run.output;
  EXPECT_GE(short_run.elapsed, milliseconds(1000)) << short_run.output;
  EXPECT_THAT(short_run.output, HasSubstr("could not be reached")) << short_run.output;
  for (const std::string& part : named) {
    EXPECT_THAT(short_run.output, HasSubstr(part)) << short_run.output;
  }
  std::future<CommandRun> waiting = start_command_line(run + "30s -- true");
  auto provider = KeyedLockProvider::open(store_uri);
  ASSERT_THAT(provider, IsOk());
  auto keyed = std::async(std::launch::async, [&] {
    return (*provider)->try_acquire("fresh-key", seconds(30), seconds(10));
  });
  std::this_thread::sleep_for(milliseconds(2000));
  ASSERT_EQ(waiting.wait_for(milliseconds(0)), std::future_status::timeout)
      << "gave up before the store was back: " << waiting.get().output;
  ASSERT_EQ(keyed.wait_for(milliseconds(0)), std::future_status::timeout)
      << "the keyed acquisition gave up before the store was back: " << keyed.get().status();
  recover();
  const auto recovered_at = std::chrono::steady_clock::now();
  ASSERT_EQ(waiting.wait_for(bound), std::future_status::ready);
  const CommandRun waited = waiting.get();
  EXPECT_EQ(waited.exit_code, 0) << waited.output;
  ASSERT_EQ(keyed.wait_for(bound), std::future_status::ready);
  auto held = keyed.get();
  ASSERT_THAT(held, IsOk());
  EXPECT_TRUE(held->has_value());
  std::cout << "after the store was back: simba run and the keyed lease held within "
            << std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() -
                                                        recovered_at)
                   .count()
            << " ms\n";
}

}  // namespace simba::testing
