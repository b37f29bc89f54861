"""Peer: redis-py's redis.lock.Lock (Debian's python3-redis), with its
defaults: no timeout (the key never expires), a blocked acquire() polls
SET NX every 0.1 s. Worker of bench/peers/run.py (protocol in peerlib.py)."""

import redis

import peerlib


def open_lock(uri, key):
    client = redis.Redis.from_url(uri)
    client.ping()  # connected before the worker says it is ready (redis-py connects lazily)
    return client.lock("bench-peers:" + key)


if __name__ == "__main__":
    peerlib.main(open_lock)
