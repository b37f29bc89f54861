"""Peer: MySQL/MariaDB's named lock through PyMySQL (Debian's
python3-pymysql), with its defaults: SELECT GET_LOCK(name, T) blocks in the
server until the lock is free, for T = a year (GET_LOCK has no default
timeout; MySQL's "negative: no limit" gets NULL from MariaDB 10.11);
SELECT RELEASE_LOCK(name) gives it back. Worker of bench/peers/run.py
(protocol in peerlib.py)."""

from urllib.parse import unquote, urlsplit

import pymysql

import peerlib


class GetLock:
    def __init__(self, uri, key):
        u = urlsplit(uri)  # mysql://USER:PASSWORD@HOST:PORT/DATABASE
        self.conn = pymysql.connect(host=u.hostname, port=u.port or 3306,
                                    user=unquote(u.username or ""),
                                    password=unquote(u.password or ""),
                                    database=u.path.lstrip("/") or None)
        self.cur = self.conn.cursor()
        self.name = "bench-peers:" + key

    def acquire(self):
        self.cur.execute("SELECT GET_LOCK(%s, 31536000)", (self.name,))
        if self.cur.fetchone()[0] != 1:
            raise RuntimeError("GET_LOCK did not grant the lock")

    def release(self):
        self.cur.execute("SELECT RELEASE_LOCK(%s)", (self.name,))
        if self.cur.fetchone()[0] != 1:
            raise RuntimeError("RELEASE_LOCK: the lock was not held")


if __name__ == "__main__":
    peerlib.main(GetLock)
