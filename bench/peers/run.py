"""Runs one peer library (bench/peers/) through the scenarios of simba-bench
that a peer can have, and prints one JSON line per result. Started by
scripts/bench-peers.sh; docs/benchmarks.md, "Peers".

  run.py --peer NAME --uri URI [--package TEXT] [--api TEXT]
         [--scenario uncontended,contended,handoff] [--iterations N]
         [--handoffs N] [--seconds S] [--contenders 1,4,16] -- WORKER...

WORKER is the peer's program (a Python script, the Go binary, java ...).
This runner does what is the same for every peer (processes, the shared
counter, the clock, the statistics, the JSON); the worker does the lock
calls, the timing around them and the critical section. Its protocol
(argv, then lines on stdout; times in CLOCK_MONOTONIC nanoseconds, one clock
for every process of a Linux machine):

  WORKER uncontended URI KEY N
      N acquire + release pairs of the free lock KEY after N/10 that warm
      up: "samples NS..." (each pair), "done N 0 0".
  WORKER contend URI KEY SHARED SECONDS
      "ready"; waits until the first int64 (little-endian) of the 16-byte
      file SHARED is not 0: the start. Until start + SECONDS: acquire,
      create SHARED.held with O_EXCL (it exists: an overlap), read the second
      int64 and write it + 1 (plain load and store), unlink SHARED.held if it
      created it, release. Then "waits NS..." (acquire call to holding) and
      "done COUNT ERRORS OVERLAPS".
  WORKER handoff URI KEY
      "ready", then orders on stdin: "acquire" -> "waiting", then
      "acquired T" once held (T read right after); "release" -> "released
      T" (T read just before the release call); "quit". The runner waits
      20-120 ms (at random) between "waiting" and the holder's release.

Output, one JSON line per result, with simba-bench's names where it has
them (store, scenario, case, n, p50_us, p99_us, max_us, ops_per_s, mode,
contenders, count, least, most) and: peer, package, api, violations
(overlaps seen + increments lost; 0 means none was seen), overlaps,
lost_updates, errors. A field that does not apply is null.
"""

import argparse
import json
import os
import queue
import random
import struct
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import urlsplit


class Failed(Exception):
    pass


class Worker:
    """A worker process and a thread that queues its stdout lines."""

    def __init__(self, cmd, *args):
        self.proc = subprocess.Popen(cmd + [str(a) for a in args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, word, timeout):
        """The rest of the first line that starts with word (a line of
        another word is skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0))
            except queue.Empty:
                raise Failed("no '%s' from %s within %g s" % (word, self.proc.args[0], timeout))
            if line is None:
                raise Failed("%s exited (status %s) before saying '%s'"
                             % (self.proc.args[0], self.proc.wait(), word))
            head, _, rest = line.partition(" ")
            if head == word:
                return rest

    def send(self, order):
        self.proc.stdin.write(order + "\n")
        self.proc.stdin.flush()

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def percentile(sorted_us, p):
    """simba-bench's: the sample at round(p * (n - 1))."""
    if not sorted_us:
        return None
    i = int(p * (len(sorted_us) - 1) + 0.5)
    return sorted_us[min(i, len(sorted_us) - 1)]


def numbers(text):
    return [int(x) for x in text.split()]


class Runner:
    def __init__(self, opts):
        self.opts = opts
        self.store = urlsplit(opts.uri).scheme

    def emit(self, scenario, case, micros, ops_per_s, contenders, **extra):
        s = sorted(micros)
        row = {
            "store": self.store, "peer": self.opts.peer, "package": self.opts.package,
            "api": self.opts.api, "scenario": scenario, "case": case, "n": len(s),
            "p50_us": round(percentile(s, 0.5), 1) if s else None,
            "p99_us": round(percentile(s, 0.99), 1) if s else None,
            "max_us": round(s[-1], 1) if s else None,
            "ops_per_s": round(ops_per_s, 1) if ops_per_s is not None else None,
            "mode": None, "contenders": contenders, "count": None, "least": None,
            "most": None, "violations": None, "overlaps": None, "lost_updates": None,
            "errors": 0,
        }
        row.update(extra)
        print(json.dumps(row, separators=(",", ":")), flush=True)

    def uncontended(self):
        n = self.opts.iterations
        w = Worker(self.opts.worker, "uncontended", self.opts.uri, "free", n)
        try:
            micros = [ns / 1000 for ns in numbers(w.expect("samples", 120 + n))]
            w.expect("done", 30)
        finally:
            w.close()
        if w.proc.returncode != 0:
            raise Failed("uncontended: the worker exited with status %d" % w.proc.returncode)
        total = sum(micros)
        self.emit("uncontended", "acquire + release of a free lock", micros,
                  len(micros) * 1e6 / total if total > 0 else 0, 1)

    def contended(self, contenders):
        seconds = self.opts.seconds
        fd, shared = tempfile.mkstemp(prefix="simba-peers-counter-",
                                      dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
        os.write(fd, bytes(16))
        workers = []
        try:
            for _ in range(contenders):
                workers.append(Worker(self.opts.worker, "contend", self.opts.uri,
                                      "hot-%d" % contenders, shared, seconds))
            for w in workers:
                w.expect("ready", 180)  # 16 JVMs starting on a busy machine
            os.pwrite(fd, struct.pack("<q", time.monotonic_ns()), 0)
            counts, waits = [], []
            errors = overlaps = 0
            for w in workers:
                waits += [ns / 1000 for ns in numbers(w.expect("waits", seconds + 120))]
                count, errs, over = numbers(w.expect("done", 30))
                counts.append(count)
                errors += errs
                overlaps += over
            for w in workers:
                w.close()
                if w.proc.returncode != 0:
                    raise Failed("contended: a worker exited with status %d" % w.proc.returncode)
            counter = struct.unpack("<q", os.pread(fd, 8, 8))[0]
        finally:
            for w in workers:
                if w.proc.poll() is None:
                    w.proc.kill()
                    w.proc.wait()
            os.close(fd)
            os.unlink(shared)
            if os.path.exists(shared + ".held"):
                os.unlink(shared + ".held")
        total = sum(counts)
        lost = total - counter
        if overlaps or lost:
            print("run.py: %s: EXCLUSION VIOLATED with %d processes: %d overlaps seen, "
                  "%d increments lost" % (self.opts.peer, contenders, overlaps, lost),
                  file=sys.stderr)
        self.emit("contended", "%d processes: wait for the hot key" % contenders, waits,
                  total / seconds, contenders, mode="processes", count=total, least=min(counts), most=max(counts),
                  violations=overlaps + max(lost, 0), overlaps=overlaps, lost_updates=lost,
                  errors=errors)

    def handoff(self):
        a = Worker(self.opts.worker, "handoff", self.opts.uri, "handoff")
        b = Worker(self.opts.worker, "handoff", self.opts.uri, "handoff")
        micros = []
        try:
            a.expect("ready", 120)
            b.expect("ready", 120)
            holder, waiter = a, b
            holder.send("acquire")
            holder.expect("acquired", 30)
            for _ in range(self.opts.handoffs):
                waiter.send("acquire")
                waiter.expect("waiting", 30)
                # Long enough for the waiter to be queued at the store, and
                # drawn at random: a peer that polls would otherwise see every
                # release at the same point of its poll period.
                time.sleep(random.uniform(0.02, 0.12))
                holder.send("release")
                released = int(holder.expect("released", 30))
                acquired = int(waiter.expect("acquired", 30))
                micros.append((acquired - released) / 1000)
                holder, waiter = waiter, holder
            holder.send("release")
            holder.expect("released", 30)
            a.send("quit")
            b.send("quit")
        finally:
            a.close()
            b.close()
        self.emit("handoff", "release() -> waiter's acquire returns", micros, None, 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", required=True)
    ap.add_argument("--uri", required=True)
    ap.add_argument("--package", default=None)
    ap.add_argument("--api", default=None)
    ap.add_argument("--scenario", default="uncontended,contended,handoff")
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--handoffs", type=int, default=50)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--contenders", default="1,4,16")
    ap.add_argument("worker", nargs="+")
    opts = ap.parse_args()
    runner = Runner(opts)
    try:
        for scenario in opts.scenario.split(","):
            if scenario == "uncontended":
                runner.uncontended()
            elif scenario == "contended":
                for n in opts.contenders.split(","):
                    runner.contended(int(n))
            elif scenario == "handoff":
                runner.handoff()
            else:
                raise Failed("no scenario '%s' (uncontended, contended, handoff)" % scenario)
    except Failed as e:
        print("run.py: %s: %s" % (opts.peer, e), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
