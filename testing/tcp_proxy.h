// A TCP proxy on loopback for tests that need a network fault between a
// client and a real server: connections can be black-holed (kept open, no
// byte passes either way, as behind a dead switch) and cut (closed).
//
//   TcpProxy proxy(server_port);
//   uri = "zookeeper://127.0.0.1:" + std::to_string(proxy.port());
//   proxy.set_blackhole(true);   // the client hears nothing from now on
//   proxy.set_blackhole(false);  // bytes flow again (held ones first)
//   proxy.cut_all();              // reset every connection (new ones allowed)
//
// One thread; every connection is a pair of sockets pumped with poll().
#ifndef SIMBA_TESTING_TCP_PROXY_H_
#define SIMBA_TESTING_TCP_PROXY_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace simba::testing {

class TcpProxy {
 public:
  // Listens on 127.0.0.1 on a free port and forwards to 127.0.0.1:target.
  explicit TcpProxy(int target_port) : TcpProxy("127.0.0.1", target_port) {}
  // ...or to `target_host` (an IPv4 address: a host of a lab of network
  // namespaces, scripts/servers/netns.sh).
  TcpProxy(const std::string& target_host, int target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  // While on, nothing is read from or written to either side, and new
  // connections are accepted but not connected upstream until it is off.
  void set_blackhole(bool on) { blackhole_ = on; }
  // While on, what the server sends is read and thrown away: requests get
  // through and are applied, their replies are lost on the way.
  void set_drop_replies(bool on) { drop_replies_ = on; }
  // While on, a client that closes its connection leaves ours to the
  // server open (and unread), as a server that has not noticed the close
  // yet; turned off, those are closed.
  void set_keep_server_open(bool on);
  // Server connections kept open after their client closed.
  int kept_open() const { return kept_.load(); }
  // Resets every open connection (both sides see a reset); returns once
  // they are gone.
  void cut_all();
  // Connections accepted so far.
  int accepted() const { return accepted_.load(); }
  // Connections open now.
  int connections() const { return open_.load(); }

 private:
  void loop();

  std::uint32_t target_host_;  // network order
  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> blackhole_{false};
  std::atomic<bool> drop_replies_{false};
  std::atomic<bool> keep_server_open_{false};
  std::atomic<int> kept_{0};
  std::mutex cut_mu_;
  std::condition_variable cut_cv_;
  bool cut_requested_ = false;  // guarded by cut_mu_
  std::atomic<int> accepted_{0};
  std::atomic<int> open_{0};
  std::thread thread_;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_TCP_PROXY_H_
