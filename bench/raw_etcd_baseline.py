# Raw baseline for scripts/bench-store.sh etcd: what one acquire + release
# must send to etcd's JSON gateway, timed without the library.
import base64, json, re, socket, statistics, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = b""
def req(path, body):
    body = json.dumps(body)
    return ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path, len(body), body)).encode()
def read_one():
    global buf
    while True:
        i = buf.find(b"\r\n\r\n")
        if i >= 0:
            head = buf[:i].decode()
            if "chunked" in head.lower():
                j = buf.find(b"\r\n0\r\n\r\n", i)
                if j >= 0:
                    buf = buf[j + 7:]
                    return
            else:
                length = int(re.search(r"Content-Length: (\d+)", head, re.I).group(1))
                if len(buf) >= i + 4 + length:
                    buf = buf[i + 4 + length:]
                    return
        buf += s.recv(65536)
def b64(t): return base64.b64encode(t.encode()).decode()
samples = []
for k in range(n):
    lease = 1000000 + k
    key = b64("raw/m/%016x" % lease)
    t = time.perf_counter()
    s.sendall(req("/v3/lease/grant", {"ID": str(lease), "TTL": "3"}) +
              req("/v3/kv/txn", {"compare": [{"key": key, "target": "CREATE", "create_revision": "0"}],
                                 "success": [{"request_put": {"key": key, "value": b64("c"), "lease": str(lease)}}]}))
    read_one(); read_one()
    s.sendall(req("/v3/kv/range", {"key": b64("raw/m/"), "range_end": b64("raw/m0"), "limit": "1"}) +
              req("/v3/lease/revoke", {"ID": str(lease)}))
    read_one(); read_one()
    samples.append((time.perf_counter() - t) * 1e6)
samples.sort()
print("raw baseline (grant+put txn, range+revoke; 2 pipelined round trips, 3 writes): median %.1f us, p90 %.1f us"
      % (statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]))
