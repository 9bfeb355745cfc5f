#!/usr/bin/env python3
"""Redis's first read of a large value, by how the value was written (issue 47, session 36).

Writes N values of V bytes (SET, one connection, over plain TCP or TLS), then reads them back
as the remote tier's stream does (28 pipelined GETRANGEs of 1/28 of every value, over plain TCP
or TLS, a new connection) and prints the time to the first byte of each pipeline and the rate.
Found with it: values written over plain TCP are read 3-5x slower, the first time, than values
written over TLS, whichever transport reads them (docs/fleet.md, "Why TLS read faster").
Needs a redis-server with a plain port and, for tls, a TLS port and its CA file. Measuring: run
it under the bench lock (flock /tmp/mz-bench.lock nice -n -5 docs/evaluation/redis-first-read/redis_first_read.py ...).
"""
import argparse, os, socket, ssl, statistics, sys, time


def connect(port, tls, ca):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls:
        s = ssl.create_default_context(cafile=ca).wrap_socket(s, server_hostname="127.0.0.1")
    return s


def cmd(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True, help="the plain port")
    p.add_argument("--tls-port", type=int, help="the TLS port (for --write tls or --read tls)")
    p.add_argument("--ca-file", help="the TLS port's CA certificate")
    p.add_argument("--write", choices=["plain", "tls"], default="plain", help="how the values are SET")
    p.add_argument("--read", choices=["plain", "tls"], default="plain", help="how they are read")
    p.add_argument("--values", type=int, default=20)
    p.add_argument("--bytes", type=int, default=28 << 20)
    a = p.parse_args()
    if "tls" in (a.write, a.read) and not (a.tls_port and a.ca_file):
        p.error("tls needs --tls-port and --ca-file")
    port = {"plain": a.port, "tls": a.tls_port}
    layers, n, v = 28, a.values, a.bytes
    w = connect(port[a.write], a.write == "tls", a.ca_file)
    value = os.urandom(1 << 20) * (v >> 20) + os.urandom(v & ((1 << 20) - 1))
    for i in range(n):
        w.sendall(cmd("SET", "mz:firstread:%d" % i, value))
        if w.recv(16) != b"+OK\r\n":
            sys.exit("redis_first_read: SET failed")
    w.close()
    r = connect(port[a.read], a.read == "tls", a.ca_file)
    per = v // layers
    buf = memoryview(bytearray(n * (per + 32)))
    first, total = [], 0.0
    for l in range(layers):
        req = b"".join(cmd("GETRANGE", "mz:firstread:%d" % i, l * per, l * per + per - 1) for i in range(n))
        need = n * (len(b"$%d\r\n" % per) + per + 2)
        t0 = time.perf_counter()
        r.sendall(req)
        have, t1 = 0, None
        while have < need:
            got = r.recv_into(buf[have:], need - have)
            if got == 0:
                sys.exit("redis_first_read: the server closed the connection")
            t1 = t1 or time.perf_counter()
            have += got
        first.append((t1 - t0) * 1e3)
        total += time.perf_counter() - t0
    r.close()
    c = connect(a.port, False, None)
    c.sendall(b"".join(cmd("DEL", "mz:firstread:%d" % i) for i in range(n)))
    c.recv(4096)
    print("write %-5s read %-5s: first byte ms median %.1f (min %.1f max %.1f); %.2f GB/s"
          % (a.write, a.read, statistics.median(first), min(first), max(first), n * per * layers / total / 1e9))


if __name__ == "__main__":
    main()
