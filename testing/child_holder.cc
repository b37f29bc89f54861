#include "testing/child_holder.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <thread>

#include "simba/contend_service.h"
#include "simba/contender.h"
#include "testing/subprocess.h"

namespace simba::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// The child's life: it never returns.
[[noreturn]] void hold(const std::string& uri, const std::string& mutex, int out) {
  FactoryOptions options;
  options.contend.ttl = std::chrono::seconds(10);
  options.contend.transition = std::chrono::seconds(5);
  auto factory = MutexContendServiceFactory::open(uri, options);
  if (!factory.ok()) ::_exit(2);
  auto service =
      (*factory)->create_contend_service(make_contender(mutex, nullptr, nullptr, "child"));
  if (!service.ok() || !(*service)->start().ok()) ::_exit(3);
  bool owned = false;
  for (;;) {
    const bool owner = (*service)->is_owner();
    owned = owned || owner;
    if (owned) {
      const char byte = owner ? '1' : '0';
      if (::write(out, &byte, 1) != 1) ::_exit(4);
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
}

}  // namespace

char read_byte(int fd, milliseconds timeout) {
  const auto until = steady_clock::now() + timeout;
  while (steady_clock::now() < until) {
    pollfd pfd{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<milliseconds>(until - steady_clock::now());
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 1)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return '\0';
    char byte = '\0';
    return ::read(fd, &byte, 1) == 1 ? byte : '\0';
  }
  return '\0';
}

ChildHolder::ChildHolder(const std::string& uri, const std::string& mutex) {
  int fds[2];
  if (::pipe(fds) != 0) return;
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    hold(uri, mutex, fds[1]);
  }
  ::close(fds[1]);
  out_ = fds[0];
  pid_ = child;
  if (child > 0 && read_byte(out_, scaled(std::chrono::seconds(10))) != '1') signal(SIGKILL);
}

ChildHolder::~ChildHolder() {
  signal(SIGKILL);
  if (out_ >= 0) ::close(out_);
}

bool ChildHolder::signal(int signal) {
  if (pid_ <= 0) return false;
  const bool sent = ::kill(pid_, signal) == 0;
  if (signal == SIGKILL) {
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  return sent;
}

char ChildHolder::next(milliseconds timeout) { return read_byte(out_, timeout); }

void ChildHolder::drain() {
  while (read_byte(out_, milliseconds(1)) != '\0') {
  }
}

}  // namespace simba::testing
