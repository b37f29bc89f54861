// Leader election across processes, end to end.
//
// The parent starts several member processes (this same binary with
// --member). Each member contends for one mutex and, while it leads, does
// "work" once a second through a leader-gated Scheduler, printing the fencing
// token of its leadership. The parent watches the mutex with a retrieval
// service, then kills the leader with SIGKILL (a crash: the next leader takes
// over when the lease ends) and later stops the new leader with SIGTERM (a
// clean release), printing each takeover and how long it took.
//
//   leader_election [--store URI] [--members N] [--ttl-ms N] [--transition-ms N]
//
// Default store: sqlite:///tmp/simba-example.db
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "simba/contend_service.h"
#include "simba/scheduler.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const char kMutex[] = "example-leader";

struct Settings {
  std::string store = "sqlite:///tmp/simba-example.db";
  int members = 3;
  milliseconds ttl{3000};
  milliseconds transition{2000};
};

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

void say(const std::string& line) {
  const std::string out = line + "\n";
  const ssize_t ignored = write(STDOUT_FILENO, out.data(), out.size());
  (void)ignored;
}

simba::FactoryOptions options(const Settings& s) {
  simba::FactoryOptions options;
  options.contend.ttl = s.ttl;
  options.contend.transition = s.transition;
  return options;
}

// A member process: contends until SIGTERM, working while it leads.
int run_member(const Settings& settings, const std::string& name) {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  auto factory = simba::MutexContendServiceFactory::open(settings.store, options(settings));
  if (!factory.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), factory.status().to_string().c_str());
    return 1;
  }
  simba::SchedulerOptions options;
  // Readable ids for the demo; by default ids carry a random part.
  options.contender_id = name + "/pid-" + std::to_string(getpid());
  auto scheduler = simba::Scheduler::create(
      **factory, kMutex, simba::ScheduleConfig::fixed_rate(milliseconds(0), milliseconds(1000)),
      [name](const simba::WorkContext& ctx) {
        say("  " + name + ": working as leader, fencing token " +
            std::to_string(ctx.fencing_token));
      },
      options);
  if (!scheduler.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), scheduler.status().to_string().c_str());
    return 1;
  }
  if (auto s = (*scheduler)->start(); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), s.to_string().c_str());
    return 1;
  }
  while (!g_stop) std::this_thread::sleep_for(milliseconds(20));
  say("  " + name + ": stopping (releasing the mutex if held)");
  (void)(*scheduler)->stop();
  return 0;
}

pid_t spawn(const char* self, const Settings& s, const std::string& name) {
  std::vector<std::string> args = {self,
                                   "--member",
                                   name,
                                   "--store",
                                   s.store,
                                   "--ttl-ms",
                                   std::to_string(s.ttl.count()),
                                   "--transition-ms",
                                   std::to_string(s.transition.count())};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, self, nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

// Waits until the mutex's owner differs from `previous`; returns the new
// owner id, or "" on timeout.
std::string wait_for_new_leader(simba::MutexRetrievalService& watcher, const std::string& previous,
                                milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    const std::string owner = watcher.after_owner().owner_id;
    if (!owner.empty() && owner != previous) return owner;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return "";
}

pid_t pid_of(const std::string& owner_id) {
  const auto at = owner_id.rfind("/pid-");
  return at == std::string::npos ? -1 : static_cast<pid_t>(std::atol(owner_id.c_str() + at + 5));
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  std::string member;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", flag.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (flag == "--store") {
      settings.store = value();
    } else if (flag == "--members") {
      settings.members = std::atoi(value().c_str());
    } else if (flag == "--ttl-ms") {
      settings.ttl = milliseconds(std::atoll(value().c_str()));
    } else if (flag == "--transition-ms") {
      settings.transition = milliseconds(std::atoll(value().c_str()));
    } else if (flag == "--member") {
      member = value();
    } else {
      std::fprintf(stderr,
                   "usage: leader_election [--store URI] [--members N] [--ttl-ms N] "
                   "[--transition-ms N]\n");
      return 2;
    }
  }
  if (!member.empty()) return run_member(settings, member);
  if (settings.members < 2) {
    std::fprintf(stderr, "--members must be at least 2\n");
    return 2;
  }

  auto factory = simba::MutexContendServiceFactory::open(settings.store, options(settings));
  if (!factory.ok()) {
    std::fprintf(stderr, "cannot open %s: %s\n", settings.store.c_str(),
                 factory.status().to_string().c_str());
    return 1;
  }
  auto watcher =
      (*factory)->create_retrieval_service(simba::make_retriever(kMutex, nullptr)).value();
  (void)watcher->start();

  say("Simba leader election on " + settings.store + ": " + std::to_string(settings.members) +
      " members, ttl " + std::to_string(settings.ttl.count()) + "ms, transition " +
      std::to_string(settings.transition.count()) + "ms");
  std::vector<pid_t> pids;
  for (int i = 1; i <= settings.members; ++i) {
    pids.push_back(spawn(argv[0], settings, "member-" + std::to_string(i)));
  }
  const milliseconds takeover_bound = settings.ttl + settings.transition + milliseconds(3000);
  int status = 0;
  std::string leader = wait_for_new_leader(*watcher, "", milliseconds(15000));
  if (leader.empty()) {
    say("no leader was elected");
    status = 1;
  } else {
    say("leader: " + leader + " (token " + std::to_string(watcher->after_owner().fencing_token) +
        ")");
    std::this_thread::sleep_for(milliseconds(3500));

    say("killing the leader " + leader + " with SIGKILL (a crash)");
    const auto killed = Clock::now();
    kill(pid_of(leader), SIGKILL);
    std::string next = wait_for_new_leader(*watcher, leader, takeover_bound);
    if (next.empty()) {
      say("no takeover after the crash");
      status = 1;
    } else {
      char line[256];
      std::snprintf(line, sizeof line,
                    "takeover after the crash: %s leads (token %llu) after %.2fs", next.c_str(),
                    static_cast<unsigned long long>(watcher->after_owner().fencing_token),
                    seconds(Clock::now() - killed));
      say(line);
      std::this_thread::sleep_for(milliseconds(3500));

      say("stopping the leader " + next + " with SIGTERM (a clean release)");
      const auto stopped = Clock::now();
      kill(pid_of(next), SIGTERM);
      std::string third = wait_for_new_leader(*watcher, next, takeover_bound);
      if (third.empty()) {
        say("no takeover after the release");
        status = 1;
      } else {
        std::snprintf(
            line, sizeof line, "takeover after the release: %s leads (token %llu) after %.2fs",
            third.c_str(), static_cast<unsigned long long>(watcher->after_owner().fencing_token),
            seconds(Clock::now() - stopped));
        say(line);
        std::this_thread::sleep_for(milliseconds(2500));
      }
    }
  }
  for (pid_t pid : pids) kill(pid, SIGTERM);
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  (void)watcher->stop();
  say(status == 0 ? "done: one leader at a time, tokens only ever grew" : "FAILED");
  return status;
}
