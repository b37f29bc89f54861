"""The worker side of a Python peer (bench/peers/*.py): the three scenarios
of the peers' protocol, given how the peer library takes and gives back a
lock. bench/peers/run.py starts the workers and reads what they print; the
protocol is at the top of run.py (peer_etcd.go and PeerCurator.java speak it
too).

A peer module defines open_lock(uri, key) -> an object with acquire() and
release(), built with the library's defaults, and calls main(open_lock).
"""

import mmap
import os
import struct
import sys
import time

now_ns = time.monotonic_ns  # CLOCK_MONOTONIC: one clock for every process of the machine


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def uncontended(lock, n):
    """n acquire + release pairs of a free lock, after a tenth more that warm up."""
    warm = n // 10
    samples = []
    for i in range(n + warm):
        start = now_ns()
        lock.acquire()
        lock.release()
        if i >= warm:
            samples.append(now_ns() - start)
    say("samples " + " ".join(map(str, samples)))
    say("done %d 0 0" % len(samples))


def contend(lock, shared_path, seconds):
    """Loops acquire -> bump the shared counter -> release until the start
    (set by the runner in the shared file) + seconds. Two holders at once are
    caught twice: the marker file beside the counter is created with O_EXCL
    on entry (it exists: an overlap), and the counter is read, then written
    + 1 with plain loads and stores (an overlap can lose an increment, which
    the runner sees in the final count)."""
    marker = shared_path + ".held"
    fd = os.open(shared_path, os.O_RDWR)
    shared = mmap.mmap(fd, 16)
    os.close(fd)
    say("ready")
    while struct.unpack_from("<q", shared, 0)[0] == 0:
        time.sleep(0.001)
    end = struct.unpack_from("<q", shared, 0)[0] + seconds * 1_000_000_000
    count = errors = overlaps = 0
    waits = []
    while now_ns() < end:
        asked = now_ns()
        try:
            lock.acquire()
        except Exception as e:  # counted, as simba-bench counts a failed acquire
            errors += 1
            print("acquire: %r" % (e,), file=sys.stderr)
            continue
        waits.append(now_ns() - asked)
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            mine = True
        except FileExistsError:
            overlaps += 1
            mine = False
        seen = struct.unpack_from("<q", shared, 8)[0]
        struct.pack_into("<q", shared, 8, seen + 1)
        count += 1
        if mine:
            os.unlink(marker)
        try:
            lock.release()
        except Exception as e:
            errors += 1
            print("release: %r" % (e,), file=sys.stderr)
    say("waits " + " ".join(map(str, waits)))
    say("done %d %d %d" % (count, errors, overlaps))


def handoff(lock):
    """Takes orders on stdin: acquire (says "waiting" first, then "acquired
    T" once it holds), release ("released T", T read just before the
    release call); T in CLOCK_MONOTONIC ns."""
    say("ready")
    for line in sys.stdin:
        order = line.strip()
        if order == "acquire":
            say("waiting")
            lock.acquire()
            say("acquired %d" % now_ns())
        elif order == "release":
            t = now_ns()
            lock.release()
            say("released %d" % t)
        elif order == "quit":
            break


def commit_token(conn, token, previous):
    """Commits the transaction that bumped a fencing token (durable before
    the holder acts on it) and returns the token, which must be greater
    than the holder's `previous` one (the *_fenced.py floors)."""
    conn.commit()
    if token <= previous:
        raise RuntimeError(f"token {token} after {previous}")
    return token


def main(open_lock):
    """argv: uncontended URI KEY N | contend URI KEY SHARED_FILE SECONDS | handoff URI KEY"""
    args = sys.argv[1:]
    if len(args) == 4 and args[0] == "uncontended":
        uncontended(open_lock(args[1], args[2]), int(args[3]))
    elif len(args) == 5 and args[0] == "contend":
        contend(open_lock(args[1], args[2]), args[3], int(args[4]))
    elif len(args) == 3 and args[0] == "handoff":
        handoff(open_lock(args[1], args[2]))
    else:
        sys.exit("usage: %s uncontended URI KEY N | contend URI KEY SHARED_FILE SECONDS | "
                 "handoff URI KEY" % sys.argv[0])
