"""Floor, not a peer: psycopg2's advisory lock (psycopg2_advisory.py) plus
the least a crash-safe fencing token costs: once the lock is held, one
durable transaction bumps a counter row (UPDATE ... RETURNING, COMMIT with
the server's synchronous_commit). The release writes nothing. What the SQL
mutex could at best do on PostgreSQL while its tokens survive a crash of the
server (docs/benchmarks.md, "The SQL mutex against a lock with a durable
token"). Worker of bench/peers/run.py (protocol in peerlib.py)."""

import psycopg2

import peerlib
from psycopg2_advisory import AdvisoryLock

TABLE = "bench_peer_tokens"


class FencedAdvisoryLock(AdvisoryLock):
    def __init__(self, uri, key):
        super().__init__(uri, key)
        # The processes of a run start together: CREATE TABLE IF NOT EXISTS
        # can race (a duplicate pg_type row), and once more finds the table.
        for attempt in range(2):
            try:
                self.cur.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} "
                                 "(k bigint PRIMARY KEY, t bigint NOT NULL)")
                self.cur.execute(f"INSERT INTO {TABLE} VALUES (%s, 0) ON CONFLICT DO NOTHING",
                                 (self.key,))
                self.conn.commit()
                break
            except psycopg2.Error:
                self.conn.rollback()
                if attempt == 1:
                    raise
        self.token = 0

    def acquire(self):
        super().acquire()
        self.cur.execute(f"UPDATE {TABLE} SET t = t + 1 WHERE k = %s RETURNING t", (self.key,))
        self.token = peerlib.commit_token(self.conn, self.cur.fetchone()[0], self.token)


if __name__ == "__main__":
    peerlib.main(FencedAdvisoryLock)
