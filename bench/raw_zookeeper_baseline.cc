// Raw baseline for scripts/bench-store.sh zookeeper: what one acquire +
// release must cost at the least, without the library. An acquire writes
// one ephemeral sequential node and a release deletes it: two writes, two
// round trips, here through the ZooKeeper C client's synchronous calls.
//
//   simba-bench-raw-zookeeper HOST:PORT [pairs]
#include <zookeeper/zookeeper.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

std::mutex connected_mu;
std::condition_variable connected_cv;
bool connected = false;

void on_session_event(zhandle_t* /*zh*/, int type, int state, const char* /*path*/,
                      void* /*context*/) {
  if (type == ZOO_SESSION_EVENT && state == ZOO_CONNECTED_STATE) {
    std::lock_guard<std::mutex> lock(connected_mu);
    connected = true;
    connected_cv.notify_all();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s HOST:PORT [pairs]\n", argv[0]);
    return 2;
  }
  const int pairs = argc > 2 ? std::atoi(argv[2]) : 2000;
  zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
  zhandle_t* zh = zookeeper_init(argv[1], on_session_event, 10000, nullptr, nullptr, 0);
  if (zh == nullptr) {
    std::perror("zookeeper_init");
    return 1;
  }
  {
    std::unique_lock<std::mutex> lock(connected_mu);
    if (!connected_cv.wait_for(lock, std::chrono::seconds(10), [] { return connected; })) {
      std::fprintf(stderr, "no session with %s within 10 s\n", argv[1]);
      return 1;
    }
  }
  const int made = zoo_create(zh, "/raw-bench", "", 0, &ZOO_OPEN_ACL_UNSAFE, 0, nullptr, 0);
  if (made != ZOK && made != ZNODEEXISTS) {
    std::fprintf(stderr, "create /raw-bench: %s\n", zerror(made));
    return 1;
  }
  std::vector<double> micros;
  micros.reserve(static_cast<std::size_t>(pairs));
  char path[256];
  for (int i = 0; i < pairs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    int rc = zoo_create(zh, "/raw-bench/n-", "", 0, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL,
                        path, sizeof path);
    if (rc == ZOK) rc = zoo_delete(zh, path, -1);
    if (rc != ZOK) {
      std::fprintf(stderr, "pair %d: %s\n", i, zerror(rc));
      return 1;
    }
    micros.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
  }
  zookeeper_close(zh);
  std::sort(micros.begin(), micros.end());
  const auto at = [&](double q) {
    return micros[std::min(micros.size() - 1, static_cast<std::size_t>(q * micros.size()))];
  };
  std::printf(
      "raw baseline (create ephemeral sequential + delete, sync): n=%d median %.1f us, "
      "p90 %.1f, p99 %.1f\n",
      pairs, at(0.5), at(0.9), at(0.99));
  return 0;
}
