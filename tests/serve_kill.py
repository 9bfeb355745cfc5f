#!/usr/bin/env python3
"""kill -9 of `mzcache serve` at random points of its turns and their persistence (issue 25).

Usage: serve_kill.py MZCACHE_CLI MODEL.gguf WORK_DIR [--kills N] [--seed S] [--conversations K] [--tol T]
                     [--perturb-reference]

A client holds K named conversations and sends turns to them (each turn resends the whole history,
as OpenAI clients do). After a random 0-600 ms, while turns run and the pool writes them behind,
the server is SIGKILLed and started again on the same folder. Then, for every conversation:
  - the server lists it, and no stored file is reported damaged;
  - its stored token count is one the client saw acknowledged (the last acknowledged turn or the
    one before it: write-behind is at most one turn behind, so a conversation with one turn may
    not be stored yet), a prefix within the last acknowledged turn (write-behind saves between the
    calls of a turn), or the turn in flight: never less, never past what was computed;
  - the client's next turn continues it (cached_tokens covers what was stored) and succeeds, and
    its logprobs (every sampled token and its 3 alternatives, matched by token) are compared with
    those of a reference server that is never killed and gets every acknowledged turn too. While
    the two computed a conversation in the same batches (every turn mirrored, no reopened state
    behind the last acknowledged turn), they must be equal bit for bit: a state reopened silently
    wrong (right length, wrong KV) would change them. A reopened state behind the last turn makes
    the server compute the lost turn again in another batch than the reference did, and ggml's
    matrix products are not batch-invariant: a row's result can depend on the batch's size, and
    one flipped fp16 rounding of a KV element moved a logprob of this random-weight model by up
    to 0.165 (measured: docs/reliability.md, finding 8). From then on that conversation is
    compared within --tol (default 0.5), which only catches gross damage, and a near tie (top
    two within --tol) may pick the other token, after which the rest of that reply is not
    compared. On a difference, a third server computes the same history from scratch, and the
    failure says which side equals it.
--perturb-reference is the negative control: the reference gets the history with one word of its
system message changed, and the run must see the difference (exit 0 when it does, 1 when not).
Prints a table of kills and reopened states by outcome; exits 1 on the first violation.
Loopback only; every wait is bounded.
"""
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import time


SERVERS = []  # every server started, killed on failure so that none outlives the harness


def fail(msg):
    print(f"serve_kill: FAILED: {msg}", file=sys.stderr)
    for s in SERVERS:
        if s.proc is not None and s.proc.poll() is None:
            s.proc.kill()
    sys.exit(1)


class Server:
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
                                      "--parallel", "2", "--no-watch-pressure"], stdout=log, stderr=log)
        deadline = time.time() + 120
        while not (os.path.exists(pf) and os.path.getsize(pf) > 0):
            if self.proc.poll() is not None:
                fail("the server exited at start (see server.log)")
            if time.time() > deadline:
                fail("the server did not listen within 120 s")
            time.sleep(0.05)
        self.port = int(open(pf).read())

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def call(self, method, path, body=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request(method, path, body=json.dumps(body) if body is not None else None)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, json.loads(data) if data else None


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
    perturb = "--perturb-reference" in sys.argv
    rng = random.Random(seed)
    os.makedirs(work, exist_ok=True)
    subprocess.run(["rm", "-rf", os.path.join(work, "pool"), os.path.join(work, "ref")])
    srv = Server(cli, model, work)
    srv.start()
    ref = Server(cli, model, os.path.join(work, "ref"))  # never killed: the logprobs to compare with
    ref.start()
    worst = {"diff": 0.0, "compared": 0, "ties": 0, "exact": 0, "within_tol": 0}

    last = {}  # the request compared last, for the localization below

    def differ(msg):
        if perturb:
            print(f"serve_kill: negative control: the perturbed reference was told apart ({msg})")
            srv.kill()
            ref.kill()
            sys.exit(0)
        # Which side is off: a third server computes the same history from scratch (a new
        # conversation, nothing cached of it). mzcache's forward pass gives the same bits whatever
        # the batch split (measured), so the state that is right equals it exactly.
        scratch = Server(cli, model, os.path.join(work, "scratch"))
        subprocess.run(["rm", "-rf", os.path.join(work, "scratch", "pool")])
        os.makedirs(scratch.work, exist_ok=True)
        scratch.start()
        status, rs = scratch.call("POST", "/v1/chat/completions", dict(last["body"], conversation="from-scratch"))
        scratch.kill()
        if status == 200:
            lp = lambda r: [x["logprob"] for x in r["choices"][0]["logprobs"]["content"]]
            s, g, w = lp(rs), lp(last["got"]), lp(last["want"])
            side = ("the reopened server matches it exactly and the never-killed reference does not" if g == s and w != s
                    else "the never-killed reference matches it exactly and the reopened server does not" if w == s and g != s
                    else "neither matches it exactly")
            msg += f"; computed from scratch: {s} ({side}; reopened {g}, reference {w})"
        fail(msg)

    def same_logprobs(kill, conv, got, want, tol):
        """Fails unless the two replies' logprobs agree (see the module's docstring)."""
        a = got["choices"][0]["logprobs"]["content"]
        b = want["choices"][0]["logprobs"]["content"]
        for i, (x, y) in enumerate(zip(a, b)):
            if x["token"] != y["token"]:
                top = y["top_logprobs"]
                if len(top) >= 2 and abs(top[0]["logprob"] - top[1]["logprob"]) <= tol:
                    worst["ties"] += 1
                    return
                differ(f"kill {kill}: {conv} after restart sampled {x['token']!r} at token {i}, the never-killed "
                     f"reference {y['token']!r}: the reopened state is not the one stored")
            # Alternatives are compared token by token (two near-tied alternatives may be listed in
            # either order): each token both lists hold.
            theirs = {q["token"]: q["logprob"] for q in y["top_logprobs"]}
            pairs = [(x["logprob"], y["logprob"])] + [(p["logprob"], theirs[p["token"]]) for p in x["top_logprobs"]
                                                      if p["token"] in theirs]
            for u, v in pairs:
                d = abs(u - v)
                worst["diff"] = max(worst["diff"], d)
                if d > tol:
                    differ(f"kill {kill}: {conv} after restart: logprob {u} vs the reference's {v} at token {i}")
            worst["compared"] += 1
        if len(a) != len(b):
            fail(f"kill {kill}: {conv} after restart: {len(a)} tokens, the reference {len(b)}")
    # Per conversation: the messages acknowledged, and the token counts the pool reported after each
    # acknowledged turn (index = turns acknowledged).
    msgs = {f"k{i}": [{"role": "system", "content": f"conversation {i}"}] for i in range(k)}
    counts = {c: [0] for c in msgs}
    prompts = {c: [0] for c in msgs}  # prompt tokens of each acknowledged turn (its reply follows them)
    outcomes = {"latest": 0, "one behind": 0, "mid-turn": 0, "in flight": 0}
    # exact[c]: the server and the reference computed conversation c in the same batches so far
    # (every turn mirrored, no reopened state that was behind): their logprobs must be equal bit for
    # bit. Once a reopened state was behind, the server computed the lost turn again in another
    # batch than the reference did; ggml's matrix products are not batch-invariant (a row's result
    # can depend on the batch's size), so from then on c is compared within --tol.
    exact = {}
    t0 = time.time()
    for kill in range(kills):
        deadline = time.time() + rng.uniform(0.0, 0.6)
        inflight = {}
        # A conversation near the context's end (4096) is retired for a new one: the harness tests
        # kills, not the context limit (a 400 context_length_exceeded there is correct). So is one
        # whose reopened state was behind (its continuation was checked above, within --tol): a new
        # one is compared bit for bit again.
        for old in [x for x in msgs if counts[x][-1] > 3000 or not exact.get(x, True)]:
            base, _, gen = old.partition(".")
            new = f"{base}.{int(gen or 0) + 1}"
            msgs[new], counts[new], prompts[new] = [{"role": "system", "content": f"conversation {new}"}], [0], [0]
            del msgs[old], counts[old], prompts[old]
            exact.pop(old, None)
        while True:
            c = rng.choice(sorted(msgs))
            turn = msgs[c] + [{"role": "user", "content": f"turn {len(counts[c])} of {c}"}]
            inflight[c] = turn
            if time.time() >= deadline:
                break  # killed while this turn is sent (below), or right after it
            body0 = {"messages": turn, "max_tokens": 3, "temperature": 0, "conversation": c}
            status, r = srv.call("POST", "/v1/chat/completions", body0)
            if status != 200:
                fail(f"turn on {c}: HTTP {status}: {r}")
            # The reference gets every acknowledged turn too, so that it computes each in the same
            # batches: while both did (exact[c]), the same state gives the same bits.
            status, rr = ref.call("POST", "/v1/chat/completions", body0)
            if status != 200:
                fail(f"the reference's turn on {c}: HTTP {status}: {rr}")
            if exact.get(c, True) and rr["choices"][0]["message"]["content"] != r["choices"][0]["message"]["content"]:
                fail(f"{c}: the reference, computing the same turns in the same batches, replied "
                     f"{rr['choices'][0]['message']['content']!r}, the server {r['choices'][0]['message']['content']!r}")
            msgs[c] = turn + [{"role": "assistant", "content": r["choices"][0]["message"]["content"]}]
            _, pool = srv.call("GET", "/v1/mzcache/pool")
            tokens = {x["id"]: x["tokens"] for x in pool["conversations"]}
            counts[c].append(tokens[c])
            prompts[c].append(r["usage"]["prompt_tokens"])
            inflight.pop(c)
        # Kill during a turn in flight: send it and kill without waiting for the answer.
        c = next(iter(inflight))
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("POST", "/v1/chat/completions",
                     json.dumps({"messages": inflight[c], "max_tokens": 3, "temperature": 0, "conversation": c}))
        time.sleep(rng.uniform(0.0, 0.05))
        srv.kill()
        conn.close()
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
                outcomes["latest"] += 1
                j = acked
            elif acked >= 1 and stored == seen[acked - 1]:
                outcomes["one behind"] += 1
                j = acked - 1
            elif acked >= 1 and seen[acked - 1] < stored < seen[acked]:
                # The pool's write-behind saves a conversation between two calls of a turn (a turn
                # is restore_generate then one decode per token): a prefix of the last acknowledged
                # turn, never past it (found by this harness; docs/pool.md).
                outcomes["mid-turn"] += 1
                j = acked - 1
            elif conv == c and stored > seen[acked]:
                outcomes["in flight"] += 1  # the turn cut by the kill was persisted whole
                j = acked
            else:
                fail(f"kill {kill}: {conv} holds {stored} tokens; acknowledged turns gave {seen[-3:]}")
            if stored != seen[acked]:
                exact[conv] = False  # the lost turn is computed again, in another batch than the reference's
            # The client carries on from what it has: the stored part is not computed again.
            turn = msgs[conv] + [{"role": "user", "content": f"turn {len(seen)} of {conv}"}]
            body = {"messages": turn, "max_tokens": 3, "temperature": 0, "conversation": conv, "logprobs": True,
                    "top_logprobs": 3}
            status, r = srv.call("POST", "/v1/chat/completions", body)
            if status != 200:
                fail(f"kill {kill}: turn on {conv} after restart: HTTP {status}: {r}")
            if perturb:
                rbody = json.loads(json.dumps(body))
                rbody["messages"][0]["content"] = rbody["messages"][0]["content"].replace("conversation", "chat")
            status, rr = ref.call("POST", "/v1/chat/completions", rbody if perturb else body)
            if status != 200:
                fail(f"kill {kill}: the reference's turn on {conv}: HTTP {status}: {rr}")
            # Kept for the investigation of a failure: the last request compared.
            json.dump(body, open(os.path.join(work, "last-compared-request.json"), "w"))
            last.update(body=body, got=r, want=rr)
            # The negative control compares bit for bit: a changed word must always be seen.
            bitwise = exact.get(conv, True) or perturb
            same_logprobs(kill, conv, r, rr, 0.0 if bitwise else tol)
            worst["exact" if bitwise else "within_tol"] += 1
            # Everything up to the stored turn's prompt is the same tokens in the resent history (the
            # reply after it may tokenize differently): at least that is not computed again.
            cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            if j > 0 and cached < prompts[conv][j] - 1:
                fail(f"kill {kill}: {conv} after restart computed its stored history again (cached {cached}, "
                     f"stored {stored}, turn {j}'s prompt {prompts[conv][j]})")
            msgs[conv] = turn + [{"role": "assistant", "content": r["choices"][0]["message"]["content"]}]
            _, p2 = srv.call("GET", "/v1/mzcache/pool")
            counts[conv].append({x["id"]: x["tokens"] for x in p2["conversations"]}[conv])
            prompts[conv].append(r["usage"]["prompt_tokens"])
        print(f"serve_kill: kill {kill + 1}/{kills}: {outcomes}", file=sys.stderr)
    srv.kill()
    ref.kill()
    if perturb:
        fail("negative control: the perturbed reference's logprobs were not told apart")
    n = sum(outcomes.values())
    print(f"| kills | reopened states | latest | one turn behind | within the last turn | the turn in flight | failures |")
    print(f"|---|---|---|---|---|---|---|")
    print(f"| {kills} | {n} | {outcomes['latest']} | {outcomes['one behind']} | {outcomes['mid-turn']} | {outcomes['in flight']} | 0 |")
    print(f"serve_kill: {kills} kills in {time.time() - t0:.0f} s, every state the old or the new one; "
          f"{worst['compared']} tokens' logprobs compared with the never-killed reference, max difference "
          f"{worst['diff']:.3g}; {worst['exact']} replies compared bit for bit (same batches), {worst['within_tol']} "
          f"within tolerance {tol:g} (after a state that was behind), {worst['ties']} near ties")


if __name__ == "__main__":
    main()
