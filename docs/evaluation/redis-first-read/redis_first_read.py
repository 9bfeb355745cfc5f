#!/usr/bin/env python3
"""Redis's first read of a large value, by how the value was written (issue 47, session 36).

Writes N values of V bytes (SET, one connection, over plain TCP or TLS), then reads them back
as the remote tier's stream does (28 pipelined GETRANGEs of 1/28 of every value, over plain TCP
or TLS, a new connection) and prints the time to the first byte of each pipeline and the rate.
Found with it: values written over plain TCP are read 2-4x slower, the first time, than values
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


def server_cpu(port):
    """redis-server's CPU seconds so far (INFO cpu: used_cpu_sys + used_cpu_user)."""
    c = connect(port, False, None)
    c.sendall(cmd("INFO", "cpu"))
    text = b""
    while b"used_cpu_user_children" not in text:
        got = c.recv(65536)
        if not got:
            sys.exit("redis_first_read: INFO cpu: the server closed the connection")
        text += got
    c.close()
    f = dict(l.split(":", 1) for l in text.decode(errors="replace").splitlines() if ":" in l)
    return float(f["used_cpu_sys"]) + float(f["used_cpu_user"])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True, help="the plain port")
    p.add_argument("--tls-port", type=int, help="the TLS port (for --write tls or --read tls)")
    p.add_argument("--ca-file", help="the TLS port's CA certificate")
    p.add_argument("--write", choices=["plain", "tls", "append"], default="plain",
                   help="how the values are written: SET over plain TCP or TLS, or (append, plain TCP) SET of\nthe first 16 KiB and APPENDs of 16 KiB, one pipeline per value (below Redis's 32 KiB big-argument\nsize, so Redis copies each part in user space)")
    p.add_argument("--read", choices=["plain", "tls"], default="plain", help="how they are read")
    p.add_argument("--values", type=int, default=20)
    p.add_argument("--bytes", type=int, default=28 << 20)
    a = p.parse_args()
    if "tls" in (a.write, a.read) and not (a.tls_port and a.ca_file):
        p.error("tls needs --tls-port and --ca-file")
    port = {"plain": a.port, "tls": a.tls_port, "append": a.port}
    layers, n, v = 28, a.values, a.bytes
    w = connect(port[a.write], a.write == "tls", a.ca_file)
    value = os.urandom(1 << 20) * (v >> 20) + os.urandom(v & ((1 << 20) - 1))
    cw, tw = server_cpu(a.port), time.perf_counter()
    for i in range(n):
        key = "mz:firstread:%d" % i
        if a.write == "append":
            part = 16 << 10
            w.sendall(cmd("SET", key, value[:part]) +
                      b"".join(cmd("APPEND", key, value[o:o + part]) for o in range(part, v, part)))
            replies, want = b"", 1 + (v - 1) // part
            while replies.count(b"\r\n") < want:
                got = w.recv(1 << 20)
                if not got:
                    sys.exit("redis_first_read: the server closed the connection")
                replies += got
            if not replies.endswith(b":%d\r\n" % v):
                sys.exit("redis_first_read: APPEND failed: " + replies[-80:].decode(errors="replace"))
        else:
            w.sendall(cmd("SET", key, value))
            if w.recv(16) != b"+OK\r\n":
                sys.exit("redis_first_read: SET failed")
    tw, cw = time.perf_counter() - tw, server_cpu(a.port) - cw
    w.close()
    r = connect(port[a.read], a.read == "tls", a.ca_file)
    per = v // layers
    buf = memoryview(bytearray(n * (per + 32)))
    first, total, cr = [], 0.0, server_cpu(a.port)
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
    cr = server_cpu(a.port) - cr
    c = connect(a.port, False, None)
    c.sendall(b"".join(cmd("DEL", "mz:firstread:%d" % i) for i in range(n)))
    c.recv(4096)
    print("write %-6s read %-5s: writing %.2f GB/s (redis-server CPU %.2f s); first byte ms median %.1f (min %.1f max %.1f); %.2f GB/s (redis-server CPU %.2f s)"
          % (a.write, a.read, n * v / tw / 1e9, cw, statistics.median(first), min(first), max(first), n * per * layers / total / 1e9, cr))


if __name__ == "__main__":
    main()
