"""Peer: kazoo's kazoo.recipe.lock.Lock (Debian's python3-kazoo), with its
defaults: the ZooKeeper lock recipe (an ephemeral sequential node per
contender; a waiter watches the node ahead of it, so a release is pushed).
Worker of bench/peers/run.py (protocol in peerlib.py)."""

from urllib.parse import urlsplit

from kazoo.client import KazooClient

import peerlib


def open_lock(uri, key):
    client = KazooClient(hosts=urlsplit(uri).netloc)  # zookeeper://HOST:PORT
    client.start()
    return client.Lock("/bench-peers/" + key)


if __name__ == "__main__":
    peerlib.main(open_lock)
