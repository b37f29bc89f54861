// simba: run a command under a distributed lock, or as the elected leader.
// The user-facing contract is docs/cli.md.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/cli/cli.h"

#ifndef SIMBA_VERSION
#error "SIMBA_VERSION comes from CMake's project(VERSION)"
#endif

namespace simba::cli {

const char* help_for(const std::string& command) {
  if (command == "run") {
    return R"(usage: simba run --store URI --mutex NAME [options] -- CMD [ARGS...]

Acquire the mutex, run CMD while the lease is renewed, then release it.
CMD gets SIMBA_MUTEX, SIMBA_CONTENDER_ID and SIMBA_FENCING_TOKEN in its
environment. If the lease is lost, CMD's process group gets SIGTERM (then
SIGKILL after --kill-after) and simba exits with 76.

A store that cannot be reached (down, failing over) is waited for as a held
mutex is, each new cause printed once; a store that refuses us (credentials,
TLS verification, no such database) exits 69 at once.

options:
  --store URI         the store (default: $SIMBA_STORE)
  --mutex NAME        the mutex to hold
  --ttl D             renew the lease this often (default 10s)
  --transition D      grace after ttl for a late renewal (default 6s)
  --wait              wait as long as it takes (the default)
  --no-wait           one attempt; exit 75 if another process holds it, 69 if
                      the store fails
  --timeout D         wait at most D; exit 75 if another process still holds
                      it, 69 if the store still cannot be reached
  --kill-after D      SIGKILL this long after SIGTERM (default 10s)
  --verbose           report waiting and every lock event (acquired, renewed,
                      lost, released, store error) on stderr
  --log-format F      text (default) or json: one JSON object per stderr line;
                      json always reports losses; store errors are reported
                      in both, each new cause once

Durations carry a unit: 500ms, 10s, 2m, 1h.

exit codes: CMD's own; 64 usage; 69 store refused us, or unreachable until
            --timeout ended; 75 not acquired; 76 lease lost; 126 cannot
            execute CMD; 127 CMD not found

example:
  simba run --store sqlite:///var/lib/app/simba.db --mutex nightly-report \
      --timeout 30s -- ./report.sh --date today
)";
  }
  if (command == "elect") {
    return R"(usage: simba elect --store URI --mutex NAME [options] -- CMD [ARGS...]

Stay in the election while simba runs: start CMD whenever this process becomes
the leader, stop it (SIGTERM, then SIGKILL after --kill-after) when leadership
is lost, start it again when re-elected. If CMD exits by itself while leading,
simba gives up leadership and exits with CMD's status. SIGINT/SIGTERM/SIGHUP
stop CMD, release leadership and exit 0 (137 if CMD ignored SIGTERM and was
killed after --kill-after). CMD gets SIMBA_MUTEX, SIMBA_CONTENDER_ID and
SIMBA_FENCING_TOKEN (the token of that leadership) in its environment.

Until the store first answers, simba waits for it, for ever, printing each
new cause once; only a store that refuses us (credentials, TLS verification,
no such database) exits 69. After that the election rides out every outage.

options:
  --store URI         the store (default: $SIMBA_STORE)
  --mutex NAME        the election's mutex
  --ttl D             renew the lease this often (default 10s)
  --transition D      grace after ttl for a late renewal (default 6s)
  --kill-after D      SIGKILL this long after SIGTERM (default 10s)
  --verbose           report leadership changes and every lock event on stderr
  --log-format F      text (default) or json: one JSON object per stderr line;
                      json always reports losses; store errors are reported
                      in both, each new cause once

example:
  simba elect --store sqlite:///var/lib/app/simba.db --mutex scheduler-leader \
      -- ./scheduler --serve
)";
  }
  if (command == "status") {
    return R"(usage: simba status --store URI [MUTEX...] [--json]

Show each mutex's owner, when it was acquired, when its ttl and its lease end,
and its fencing token. With no MUTEX, every mutex the store has a record of.

options:
  --store URI         the store (default: $SIMBA_STORE)
  --json              one JSON object instead of a table

example:
  simba status --store sqlite:///var/lib/app/simba.db nightly-report --json
)";
  }
  if (command == "release") {
    return R"(usage: simba release --store URI --mutex NAME --force

An operator's release of a stuck lease: frees the mutex whoever holds it and
bumps its fencing counter, so later owners get greater tokens and the old
holder's writes can be rejected. The old holder learns at its next renewal.

options:
  --store URI         the store (default: $SIMBA_STORE)
  --mutex NAME        the mutex to free
  --force             required: this takes the mutex away from its holder

example:
  simba release --store sqlite:///var/lib/app/simba.db --mutex nightly-report \
      --force
)";
  }
  if (command == "schema") {
    return R"(usage: simba schema --store URI

Print the CREATE TABLE statements of a SQL store's mutex table (the URI's
`table`) and of its side table <table>_session (which holds a holder's
session backs, for failover within session_grace), for a DBA to run when
the application's database user may not create tables. Other stores need
no schema (exit 64).

options:
  --store URI         the store (default: $SIMBA_STORE)

example:
  simba schema --store 'postgresql://app@db.example/app?table=simba_mutex' \
      | psql -h db.example app
)";
  }
  if (command == "dashboard") {
    return R"(usage: simba dashboard --store URI [--listen HOST:PORT] [--refresh D]

Serve a live status page for operators: every mutex with its owner, fencing
token, a countdown to the end of its lease and who waits for it (on stores
that keep a queue), and the hand-overs seen. Also GET /api/state (JSON) and
GET /metrics (Prometheus). The page has no authentication: keep it on
loopback (the default) or behind a proxy that has. SIGINT/SIGTERM stop it.

options:
  --store URI         the store (default: $SIMBA_STORE)
  --listen HOST:PORT  where to serve (default 127.0.0.1:8080; port 0: any free)
  --refresh D         read the store this often (default 1s)

example:
  simba dashboard --store redis://127.0.0.1:6379 --listen 127.0.0.1:8080
)";
  }
  if (command == "doctor") {
    return R"(usage: simba doctor --store URI [--json] [--timeout D]

Connect to the store and report what it is and how it is deployed: the
server and its version, the topology (primary or replica, members, leader),
whether the connection is encrypted, and durability settings; then say what
of that puts a lock guarantee at risk (a replica that takes writes it may
lose, a cache with no persistence, a standby, a pooler). Secrets are never
printed.

options:
  --store URI         the store (default: $SIMBA_STORE)
  --json              one JSON object instead of lines
  --timeout D         give up on the store after D (default 10s)

exit codes: 0 nothing unsafe found; 78 something unsafe found; 64 usage;
            69 store unavailable

example:
  simba doctor --store 'redis://:secret@10.0.0.5:6379' --json
)";
  }
  if (command.empty()) {
    return R"(usage: simba COMMAND [options]

Distributed mutual exclusion from the command line.

commands:
  run        run a command while holding a mutex (like flock, across machines)
  elect      run a command whenever this process is the elected leader
  status     show the owners, leases and fencing tokens of mutexes
  release    force-release a stuck mutex (operators)
  schema     print the SQL that creates a SQL store's table (for a DBA)
  dashboard  serve a live status page of a store's mutexes (operators)
  doctor     check a store's deployment for what puts locks at risk
  help       show help for a command

stores:
  memory://NAME                                  one process only
  sqlite:///path/to/file.db
  redis://[user:password@]host:port[/db]         rediss:// for TLS
  redis-sentinel://[user:password@]host:port[,host:port...]/MASTER[/db]
  redis-cluster://[user:password@]host:port[,host:port...]
  postgresql://user[:password]@host:port[,host:port...]/db
  mysql://user[:password]@host:port[,host:port...]/db    also mariadb://
  zookeeper://[user:password@]host:port[,host:port...][/chroot]
  etcd://[user:password@]host:port[,host:port...]
  TLS and credentials: ?tls=on|verify&tls_ca=FILE&tls_cert=FILE&tls_key=FILE,
  password_file=FILE (docs/backends.md)

environment:
  SIMBA_STORE   the store URI when --store is not given
  SIMBA_LOG     how much the library logs on stderr: error, warn (default),
                info or debug

Flags take their value as the next argument or after '=' (--ttl 5s, --ttl=5s).
'simba COMMAND --help' shows a command's options and an example;
'simba --version' prints the version.
)";
  }
  return nullptr;
}

}  // namespace simba::cli

int main(int argc, char** argv) {
  using namespace simba::cli;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(help_for(""), stderr);
    return kExitUsage;
  }
  const std::string command = args.front();
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "--help" || command == "-h") {
    std::fputs(help_for(""), stdout);
    return kExitOk;
  }
  if (command == "--version") {
    std::printf("simba %s\n", SIMBA_VERSION);
    return kExitOk;
  }
  if (command == "help") {
    // `simba help --help` and `simba help help` are questions about help
    // itself: the overview answers them.
    const bool about_help = !rest.empty() && (rest.front() == "--help" || rest.front() == "-h" ||
                                              rest.front() == "help");
    const char* help = help_for(rest.empty() || about_help ? "" : rest.front());
    if (help == nullptr) {
      print_error("unknown command '" + rest.front() + "' (see 'simba --help')");
      return kExitUsage;
    }
    std::fputs(help, stdout);
    return kExitOk;
  }
  if (command == "run") return run_command(rest);
  if (command == "elect") return elect_command(rest);
  if (command == "status") return status_command(rest);
  if (command == "release") return release_command(rest);
  if (command == "schema") return schema_command(rest);
  if (command == "dashboard") return dashboard_command(rest);
  if (command == "doctor") return doctor_command(rest);
  print_error("unknown command '" + command + "' (see 'simba --help')");
  return kExitUsage;
}
