"""Peer: PostgreSQL's session advisory lock through psycopg2 (Debian's
python3-psycopg2), with its defaults (autocommit off: the statements run in
one open transaction, which session-level advisory locks outlive):
SELECT pg_advisory_lock(K) blocks in the server until the lock is free;
SELECT pg_advisory_unlock(K) gives it back. K is the CRC-32 of the key's
name. Worker of bench/peers/run.py (protocol in peerlib.py)."""

import zlib

import psycopg2

import peerlib


class AdvisoryLock:
    def __init__(self, uri, key):
        self.conn = psycopg2.connect(uri)
        self.cur = self.conn.cursor()
        self.key = zlib.crc32(("bench-peers:" + key).encode())

    def acquire(self):
        self.cur.execute("SELECT pg_advisory_lock(%s)", (self.key,))
        self.cur.fetchone()

    def release(self):
        self.cur.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
        if not self.cur.fetchone()[0]:
            raise RuntimeError("pg_advisory_unlock: the lock was not held")


if __name__ == "__main__":
    peerlib.main(AdvisoryLock)
