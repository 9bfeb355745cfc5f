#!/usr/bin/env python3
"""kill -9 of `mzcache serve` at random points of its turns and their persistence (issue 25).

Usage: serve_kill.py MZCACHE_CLI MODEL.gguf WORK_DIR [--kills N] [--seed S] [--conversations K] [--tol T]
                     [--replay-all] [--kill-at-once | --concurrent] [--perturb-reference | --perturb-replay]

A client holds K named conversations and sends turns to them (each turn resends the whole history,
as OpenAI clients do). After a random 0-600 ms, while turns run and the pool writes them behind,
the server is SIGKILLed 0-50 ms after a turn was sent, or, half of the time, 0-50 ms after the
first event of a streamed turn whose client then goes away (the server cancels it and commits what
it computed), and started again on
the same folder. Then, for every conversation:
  - the server lists it, and no stored file is reported damaged;
  - its stored token count is one the client saw acknowledged (the last acknowledged turn or the
    one before it: write-behind is at most one turn behind, so a conversation with one turn may
    not be stored yet), a prefix within the last acknowledged turn (write-behind saves between the
    calls of a turn), or the turn in flight, whole or in part: never less, never past what was
    computed;
  - the client's next turn continues it (cached_tokens covers what was stored) and succeeds, and
    its logprobs (every sampled token and its 3 alternatives, matched by token) must equal, bit for
    bit, those of a server that computed the same state in the same batches: a state reopened
    silently wrong (right length, wrong KV) would change them. ggml's matrix products are not
    batch-invariant (a row's result can depend on the batch's size; one flipped fp16 rounding of a
    KV element moved a logprob of this random-weight model by up to 0.165: docs/reliability.md,
    finding 8), so the witness must have computed the same batches:
    - the reference, a server that is never killed and gets every acknowledged turn too, is that
      witness for a conversation as long as no reopened state of it was behind its last
      acknowledged turn;
    - a state reopened behind the last acknowledged turn ("one turn behind", "within the last
      turn", "the turn in flight") makes the server compute the lost part again, in another batch
      than the reference did. Its witness is a replay: a new server on a new folder (nothing
      cached; in a shared folder, a conversation's first call may copy another's matching full
      256-token chunks, computed in other batches) given, in order, the requests that built the
      killed server's state of that conversation: each acknowledged turn up to the stored state,
      then the turn cut by the stored state (the last acknowledged one, or the one in flight) with
      max_tokens such that it stops where the stored state does (a turn is the prompt's decode,
      then one decode per sampled token but the last; the pool stores between two calls). The
      replay must reproduce every reply, prompt and token count on the way and hold exactly the
      stored count; then it gets the same next turn as the reopened server, and the two must agree
      bit for bit. The replay server then mirrors that conversation: it gets its every later turn,
      and is compared bit for bit with the server at every later restart (replaced by a new replay
      at a later state that is behind). The reference still gets those turns and is compared
      within --tol (default 0.5: gross damage only; a near tie, top two within --tol, may pick the
      other token, after which the rest of that reply is not compared).
    On a difference, a third server computes the same history from scratch, and the failure says
    which side equals it (a hint only: it computes in other batches again).
--kill-at-once sends the turns back to back (the reference and the mirrors get them after the kill,
in the same order, and the token count each turn left is read from its witness, which computed the
same tokens) and kills right after a turn is acknowledged, with no turn in flight: the writes lag
behind the turns, so states behind the last acknowledged turn become frequent (a stress test of
their check).
--concurrent: K clients at once, one thread per conversation sending its turns in order (so a
conversation has at most one turn in flight), and the server runs with --parallel K: the turns
generate together, batched in one forward pass (continuous batching). Half of the kills come at the
random deadline wherever the clients' turns are (several cut in the server's batches); in the other
half the clients stop at the deadline, each sends one more turn at the same moment and leaves it in
flight (half of them streamed, the client gone after the first event: cancelled beside the others in
the batch), and the kill comes 0-50 ms after the last was sent. Each client reads its conversation's
token count after each acknowledged turn when the kill lets it; the witnesses (the reference, the
mirrors) get the acknowledged turns after the kill, one at a time in the order they were
acknowledged, must reply the same and give the same count (the count a kill kept the client from
reading). Then every conversation is checked exactly as above, its own turn in flight, if any, being
"the turn in flight". Batch composition: the witnesses, and the replays, compute alone what the
killed server computed in batches with other conversations' turns (a prompt possibly in slices
beside other turns' decodes), so "the same batches" above holds only per conversation. The
comparisons stay bit for bit (and --tol only for the reference out of step, as above) because
batched equals alone, bit for bit, on this machine (AMD EPYC, tiny-qwen3 q8_0, 1 thread;
tests/test_batch.cpp measures KL 0 for batches of 1-8). Measured in this mode (2026-12-06, 170 kills
over 6 runs: 4 and 8 clients, --replay-all, and two with the server's prompts in fixed 8- and
11-token slices beside the decodes, --prefill-slice 8 or 11 --itl-factor 0; 872 reopened states, 330
behind the last turn): max difference 0 over 2622 tokens' logprobs compared bit for bit and 2475
within --tol, and the witness in step repeated every one of the 2982 acknowledged replies and every
token count the clients read. Were batching not exact (another machine, other kernels), a state
reopened right would fail in this mode as in Finding 8 (docs/reliability.md): the comparisons where
the batch composition differs would then need --tol, sized from measured differences.
--replay-all replays every reopened state, those at the last acknowledged turn too: there the
replay and the reference must both equal the reopened server bit for bit (a check of the replay).
--perturb-reference and --perturb-replay are the negative controls: the reference, or every replay
(this implies --replay-all), gets the history with one word of its system message changed, and the
run must see the difference in a bit-for-bit comparison with that side (exit 0 when it does, 1 when
not).
Prints a table of kills, reopened states by outcome and how the states behind were checked; exits 1
on the first violation. Loopback only; every wait is bounded.
"""
import glob
import http.client
import json
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time


SERVERS = []  # every server started, killed on failure so that none outlives the harness


def fail(msg):
    print(f"serve_kill: FAILED: {msg}", file=sys.stderr)
    for s in SERVERS:
        if s.proc is not None and s.proc.poll() is None:
            s.proc.kill()
    sys.exit(1)


class Server:
    parallel = 2  # turns generating at once (--concurrent: one per conversation, batched together)

    def __init__(self, cli, model, work):
        self.cli, self.model, self.work = cli, model, work
        self.proc = None
        self.port = None
        os.makedirs(work, exist_ok=True)
        SERVERS.append(self)

    def start(self):
        pf = os.path.join(self.work, "port")
        if os.path.exists(pf):
            os.remove(pf)
        log = open(os.path.join(self.work, "server.log"), "a")
        self.proc = subprocess.Popen([self.cli, "serve", "-m", self.model, "--port", "0", "--port-file", pf,
                                      "--pool-dir", os.path.join(self.work, "pool"), "--persist-codec", "none",
                                      "--kv-codec", "none", "-c", "4096", "--max-tokens", "8", "-t", "1",
                                      "--parallel", str(self.parallel), "--no-watch-pressure"], stdout=log, stderr=log)
        deadline = time.time() + 120
        while not (os.path.exists(pf) and os.path.getsize(pf) > 0):
            if self.proc.poll() is not None:
                fail(f"the server exited at start (see {self.work}/server.log)")
            if time.time() > deadline:
                fail(f"the server did not listen within 120 s ({self.work})")
            time.sleep(0.05)
        self.port = int(open(pf).read())

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def retire(self):
        """Kills the server and removes its folder (a replay that is no longer needed)."""
        self.kill()
        SERVERS.remove(self)
        subprocess.run(["rm", "-rf", self.work])

    def call(self, method, path, body=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request(method, path, body=json.dumps(body) if body is not None else None)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, json.loads(data) if data else None


def leave_mid_stream(port, body):
    """Sends body (a streamed request), reads up to its first event and resets the connection: a
    client gone mid-stream."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
    got = b""
    try:
        while b"data:" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass  # no event within the timeout (an error answer, say): the kill comes anyway
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, not a FIN
    s.close()


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        sys.exit(2)
    cli, model, work = sys.argv[1:4]
    if os.environ.get("MZ_TEST_MODEL_DIR_OVERRIDE"):  # the sanitizer stages share the normal build's models
        model = os.path.join(os.environ["MZ_TEST_MODEL_DIR_OVERRIDE"], os.path.basename(model))
    opt = lambda name, d: int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else d
    kills, seed, k = opt("--kills", 20), opt("--seed", 1), opt("--conversations", 3)
    tol = float(sys.argv[sys.argv.index("--tol") + 1]) if "--tol" in sys.argv else 0.5
    perturb_ref = "--perturb-reference" in sys.argv
    perturb_replay = "--perturb-replay" in sys.argv
    replay_all = "--replay-all" in sys.argv or perturb_replay
    at_once = "--kill-at-once" in sys.argv
    concurrent = "--concurrent" in sys.argv
    if concurrent and at_once:
        print("serve_kill: --concurrent and --kill-at-once exclude each other", file=sys.stderr)
        sys.exit(2)
    if concurrent:
        Server.parallel = max(2, k)  # every conversation's turn generates at once, in the same batches
    rng = random.Random(seed)
    os.makedirs(work, exist_ok=True)
    for old in [os.path.join(work, "pool"), os.path.join(work, "ref")] + glob.glob(os.path.join(work, "replay-*")):
        shutil.rmtree(old, ignore_errors=True)
    srv = Server(cli, model, work)
    srv.start()
    ref = Server(cli, model, os.path.join(work, "ref"))  # never killed: the logprobs to compare with
    ref.start()
    # Bit-for-bit comparisons (diff, compared: must stay 0 difference) and those within --tol with a
    # reference that computed the conversation in other batches (diff_tol, compared_tol).
    stats = {"diff": 0.0, "compared": 0, "diff_tol": 0.0, "compared_tol": 0, "ties": 0, "ref_exact": 0,
             "ref_tol": 0, "behind_exact": 0, "latest_replayed": 0, "mirror_exact": 0, "replays": 0,
             "replayed_turns": 0, "replay_s": 0.0, "cuts": {}, "sent": 0, "sent_beside": 0, "in_flight_max": 0,
             "computing_at_deadline": {}, "computing_at_kill": {}}

    def perturbed(body):
        """body with one word of its system message changed (the negative controls)."""
        b = json.loads(json.dumps(body))
        b["messages"][0]["content"] = b["messages"][0]["content"].replace("conversation", "chat")
        return b

    def differ(msg, side, body, got, want):
        """A comparison with side ("reference", "replay" or "mirror") failed: fails (or, in a negative
        control of that side, ends the run successfully)."""
        if (perturb_ref and side == "reference") or (perturb_replay and side == "replay"):
            print(f"serve_kill: negative control: the perturbed {side} was told apart ({msg})")
            for s in SERVERS:
                if s.proc is not None and s.proc.poll() is None:
                    s.kill()
            sys.exit(0)
        # Which side is off: a third server computes the same history from scratch (a new
        # conversation, nothing cached of it). It computes in other batches again, so this is a
        # hint (finding 8), not a verdict: a state that is right usually equals it exactly.
        scratch = Server(cli, model, os.path.join(work, "scratch"))
        subprocess.run(["rm", "-rf", os.path.join(work, "scratch", "pool")])
        scratch.start()
        status, rs = scratch.call("POST", "/v1/chat/completions", dict(body, conversation="from-scratch"))
        scratch.kill()
        if status == 200:
            lp = lambda r: [x["logprob"] for x in r["choices"][0]["logprobs"]["content"]]
            s, g, w = lp(rs), lp(got), lp(want)
            which = ("the reopened server matches it exactly and the " + side + " does not" if g == s and w != s
                     else "the " + side + " matches it exactly and the reopened server does not" if w == s and g != s
                     else "neither matches it exactly")
            msg += f"; computed from scratch: {s} ({which}; reopened {g}, {side} {w})"
        fail(msg)

    def same_logprobs(kill, conv, body, got, want, tol, side):
        """Fails unless the two replies' logprobs agree: bit for bit when tol is 0, else within tol
        (see the module's docstring)."""
        a = got["choices"][0]["logprobs"]["content"]
        b = want["choices"][0]["logprobs"]["content"]
        what = f"the {side}" if side != "reference" else "the never-killed reference"
        for i, (x, y) in enumerate(zip(a, b)):
            if x["token"] != y["token"]:
                top = y["top_logprobs"]
                if tol > 0 and len(top) >= 2 and abs(top[0]["logprob"] - top[1]["logprob"]) <= tol:
                    stats["ties"] += 1
                    return
                differ(f"kill {kill}: {conv} after restart sampled {x['token']!r} at token {i}, {what} "
                       f"{y['token']!r}: the reopened state is not the one stored", side, body, got, want)
            # Alternatives are compared token by token (two near-tied alternatives may be listed in
            # either order): each token both lists hold.
            theirs = {q["token"]: q["logprob"] for q in y["top_logprobs"]}
            pairs = [(x["logprob"], y["logprob"])] + [(p["logprob"], theirs[p["token"]]) for p in x["top_logprobs"]
                                                      if p["token"] in theirs]
            for u, v in pairs:
                d = abs(u - v)
                key = "diff" if tol == 0 else "diff_tol"
                stats[key] = max(stats[key], d)
                if d > tol:
                    differ(f"kill {kill}: {conv} after restart: logprob {u} vs {what}'s {v} at token {i}", side, body,
                           got, want)
            stats["compared" if tol == 0 else "compared_tol"] += 1
        if len(a) != len(b):
            differ(f"kill {kill}: {conv} after restart: {len(a)} tokens, {what} {len(b)}", side, body, got, want)

    def replay(kill, label, steps_c, body, got):
        """The witness of a state the reference did not compute in the same batches: a new server on a
        new folder gets steps_c's requests in order (each must reproduce the killed server's prompt
        tokens, reply and token count, or only the count for a turn cut short), then body, whose
        logprobs must equal got's bit for bit. Returns the replay server, which holds the conversation
        in the same state as the reopened server. label: the conversation and its outcome."""
        conv = body["conversation"]
        stats["replays"] += 1
        t = time.time()
        rs = Server(cli, model, os.path.join(work, f"replay-{stats['replays']}"))
        subprocess.run(["rm", "-rf", os.path.join(rs.work, "pool")])
        rs.start()
        for i, st in enumerate(steps_c):
            status, rr = rs.call("POST", "/v1/chat/completions", perturbed(st["body"]) if perturb_replay else st["body"])
            if status != 200:
                fail(f"kill {kill}: the replay of {label}, request {i + 1} of {len(steps_c)}: HTTP {status}: {rr}")
            if perturb_replay:
                continue  # its replies differ (another history): checked by the comparison below
            _, pool = rs.call("GET", "/v1/mzcache/pool")
            held = {x["id"]: x["tokens"] for x in pool["conversations"]}.get(conv)
            reply = rr["choices"][0]["message"]["content"]
            if (rr["usage"]["prompt_tokens"] != st["prompt"] or held != st["count"]
                    or (st["reply"] is not None and reply != st["reply"])):
                fail(f"kill {kill}: the replay of {label} did not reproduce request {i + 1} of {len(steps_c)} "
                     f"(max_tokens {st['body']['max_tokens']}): prompt {rr['usage']['prompt_tokens']} tokens, reply "
                     f"{reply!r}, holding {held}; the killed server: prompt {st['prompt']}, reply {st['reply']!r}, "
                     f"holding {st['count']} (see {rs.work})")
        status, rr = rs.call("POST", "/v1/chat/completions", perturbed(body) if perturb_replay else body)
        if status != 200:
            fail(f"kill {kill}: the replay's turn on {label}: HTTP {status}: {rr}")
        stats["replayed_turns"] += len(steps_c) + 1
        stats["replay_s"] += time.time() - t
        json.dump({"steps": [st["body"] for st in steps_c], "compared": body},
                  open(os.path.join(work, "last-replay.json"), "w"))
        same_logprobs(kill, label, body, got, rr, 0.0, "replay")
        return rs

    def witness_turn(c, body0, reply):
        """The reference gets every acknowledged turn too, so that it computes each in the same batches
        as the server: while it did for c (no mirror), the same state gives the same reply; a mirror
        gets it too."""
        status, rr = ref.call("POST", "/v1/chat/completions", body0)
        if status != 200:
            fail(f"the reference's turn on {c}: HTTP {status}: {rr}")
        if c not in mirror and rr["choices"][0]["message"]["content"] != reply:
            fail(f"{c}: the reference, computing the same turns in the same batches, replied "
                 f"{rr['choices'][0]['message']['content']!r}, the server {reply!r}")
        if c in mirror:
            status, rm = mirror[c].call("POST", "/v1/chat/completions", body0)
            if status != 200:
                fail(f"the mirror's turn on {c}: HTTP {status}: {rm}")
            if rm["choices"][0]["message"]["content"] != reply:
                fail(f"{c}: its mirror (a replay computing the same turns in the same batches) replied "
                     f"{rm['choices'][0]['message']['content']!r}, the server {reply!r}")

    def concurrent_round(kill, deadline):
        """--concurrent: one client thread per conversation sends its turns, in order, all at once (the
        server batches the turns generating together). Half of the kills come at the deadline, with
        the clients' turns running wherever they are (each conversation's turn in flight is cut in
        the server's batches; a client whose connection breaks ends, its turn in flight); the other
        half, the clients stop at the deadline, then send one more turn each at the same moment and
        leave it in flight, half of the time streamed with its client gone after the first event
        (cancelled beside the others in the batch), and the kill comes 0-50 ms after the last of
        them was sent. The witnesses get the acknowledged turns after the kill, one at a time, in
        the order they were acknowledged (each conversation's in its own order), must reply the same,
        and give the token count each turn left, which must equal the server's when the client
        could read it. Returns the turn each conversation had in flight."""
        convs = sorted(msgs)
        plans = {c: random.Random(rng.random()) for c in convs}  # each client's own choices
        at_deadline = rng.random() < 0.5
        lock = threading.Lock()
        killing = threading.Event()  # set just before the kill: a connection broken before it is a failure
        together = threading.Barrier(len(convs))  # the turns left in flight start at the same moment
        acked, errors = [], []
        finals = {}  # c: (its turn in flight, its connection to close after the kill)
        busy = [0]  # turns awaited from the server right now (what the clients see of its batches)

        def send():
            with lock:
                busy[0] += 1
                stats["sent"] += 1
                stats["sent_beside"] += busy[0] - 1
                stats["in_flight_max"] = max(stats["in_flight_max"], busy[0])

        def client(c):
            body0 = None
            try:
                while (not killing.is_set()) if at_deadline else time.time() < deadline:
                    turn = msgs[c] + [{"role": "user", "content": f"turn {nturn(c)} of {c}"}]
                    body0 = {"messages": turn, "max_tokens": 3, "temperature": 0, "conversation": c}
                    send()
                    try:
                        status, r = srv.call("POST", "/v1/chat/completions", body0)
                    finally:
                        with lock:
                            busy[0] -= 1
                    if status != 200:
                        raise RuntimeError(f"turn on {c}: HTTP {status}: {r}")
                    reply = r["choices"][0]["message"]["content"]
                    msgs[c] = turn + [{"role": "assistant", "content": reply}]
                    step = {"body": body0, "prompt": r["usage"]["prompt_tokens"], "reply": reply, "count": None}
                    body0 = None  # acknowledged: no turn in flight
                    steps[c].append(step)
                    prompts[c].append(step["prompt"])
                    with lock:
                        acked.append((c, reply, step))
                    _, pool = srv.call("GET", "/v1/mzcache/pool")
                    step["count"] = {x["id"]: x["tokens"] for x in pool["conversations"]}[c]
                if at_deadline:
                    return  # (the turn in flight was killed, or never sent: killing was set)
                # The turn left in flight (as the one-client mode's, below), sent by every client at once.
                together.wait(timeout=120)
                turn = msgs[c] + [{"role": "user", "content": f"turn {nturn(c)} of {c}"}]
                stream = plans[c].random() < 0.5
                body = {"messages": turn, "max_tokens": 8 if stream else 3, "temperature": 0, "conversation": c}
                conn = None
                if stream:
                    leave_mid_stream(srv.port, dict(body, stream=True))
                else:
                    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
                    conn.request("POST", "/v1/chat/completions", json.dumps(body))
                with lock:
                    finals[c] = (body, conn)
            except (OSError, http.client.HTTPException) as e:
                if at_deadline and killing.is_set():  # the kill broke the connection
                    if body0 is not None:
                        with lock:
                            finals[c] = (body0, None)
                    return
                with lock:
                    errors.append(f"{c}: {e!r}")
                together.abort()
            except Exception as e:  # reported by the main thread (fail() exits only its own thread)
                with lock:
                    errors.append(f"{c}: {e!r}")
                together.abort()

        threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in convs]
        for t in threads:
            t.start()
        if at_deadline:
            time.sleep(max(0.0, deadline - time.time()))
            with lock:
                computing = busy[0]  # the clients' turns unanswered at the kill
            killing.set()
            srv.kill()
            stats["computing_at_deadline"][computing] = stats["computing_at_deadline"].get(computing, 0) + 1
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.time()) + 120)
        if any(t.is_alive() for t in threads):
            fail(f"kill {kill}: a client did not end its turns within 120 s of the deadline")
        if errors:
            fail(f"kill {kill}: {errors}")
        if not at_deadline:
            time.sleep(rng.uniform(0.0, 0.05))
            # The turns still computing at the kill: those left in flight unstreamed whose answer has
            # not come (the streamed ones were cancelled after their first event).
            computing = sum(1 for _, conn in finals.values()
                            if conn is not None and not select.select([conn.sock], [], [], 0)[0])
            srv.kill()
            stats["computing_at_kill"][computing] = stats["computing_at_kill"].get(computing, 0) + 1
            for _, conn in finals.values():
                if conn is not None:
                    conn.close()
        for c, reply, step in acked:
            witness_turn(c, step["body"], reply)
            w = mirror.get(c, ref)
            _, pool = w.call("GET", "/v1/mzcache/pool")
            held = {x["id"]: x["tokens"] for x in pool["conversations"]}.get(c)
            if step["count"] is not None and held != step["count"]:
                fail(f"kill {kill}: {c} held {step['count']} tokens after a turn, its witness {held}")
            step["count"] = held  # (None: the kill came before the client read it)
        for c in convs:
            counts[c] = [0] + [st["count"] for st in steps[c]]
        return {c: body for c, (body, conn) in finals.items()}

    # Per conversation: the messages acknowledged, and the token counts the pool reported after each
    # acknowledged turn (index = turns acknowledged).
    msgs = {f"k{i}": [{"role": "system", "content": f"conversation {i}"}] for i in range(k)}
    nturn = lambda c: (len(msgs[c]) - 1) // 2 + 1  # the number of c's next turn, as its client counts
    counts = {c: [0] for c in msgs}
    prompts = {c: [0] for c in msgs}  # prompt tokens of each acknowledged turn (its reply follows them)
    # steps[c]: the requests that built the server's state of c, in order (an acknowledged turn, or
    # one cut short by a reopened state), each with the prompt tokens, reply and token count it gave:
    # what a replay sends. counts[c] and prompts[c] follow them ([0] + theirs): they are the states
    # the server's c went through, which a reopened state that was behind rewrites.
    steps = {c: [] for c in msgs}
    # mirror[c]: a replay server holding c in the same batches as the server, once a reopened state of
    # c was behind its last acknowledged turn (the reference then computed c in other batches). It
    # gets c's every later turn and is c's bit-for-bit witness (a new replay replaces it at c's next
    # state that is behind); the reference stays compared within --tol. Without a mirror, the
    # reference is c's bit-for-bit witness. So c is not retired after a state behind (as it was
    # when such a state was only checked within --tol): conversations keep growing to 3000 tokens,
    # across chunks, under an exact check.
    mirror = {}
    outcomes = {"latest": 0, "one behind": 0, "mid-turn": 0, "in flight": 0}
    t0 = time.time()
    for kill in range(kills):
        deadline = time.time() + rng.uniform(0.0, 0.6)
        inflight = {}
        # A conversation near the context's end (4096) is retired for a new one: the harness tests
        # kills, not the context limit (a 400 context_length_exceeded there is correct).
        for old in [x for x in msgs if counts[x][-1] > 3000]:
            base, _, gen = old.partition(".")
            new = f"{base}.{int(gen or 0) + 1}"
            msgs[new], counts[new], prompts[new] = [{"role": "system", "content": f"conversation {new}"}], [0], [0]
            steps[new] = []
            del msgs[old], counts[old], prompts[old], steps[old]
            if old in mirror:
                mirror.pop(old).retire()
        killed = False
        later = []  # with --kill-at-once: the turns the witnesses get after the kill
        while not concurrent:
            c = rng.choice(sorted(msgs))
            turn = msgs[c] + [{"role": "user", "content": f"turn {nturn(c)} of {c}"}]
            inflight[c] = turn
            if time.time() >= deadline and not at_once:
                break  # killed while this turn is sent (below), or right after it
            body0 = {"messages": turn, "max_tokens": 3, "temperature": 0, "conversation": c}
            status, r = srv.call("POST", "/v1/chat/completions", body0)
            if status != 200:
                fail(f"turn on {c}: HTTP {status}: {r}")
            if at_once and time.time() >= deadline:
                srv.kill()  # right after the acknowledgment: the turn's write has most likely not ended
                killed = True
            reply = r["choices"][0]["message"]["content"]
            msgs[c] = turn + [{"role": "assistant", "content": reply}]
            step = {"body": body0, "prompt": r["usage"]["prompt_tokens"], "reply": reply, "count": None}
            steps[c].append(step)
            prompts[c].append(step["prompt"])
            inflight.pop(c)
            if not at_once:
                _, pool = srv.call("GET", "/v1/mzcache/pool")
                step["count"] = {x["id"]: x["tokens"] for x in pool["conversations"]}[c]
                counts[c].append(step["count"])
                witness_turn(c, body0, reply)
                continue
            # Back to back (nothing between the turns, not even the pool's report): the writes lag
            # behind the turns.
            later.append((c, body0, reply, step))
            if killed:
                # The witnesses get the same turns in the same order, and the token count each turn
                # left is read from its witness: it computed the same tokens (the same reply).
                for c2, b, rep, st in later:
                    witness_turn(c2, b, rep)
                    _, pool = mirror.get(c2, ref).call("GET", "/v1/mzcache/pool")
                    st["count"] = {x["id"]: x["tokens"] for x in pool["conversations"]}[c2]
                for c2 in {w[0] for w in later}:
                    counts[c2] = [0] + [st["count"] for st in steps[c2]]
                c = None  # no turn in flight
                break
        if not killed and not concurrent:
            # Kill during a turn in flight: send it and kill without waiting for the answer. Half
            # of the time it is streamed and its client goes away after the first event: the server
            # cancels the turn at its next token and commits what it computed, so the turn's write
            # may hold a part of it (the prompt, and a token or more): a state within a turn,
            # which the pool's writer, taking a conversation between two calls, rarely makes.
            c = next(iter(inflight))
            stream = rng.random() < 0.5
            inflight_body = {"messages": inflight[c], "max_tokens": 8 if stream else 3, "temperature": 0,
                             "conversation": c}
            if stream:
                leave_mid_stream(srv.port, dict(inflight_body, stream=True))
            else:
                conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
                conn.request("POST", "/v1/chat/completions", json.dumps(inflight_body))
            time.sleep(rng.uniform(0.0, 0.05))
            srv.kill()
            if not stream:
                conn.close()
        if concurrent:
            inflight_bodies = concurrent_round(kill, deadline)
        else:
            inflight_bodies = {} if killed else {c: inflight_body}  # the turn cut by the kill, by conversation
        srv.start()
        _, pool = srv.call("GET", "/v1/mzcache/pool")
        if pool["damaged_files"]:
            fail(f"kill {kill}: damaged files after a restart: {pool['damaged_files']}")
        listed = {x["id"]: x for x in pool["conversations"]}
        for conv, seen in counts.items():
            acked = len(seen) - 1
            if acked == 0:
                continue
            if conv not in listed and acked > 1:
                fail(f"kill {kill}: conversation {conv} ({acked} turns acknowledged) lost")
            stored = listed[conv]["tokens"] if conv in listed else 0  # absent: its first turn not yet written
            if stored == seen[acked]:
                outcome = "latest"
                j = acked
            elif acked >= 1 and stored == seen[acked - 1]:
                outcome = "one behind"
                j = acked - 1
            elif acked >= 1 and seen[acked - 1] < stored < seen[acked]:
                # The pool's write-behind saves a conversation between two calls of a turn (a turn
                # is restore_generate then one decode per token): a prefix of the last acknowledged
                # turn, never past it (found by this harness; docs/pool.md).
                outcome = "mid-turn"
                j = acked - 1
            elif conv in inflight_bodies and stored > seen[acked]:
                outcome = "in flight"  # the turn cut by the kill was persisted, whole or in part
                j = acked
            else:
                fail(f"kill {kill}: {conv} holds {stored} tokens; acknowledged turns gave {seen[-3:]}")
            outcomes[outcome] += 1
            behind = outcome != "latest"  # the server computes part of c again, in batches of its own
            # The client carries on from what it has: the stored part is not computed again.
            turn = msgs[conv] + [{"role": "user", "content": f"turn {nturn(conv)} of {conv}"}]
            body = {"messages": turn, "max_tokens": 3, "temperature": 0, "conversation": conv, "logprobs": True,
                    "top_logprobs": 3}
            status, r = srv.call("POST", "/v1/chat/completions", body)
            if status != 200:
                fail(f"kill {kill}: turn on {conv} after restart: HTTP {status}: {r}")
            status, rr = ref.call("POST", "/v1/chat/completions", perturbed(body) if perturb_ref else body)
            if status != 200:
                fail(f"kill {kill}: the reference's turn on {conv}: HTTP {status}: {rr}")
            # Kept for the investigation of a failure: the last request compared.
            json.dump(body, open(os.path.join(work, "last-compared-request.json"), "w"))
            # The reference is the bit-for-bit witness while it computed conv in the same batches;
            # the negative control compares it bit for bit (a changed word must always be seen).
            bitwise = (conv not in mirror and not behind) or perturb_ref
            same_logprobs(kill, conv, body, r, rr, 0.0 if bitwise else tol, "reference")
            stats["ref_exact" if bitwise else "ref_tol"] += 1
            # Everything up to the stored turn's prompt is the same tokens in the resent history (the
            # reply after it may tokenize differently): at least that is not computed again.
            cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            if j > 0 and cached < prompts[conv][j] - 1:
                fail(f"kill {kill}: {conv} after restart computed its stored history again (cached {cached}, "
                     f"stored {stored}, turn {j}'s prompt {prompts[conv][j]})")
            if behind or replay_all:
                # The requests that built the stored state: the acknowledged turns up to it, and the
                # turn it cuts with max_tokens m such that the turn stops there (a turn holds its
                # prompt P after its first call, then one more token per decode: P + m - 1).
                cut = None
                if outcome == "latest":
                    kept = steps[conv]
                elif outcome == "one behind":
                    kept = steps[conv][:acked - 1]
                elif outcome == "mid-turn":
                    kept, cut = steps[conv][:acked - 1], dict(steps[conv][acked - 1]["body"])
                    p = prompts[conv][acked]
                else:  # in flight: the request cut by the kill, whose messages the client resent now
                    inflight_body = inflight_bodies[conv]
                    if inflight_body["messages"] != turn:
                        fail(f"kill {kill}: {conv}: the turn after restart is not the one in flight")
                    kept, cut, p = steps[conv], dict(inflight_body), r["usage"]["prompt_tokens"]
                if cut is not None:
                    cut.pop("stream", None)
                    m = stored - p + 1
                    if not 1 <= m <= cut["max_tokens"]:
                        fail(f"kill {kill}: {conv} holds {stored} tokens, not a state of its turn of prompt {p} "
                             f"(acknowledged turns gave {seen[-3:]})")
                    cut["max_tokens"] = m
                    stats["cuts"][f"{outcome} m={m}"] = stats["cuts"].get(f"{outcome} m={m}", 0) + 1
                    kept = kept + [{"body": cut, "prompt": p, "reply": None, "count": stored}]
                rs = replay(kill, f"{conv} ({outcome})", kept, body, r)
                stats["behind_exact" if behind else "latest_replayed"] += 1
                if behind or conv in mirror:
                    if conv in mirror:
                        mirror[conv].retire()
                    mirror[conv] = rs
                else:
                    rs.retire()  # the reference stays conv's witness
                steps[conv] = kept
                counts[conv] = [0] + [st["count"] for st in kept]
                prompts[conv] = [0] + [st["prompt"] for st in kept]
            elif conv in mirror:
                status, rm = mirror[conv].call("POST", "/v1/chat/completions", body)
                if status != 200:
                    fail(f"kill {kill}: the mirror's turn on {conv}: HTTP {status}: {rm}")
                same_logprobs(kill, conv, body, r, rm, 0.0, "mirror")
                stats["mirror_exact"] += 1
            reply = r["choices"][0]["message"]["content"]
            msgs[conv] = turn + [{"role": "assistant", "content": reply}]
            _, p2 = srv.call("GET", "/v1/mzcache/pool")
            held = {x["id"]: x["tokens"] for x in p2["conversations"]}[conv]
            if conv in mirror:
                _, pm = mirror[conv].call("GET", "/v1/mzcache/pool")
                if {x["id"]: x["tokens"] for x in pm["conversations"]}.get(conv) != held:
                    fail(f"kill {kill}: {conv} holds {held} tokens after its turn, its mirror {pm['conversations']}")
            counts[conv].append(held)
            prompts[conv].append(r["usage"]["prompt_tokens"])
            steps[conv].append({"body": body, "prompt": r["usage"]["prompt_tokens"], "reply": reply, "count": held})
        print(f"serve_kill: kill {kill + 1}/{kills}: {outcomes}, {stats['behind_exact']} behind replayed",
              file=sys.stderr)
    for s in list(SERVERS):
        s.kill()
    if perturb_ref or perturb_replay:
        fail(f"negative control: the perturbed {'reference' if perturb_ref else 'replay'}'s logprobs were not "
             f"told apart ({stats['replays']} replays)")
    n = sum(outcomes.values())
    behind = n - outcomes["latest"]
    print(f"| kills | reopened states | latest | one turn behind | within the last turn | the turn in flight "
          f"| behind, checked bit for bit | behind, within tolerance only | failures |")
    print(f"|---|---|---|---|---|---|---|---|---|")
    print(f"| {kills} | {n} | {outcomes['latest']} | {outcomes['one behind']} | {outcomes['mid-turn']} "
          f"| {outcomes['in flight']} | {stats['behind_exact']} | {behind - stats['behind_exact']} | 0 |")
    print(f"serve_kill: {kills} kills in {time.time() - t0:.0f} s, every state the old or the new one; replies "
          f"after restart compared bit for bit: {stats['ref_exact']} with the reference "
          f"({'in step; it computed alone what the server batched' if concurrent else 'same batches'}), "
          f"{stats['behind_exact']} with a replay of a state behind the last turn, {stats['mirror_exact']} with a "
          f"replay mirroring a conversation after such a state, {stats['latest_replayed']} with a replay of a state "
          f"at the last turn too (--replay-all): {stats['compared']} tokens' logprobs, max difference "
          f"{stats['diff']:.3g}; {stats['ref_tol']} also with the reference out of step, within tolerance {tol:g} "
          f"({stats['compared_tol']} tokens, max difference {stats['diff_tol']:.3g}, {stats['ties']} near ties); "
          f"{stats['replays']} replays of {stats['replayed_turns']} requests in {stats['replay_s']:.0f} s; the turns they "
          f"cut (max_tokens m: the state holds the prompt and m - 1 tokens): {dict(sorted(stats['cuts'].items()))}")
    if concurrent:
        print(f"serve_kill: --concurrent: {k} clients at once sent {stats['sent']} acknowledged turns, each beside "
              f"{stats['sent_beside'] / max(1, stats['sent']):.2f} others awaited from the server on average (at most "
              f"{stats['in_flight_max']} at once); kills by the number of turns unanswered at the kill (n: kills), at "
              f"the deadline: {dict(sorted(stats['computing_at_deadline'].items()))}, after the turns left in flight "
              f"(unstreamed ones; the streamed were cancelled): {dict(sorted(stats['computing_at_kill'].items()))}")


if __name__ == "__main__":
    main()
