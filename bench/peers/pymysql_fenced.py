"""Floor, not a peer: PyMySQL's GET_LOCK (pymysql_get_lock.py) plus the
least a crash-safe fencing token costs: once the lock is held, one durable
transaction bumps a counter row (UPDATE, SELECT, COMMIT; InnoDB flushes it
with the server's innodb_flush_log_at_trx_commit). The release writes
nothing. What the SQL mutex could at best do on MySQL/MariaDB while its
tokens survive a crash of the server (docs/benchmarks.md, "The SQL mutex
against a lock with a durable token"). Worker of bench/peers/run.py
(protocol in peerlib.py)."""

import peerlib
from pymysql_get_lock import GetLock

TABLE = "bench_peer_tokens"


class FencedGetLock(GetLock):
    def __init__(self, uri, key):
        super().__init__(uri, key)
        self.cur.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} "
                         "(k varchar(128) PRIMARY KEY, t bigint NOT NULL) ENGINE=InnoDB")
        self.cur.execute(f"INSERT IGNORE INTO {TABLE} VALUES (%s, 0)", (self.name,))
        self.conn.commit()
        self.token = 0

    def acquire(self):
        super().acquire()
        self.cur.execute(f"UPDATE {TABLE} SET t = t + 1 WHERE k = %s", (self.name,))
        self.cur.execute(f"SELECT t FROM {TABLE} WHERE k = %s", (self.name,))
        self.token = peerlib.commit_token(self.conn, self.cur.fetchone()[0], self.token)


if __name__ == "__main__":
    peerlib.main(FencedGetLock)
