#!/usr/bin/env python3
"""`mzcache serve` under abuse (issue 25), on loopback only, bounded in count and time.

Usage: serve_abuse.py PORT API_KEY SERVER_PID [--connections N]

Each case must leave the server alive, answering, and its memory bounded:
  - a slow client sending its request a byte at a time, while a normal request is served;
  - N connections (default 1000) opened and dropped: some at once, some after part of a request
    line, some after the headers of a body never sent; at most 2% may wait for a SYN retransmit
    (a listen backlog too small for the burst makes 1 in 10 wait);
  - garbage instead of HTTP;
  - a client that disconnects in the middle of a streamed reply (its conversation is released:
    the same history is then continued, not forked);
  - an oversized header block.
Prints one line per case and exits 1 on the first failure.
"""
import http.client
import json
import socket
import sys
import threading
import time

HOST = "127.0.0.1"


def fail(msg):
    print(f"FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def request(port, key, method, path, body=None, timeout=120):
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def healthy(port, key, what):
    status, data = request(port, key, "GET", "/health", timeout=30)
    if status != 200:
        fail(f"after {what}: /health answered {status}")
    status, data = request(port, key, "POST", "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 2, "temperature": 0})
    if status != 200:
        fail(f"after {what}: a chat request answered {status}: {data[:200]!r}")


def slow_client(port, key):
    body = json.dumps({"messages": [{"role": "user", "content": "slowly"}], "max_tokens": 2}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    result = {}

    def trickle():
        s = socket.create_connection((HOST, port), timeout=60)
        for b in head + body:
            s.sendall(bytes([b]))
            time.sleep(0.01)
        result["reply"] = s.recv(65536)
        s.close()

    t = threading.Thread(target=trickle)
    t.start()
    time.sleep(0.5)
    t0 = time.time()
    healthy(port, key, "a normal request during a slow client")
    served_during = time.time() - t0
    t.join(120)
    if t.is_alive():
        fail("the slow client was never answered")
    if not result.get("reply", b"").startswith(b"HTTP/1.1 200"):
        fail(f"the slow client's request got {result.get('reply', b'')[:80]!r}")
    print(f"ok: a slow client ({len(head) + len(body)} bytes, one per 10 ms) was answered; "
          f"a normal request meanwhile took {served_during:.2f} s")


def many_connections(port, key, pid, n):
    before = rss_kib(pid)
    t0 = time.time()
    retransmits = 0
    for i in range(n):
        t = time.time()
        s = socket.create_connection((HOST, port), timeout=10)
        # A connect that waited about a second had its SYN dropped (the listen backlog was full)
        # and sent again after the kernel's 1 s timer: a burst of clients would see the same wait.
        if time.time() - t > 0.9:
            retransmits += 1
        kind = i % 4
        if kind == 1:
            s.sendall(b"POST /v1/chat/comp")
        elif kind == 2:
            s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                      "Content-Length: 500\r\n\r\n{\"mess".encode())
        elif kind == 3:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        s.close()
    healthy(port, key, f"{n} dropped connections")
    # A backlog too small for the burst makes about 1 connection in 10 wait (httplib's default of 5:
    # 25 of 200). With a wide backlog a rare one may still wait when the accept thread is starved
    # of CPU on a loaded machine (1 of 1000 seen with the whole test suite running on 2 cores): the
    # check allows 2%.
    if retransmits > n // 50:
        fail(f"{retransmits} of {n} connections waited about 1 s to be accepted (listen backlog overflowed)")
    after = rss_kib(pid)
    grew = (after - before) / 1024
    if grew > 64:
        fail(f"RSS grew {grew:.1f} MiB over {n} dropped connections")
    print(f"ok: {n} connections opened and dropped in {time.time() - t0:.1f} s ({retransmits} waited for a retransmit); "
          f"RSS {before // 1024} -> {after // 1024} MiB")


def garbage(port, key):
    for junk in [b"\x00\xff\xfe garbage\r\n\r\n", b"GET " + b"A" * 20000 + b" HTTP/1.1\r\n\r\n",
                 b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                 b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]:
        s = socket.create_connection((HOST, port), timeout=30)
        s.sendall(junk)
        try:
            s.recv(4096)
        except (ConnectionResetError, socket.timeout):
            pass
        s.close()
    big = socket.create_connection((HOST, port), timeout=30)
    big.sendall(b"GET /health HTTP/1.1\r\n" + b"X-Big: " + b"b" * 100000 + b"\r\n\r\n")
    try:
        big.recv(4096)
    except (ConnectionResetError, BrokenPipeError, socket.timeout):
        pass
    big.close()
    healthy(port, key, "garbage requests")
    print("ok: garbage, an overlong request line, a negative length, bad chunking and a 100 kB header")


def disconnect_mid_stream(port, key):
    messages = [{"role": "user", "content": "a long story please"}]
    body = json.dumps({"messages": messages, "max_tokens": 200, "stream": True, "temperature": 0}).encode()
    s = socket.create_connection((HOST, port), timeout=120)
    s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    got = b""
    while b"data:" not in got:
        chunk = s.recv(4096)
        if not chunk:
            fail("the stream ended before its first event")
        got += chunk
    conv = None
    for line in got.split(b"\r\n"):
        if line.lower().startswith(b"x-mz-conversation:"):
            conv = line.split(b":", 1)[1].strip().decode()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()
    if not conv:
        fail("no X-Mz-Conversation header on the stream")
    # The turn stops at its next write and the conversation is released (not left busy).
    deadline = time.time() + 60
    while True:
        status, data = request(port, key, "GET", "/v1/mzcache/pool")
        convs = {c["id"]: c for c in json.loads(data)["conversations"]}
        if conv in convs and not convs[conv]["busy"] and convs[conv]["tokens"] > 0:
            break
        if time.time() > deadline:
            fail(f"conversation {conv} still busy 60 s after its client left")
        time.sleep(0.2)
    # The same history again continues that conversation.
    status, data = request(port, key, "POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 2, "temperature": 0})
    if status != 200:
        fail(f"after a disconnect mid-stream: {status}")
    again = json.loads(data)["mzcache"]["conversation"]
    if again != conv:
        fail(f"the history of a stream cut short went to {again}, not {conv}")
    print(f"ok: a client gone mid-stream: conversation {conv} released ({convs[conv]['tokens']} tokens kept) and continued")


def raw_exchange(port, data, half_close=False, timeout=30):
    """Sends data on a new connection (then shuts down writing if half_close) and reads until the
    server closes it or timeout: (bytes read, seconds until the close or the timeout)."""
    s = socket.create_connection((HOST, port), timeout=timeout)
    t0 = time.time()
    s.sendall(data)
    if half_close:
        s.shutdown(socket.SHUT_WR)
    got = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    s.close()
    return got, time.time() - t0


def post_bytes(key, body, path="/v1/chat/completions", extra=""):
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def half_close(port, key):
    # A complete request, then shutdown(SHUT_WR) (`nc -N`, `curl` uploads, some proxies): the
    # client still reads, so it gets its response.
    body = json.dumps({"messages": [{"role": "user", "content": "half"}], "max_tokens": 2, "temperature": 0}).encode()
    got, _ = raw_exchange(port, post_bytes(key, body), half_close=True, timeout=60)
    if not got.startswith(b"HTTP/1.1 200") or b'"choices"' not in got:
        fail(f"a request followed by a half-close got {got[:200]!r}, not its response")
    print("ok: a request followed by a half-close gets its response")


def bad_framing(port, key):
    # A negative length: 400 at once (not a wait for the read timeout, not 413).
    t0 = time.time()
    got, _ = raw_exchange(port, (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                                 "Content-Length: -5\r\n\r\n").encode(), timeout=30)
    took = time.time() - t0
    if not got.startswith(b"HTTP/1.1 400") or took > 2:
        fail(f"a negative Content-Length got {got[:120]!r} after {took:.1f} s, not an immediate 400")
    # Content-Length and Transfer-Encoding together (request smuggling's shape): 400, not served.
    body = json.dumps({"messages": [{"role": "user", "content": "smuggle"}], "max_tokens": 2}).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    got, _ = raw_exchange(port, (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                                 "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked, timeout=30)
    if not got.startswith(b"HTTP/1.1 400") or b'"choices"' in got:
        fail(f"a request with both Content-Length and Transfer-Encoding got {got[:120]!r}, not 400")
    print(f"ok: a negative Content-Length answered 400 in {took:.2f} s; Content-Length with chunked refused")


def pipelined(port, key):
    # Two requests in one write. Either both are answered in order, or the first response says
    # `Connection: close` and the connection closes right after it (the client then knows to send
    # the second again); never a silent wait for the keep-alive timeout.
    one = f"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode()
    two = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode()
    got, took = raw_exchange(port, one + two, timeout=30)
    n = got.count(b"HTTP/1.1 ")
    first_head = got.split(b"\r\n\r\n", 1)[0].lower()
    if n >= 2 and got.index(b'"status"') < got.index(b'"data"'):
        how = "both answered in order"
    elif n == 1 and b"connection: close" in first_head and took < 2:
        how = f"the first answered with Connection: close and the connection closed after {took:.2f} s"
    else:
        fail(f"pipelined requests: {n} responses in {took:.1f} s, first head {first_head[:200]!r}")
    print(f"ok: pipelined requests: {how}")


def resend_after_disconnect(port, key):
    # A client that drops a stream and resends the same history at once continues the released
    # conversation (the request waits briefly for the turn being cancelled), not a new one.
    messages = [{"role": "user", "content": "tell me everything about caches, at length"}]
    body = json.dumps({"messages": messages, "max_tokens": 200, "stream": True, "temperature": 0}).encode()
    first = json.dumps({"messages": messages, "max_tokens": 2, "temperature": 0}).encode()
    got, _ = raw_exchange(port, post_bytes(key, first), timeout=60)  # the conversation exists, idle
    conv = None
    for line in got.split(b"\r\n"):
        if line.lower().startswith(b"x-mz-conversation:"):
            conv = line.split(b":", 1)[1].strip().decode()
    if not conv:
        fail(f"no X-Mz-Conversation on the first turn: {got[:200]!r}")
    s = socket.create_connection((HOST, port), timeout=60)
    s.sendall(post_bytes(key, body))
    got = b""
    while got.count(b"data:") < 3:
        chunk = s.recv(4096)
        if not chunk:
            fail("the stream ended before its third event")
        got += chunk
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()
    got, _ = raw_exchange(port, post_bytes(key, first), timeout=60)
    again, cached = None, None
    for line in got.split(b"\r\n"):
        if line.lower().startswith(b"x-mz-conversation:"):
            again = line.split(b":", 1)[1].strip().decode()
    try:
        cached = json.loads(got.split(b"\r\n\r\n", 1)[1])["usage"]["prompt_tokens_details"]["cached_tokens"]
    except (ValueError, KeyError, IndexError):
        fail(f"the resent history got {got[:300]!r}")
    if again != conv or not cached:
        fail(f"the history resent right after a disconnect went to {again} with {cached} cached tokens, not {conv}")
    print(f"ok: the history resent at once after a disconnect continued {conv} ({cached} cached tokens)")


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        sys.exit(2)
    port, key, pid = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    n = 1000
    if "--connections" in sys.argv:
        n = int(sys.argv[sys.argv.index("--connections") + 1])
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    if only:  # --only a,b: just those cases (for a quick run by hand)
        for name in only:
            globals()[name](*([port, key, pid, n] if name == "many_connections" else [port, key]))
        print("serve_abuse: the cases asked for passed")
        return
    slow_client(port, key)
    many_connections(port, key, pid, n)
    garbage(port, key)
    disconnect_mid_stream(port, key)
    half_close(port, key)
    bad_framing(port, key)
    pipelined(port, key)
    resend_after_disconnect(port, key)
    print("serve_abuse: all cases passed")


if __name__ == "__main__":
    main()
