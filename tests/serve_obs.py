#!/usr/bin/env python3
"""`mzcache serve`'s observability and resource endpoints end to end (issue 46).

Usage: serve_obs.py MZCACHE MODEL WORKDIR NPM_DIR

NPM_DIR holds node_modules/parse-prometheus-text-format (a real Prometheus text parser; installed
by the ctest's setup the way check_serve.sh installs the openai client).

Server A (no key, no --cors, --no-metrics, its load held 1.5 s by MZ_SERVE_TEST_LOAD_DELAY_MS):
  /health answers 503 {"status": "loading model"} and other endpoints 503 while the model loads,
  200 after; no CORS header; /metrics is 404.
Server B (--api-key-file, --cors ORIGIN):
  - the key file's key is required (trailing newline stripped); an empty or missing key file is
    a start error;
  - CORS: the origin's requests get Access-Control-Allow-Origin, others not; OPTIONS preflight 204;
  - /metrics parses with the real parser, every family has HELP and TYPE, histograms are
    consistent; llama-server's counters and mzcache's move after a turn, after a conversation's
    evict and after trim;
  - /tokenize and /detokenize round trip (with pieces too); /props has llama-server's fields;
  - conversations: list, get, evict (bytes leave RAM for storage), restore (back), delete, 404;
  - timings: prompt_n + cache_n = usage.prompt_tokens, predicted_n = completion_tokens, a
    continuation has cache_n > 0, the streamed last chunk carries them;
  - bad input on every new route: a 400 naming the field.
"""
import atexit
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HOST = "127.0.0.1"
ORIGIN = "http://app.example.test"


SERVERS = []  # every server started: killed on the way out, whatever happened


def kill_servers():
    for proc in SERVERS:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


atexit.register(kill_servers)


def fail(msg):
    print(f"FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def ok(msg):
    print(f"ok - {msg}")


def request(port, method, path, body=None, key=None, headers=None, raw=None, timeout=120):
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    if data is None and method in ("POST", "PUT"):
        data = ""
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    out = r.read()
    hdrs = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, out, hdrs


def jreq(port, method, path, body=None, key=None, expect=200, **kw):
    st, out, h = request(port, method, path, body, key, **kw)
    if st != expect:
        fail(f"{method} {path}: {st} (expected {expect}): {out[:300]!r}")
    return json.loads(out) if out else None, h


class Server:
    def __init__(self, cli, model, work, name, args, env=None, wait_ready=True):
        self.log = os.path.join(work, name + ".log")
        self.pf = os.path.join(work, name + ".port")
        if os.path.exists(self.pf):
            os.remove(self.pf)
        e = dict(os.environ)
        e.update(env or {})
        e.pop("MZ_API_KEY", None)
        self.proc = subprocess.Popen(
            [cli, "serve", "-m", model, "--port", "0", "--port-file", self.pf, "--pool-dir",
             os.path.join(work, name + "-pool"), "--persist-codec", "none", "--kv-codec", "none", "-c", "1024",
             "--no-watch-pressure"] + args, stdout=subprocess.DEVNULL, stderr=open(self.log, "w"), env=e)
        SERVERS.append(self.proc)
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline and self.port is None:
            m = re.search(r"bound to http://[^:]+:(\d+)", open(self.log).read())
            if m:
                self.port = int(m.group(1))
            elif self.proc.poll() is not None:
                fail(f"server {name} exited {self.proc.returncode}: {open(self.log).read()[-500:]}")
            else:
                time.sleep(0.01)
        if self.port is None:
            fail(f"server {name} did not bind")
        if wait_ready:
            self.wait_ready()

    def wait_ready(self):
        deadline = time.time() + 120
        while not os.path.exists(self.pf):
            if self.proc.poll() is not None or time.time() > deadline:
                fail(f"server did not get ready: {open(self.log).read()[-500:]}")
            time.sleep(0.02)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail("server did not stop on SIGTERM")


def parse_metrics(text, npm_dir):
    js = ("const parse = require(process.argv[1] + '/node_modules/parse-prometheus-text-format');"
          "let s=''; process.stdin.on('data', d => s += d); process.stdin.on('end', () => {"
          " process.stdout.write(JSON.stringify(parse(s))); });")
    p = subprocess.run(["node", "-e", js, npm_dir], input=text.encode(), capture_output=True, timeout=60)
    if p.returncode != 0:
        fail(f"the Prometheus parser refused /metrics: {p.stderr.decode()[-500:]}")
    fams = {f["name"]: f for f in json.loads(p.stdout)}
    # The parser is lenient about HELP/TYPE; the format requires each family's TYPE: checked here.
    for name, f in fams.items():
        if f.get("type") not in ("COUNTER", "GAUGE", "HISTOGRAM"):
            fail(f"metric family {name} has no # TYPE counter/gauge/histogram ({f.get('type')})")
        if not f.get("help"):
            fail(f"metric family {name} has no # HELP")
        if f["type"] == "HISTOGRAM":
            for m in f["metrics"]:
                b = m["buckets"]
                counts = [float(b[k]) for k in sorted(b, key=lambda k: float(k))]
                if counts != sorted(counts):
                    fail(f"{name}: buckets not cumulative: {b}")
                if "+Inf" not in b or float(b["+Inf"]) != float(m["count"]):
                    fail(f"{name}: the +Inf bucket is not the count: {m}")
    return fams


def value(fams, name, **labels):
    f = fams.get(name)
    if not f:
        fail(f"no metric {name}")
    for m in f["metrics"]:
        if all(m.get("labels", {}).get(k) == v for k, v in labels.items()):
            return float(m["count"] if f["type"] == "HISTOGRAM" else m["value"])
    fail(f"no sample {name}{labels}")


def expect_400(port, key, path, body, param, raw=None):
    st, out, _ = request(port, "POST", path, body, key, raw=raw)
    if st != 400:
        fail(f"POST {path} {raw or body!r}: {st}, expected 400: {out[:200]!r}")
    e = json.loads(out)["error"]
    if param is not None and e.get("param") != param:
        fail(f"POST {path} {raw or body!r}: the error names {e.get('param')!r}, expected {param!r}: {e}")


def main():
    cli, model, work, npm_dir = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)

    # --- A: loading, no CORS, no metrics
    a = Server(cli, model, work, "a", ["--no-metrics", "--no-slots"], env={"MZ_SERVE_TEST_LOAD_DELAY_MS": "1500"}, wait_ready=False)
    st, out, _ = request(a.port, "GET", "/health")
    if st != 503 or json.loads(out).get("status") != "loading model":
        fail(f"/health while loading: {st} {out!r}")
    st, out, h = request(a.port, "GET", "/v1/models")
    if st != 503 or json.loads(out)["error"]["message"] != "Loading model":
        fail(f"/v1/models while loading: {st} {out!r}")
    if os.path.exists(a.pf):
        fail("the port file was written before the model loaded")
    a.wait_ready()
    jreq(a.port, "GET", "/health")
    ok("/health 503 {status: loading model} and other endpoints 503 while loading; 200 after")
    _, _, h = request(a.port, "GET", "/v1/models", headers={"Origin": ORIGIN})
    if "access-control-allow-origin" in h:
        fail("a CORS header without --cors")
    st, _, h = request(a.port, "OPTIONS", "/v1/chat/completions",
                       headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    if "access-control-allow-origin" in h:
        fail("a preflight answered with CORS without --cors")
    ok("no CORS headers by default")
    st, _, _ = request(a.port, "GET", "/metrics")
    if st != 404:
        fail(f"/metrics with --no-metrics: {st}")
    ok("--no-metrics: /metrics 404")
    st, out, _ = request(a.port, "GET", "/slots")
    if st != 501 or "slots" not in json.loads(out)["error"]["message"]:
        fail(f"/slots with --no-slots: {st} {out[:200]!r}")
    if jreq(a.port, "GET", "/props")[0]["endpoint_slots"] is not False:
        fail("/props endpoint_slots with --no-slots")
    st, out, _ = request(a.port, "POST", "/slots/0?action=save")
    if st != 501:
        fail(f"POST /slots/0?action=save with --no-slots: {st} {out[:200]!r}")
    ok("--no-slots: /slots and its actions 501 (as llama-server's), /props endpoint_slots false")
    a.stop()

    # --- key files that must not start
    empty = os.path.join(work, "empty.key")
    open(empty, "w").write("\n")
    for path, why in ((empty, "is empty"), (os.path.join(work, "missing.key"), "cannot be read")):
        p = subprocess.run([cli, "serve", "-m", model, "--port", "0", "--api-key-file", path],
                           capture_output=True, timeout=60)
        if p.returncode == 0 or why not in p.stderr.decode():
            fail(f"--api-key-file {path}: exit {p.returncode}, stderr {p.stderr.decode()[-300:]!r}")
    ok("--api-key-file: an empty or missing file is a clear start error")

    # --- B: key file, CORS
    key = "k-" + os.urandom(8).hex()
    kf = os.path.join(work, "api.key")
    open(kf, "w").write(key + "\n")
    b = Server(cli, model, work, "b", ["--api-key-file", kf, "--cors", ORIGIN])
    p = b.port
    st, _, _ = request(p, "GET", "/v1/models")
    if st != 401:
        fail(f"no key: {st}")
    st, _, _ = request(p, "GET", "/metrics")
    if st != 401:
        fail(f"/metrics without the key: {st}")
    st, _, _ = request(p, "GET", "/v1/models", key=key + "x")
    if st != 401:
        fail(f"a wrong key: {st}")
    jreq(p, "GET", "/v1/models", key=key)
    ok("--api-key-file: the file's key (newline stripped) is required, /metrics included")
    _, _, h = request(p, "GET", "/v1/models", key=key, headers={"Origin": ORIGIN})
    if h.get("access-control-allow-origin") != ORIGIN:
        fail(f"--cors: no Access-Control-Allow-Origin for {ORIGIN}: {h}")
    _, _, h = request(p, "GET", "/v1/models", key=key, headers={"Origin": "http://evil.test"})
    if "access-control-allow-origin" in h:
        fail("--cors: a header for another origin")
    st, _, h = request(p, "OPTIONS", "/v1/chat/completions",
                       headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                "Access-Control-Request-Headers": "authorization, content-type"})
    if st != 204 or h.get("access-control-allow-origin") != ORIGIN or "POST" not in h.get(
            "access-control-allow-methods", "") or "Authorization" not in h.get("access-control-allow-headers", ""):
        fail(f"preflight: {st} {h}")
    ok("--cors: the origin's requests and preflight get CORS headers, another origin none")

    # --- metrics before
    st, out, h = request(p, "GET", "/metrics", key=key)
    if st != 200 or not h.get("content-type", "").startswith("text/plain"):
        fail(f"/metrics: {st} {h}")
    m0 = parse_metrics(out.decode(), npm_dir)
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_total",
                 "llamacpp:tokens_predicted_seconds_total", "llamacpp:requests_processing",
                 "llamacpp:requests_deferred", "mzcache_kv_bytes", "mzcache_conversations", "mzcache_ttft_seconds",
                 "mzcache_restore_seconds", "mzcache_restored_bytes_total", "mzcache_evictions_total",
                 "mzcache_pressure_events_total", "mzcache_conversations_lost_total",
                 "mzcache_persist_failures_total", "mzcache_prefix_hit_tokens_total",
                 "mzcache_recomputed_tokens_total"):
        if name not in m0:
            fail(f"/metrics lacks {name}")
    for tier in ("resident", "compressed_memory", "storage"):
        value(m0, "mzcache_kv_bytes", tier=tier)
        value(m0, "mzcache_conversations", tier=tier)
    for reason in ("budget", "pressure", "trim", "manual", "conversation"):
        value(m0, "mzcache_evictions_total", reason=reason)
    ok(f"/metrics parses with parse-prometheus-text-format ({len(m0)} families, HELP and TYPE on each)")

    # --- a turn: timings and counters
    conv = "obs-1"
    msgs = [{"role": "user", "content": "Tell me about memory."}]
    r, _ = jreq(p, "POST", "/v1/chat/completions",
                {"messages": msgs, "max_tokens": 6, "temperature": 0, "conversation": conv}, key=key)
    t, u = r.get("timings"), r["usage"]
    if not t:
        fail(f"no timings: {r}")
    for f in ("prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n", "predicted_ms",
              "predicted_per_token_ms", "predicted_per_second", "cache_n", "restore_ms",
              "restore_bytes_from_storage"):
        if f not in t:
            fail(f"timings lack {f}: {t}")
    if t["prompt_n"] + t["cache_n"] != u["prompt_tokens"] or t["predicted_n"] != u["completion_tokens"]:
        fail(f"timings disagree with usage: {t} {u}")
    if t["prompt_ms"] <= 0 or t["predicted_ms"] <= 0 or t["cache_n"] != u["prompt_tokens_details"]["cached_tokens"]:
        fail(f"timings: {t}")
    m1 = parse_metrics(request(p, "GET", "/metrics", key=key)[1].decode(), npm_dir)
    d_prompt = value(m1, "llamacpp:prompt_tokens_total") - value(m0, "llamacpp:prompt_tokens_total")
    d_pred = value(m1, "llamacpp:tokens_predicted_total") - value(m0, "llamacpp:tokens_predicted_total")
    if d_prompt != t["prompt_n"] or d_pred != t["predicted_n"]:
        fail(f"counters moved by {d_prompt}, {d_pred}; the turn computed {t['prompt_n']}, {t['predicted_n']}")
    if value(m1, "mzcache_ttft_seconds") != value(m0, "mzcache_ttft_seconds") + 1:
        fail("the TTFT histogram did not count the turn")
    if value(m1, "llamacpp:prompt_seconds_total") <= value(m0, "llamacpp:prompt_seconds_total"):
        fail("prompt seconds did not move")
    if value(m1, "mzcache_kv_bytes", tier="resident") <= 0 or value(m1, "mzcache_conversations", tier="resident") < 1:
        fail("no resident KV after a turn")
    ok(f"timings as llama-server's (prompt_n {t['prompt_n']} + cache_n {t['cache_n']} = prompt tokens); "
       "llamacpp:* counters and the TTFT histogram moved by the turn")
    # A continuation: cached tokens, and the streamed last chunk's timings.
    msgs += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
             {"role": "user", "content": "More."}]
    st, out, _ = request(p, "POST", "/v1/chat/completions",
                         {"messages": msgs, "max_tokens": 4, "temperature": 0, "conversation": conv, "stream": True,
                          "stream_options": {"include_usage": True}}, key=key)
    chunks = [json.loads(l[6:]) for l in out.decode().split("\n") if l.startswith("data: {")]
    last = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    usage = [c for c in chunks if c.get("usage")]
    if st != 200 or not last or "timings" not in last[-1] or not usage:
        fail(f"streamed: no timings in the last chunk: {out[-600:]!r}")
    t2, u2 = last[-1]["timings"], usage[-1]["usage"]
    if t2["cache_n"] <= 0 or t2["prompt_n"] + t2["cache_n"] != u2["prompt_tokens"]:
        fail(f"continuation timings: {t2} {u2}")
    ok(f"streamed: the last chunk carries timings; the continuation's cache_n {t2['cache_n']} > 0")

    # --- tokenize / detokenize / props
    text = "Hello world, mzcache gives memory back!"
    r, _ = jreq(p, "POST", "/tokenize", {"content": text}, key=key)
    toks = r["tokens"]
    if not toks or not all(isinstance(x, int) for x in toks):
        fail(f"/tokenize: {r}")
    r, _ = jreq(p, "POST", "/detokenize", {"tokens": toks}, key=key)
    if r["content"] != text:
        fail(f"round trip: {r['content']!r} != {text!r}")
    r, _ = jreq(p, "POST", "/tokenize", {"content": text, "with_pieces": True}, key=key)
    if [x["id"] for x in r["tokens"]] != toks or "".join(x["piece"] for x in r["tokens"]) != text:
        fail(f"with_pieces: {r}")
    jreq(p, "POST", "/tokenize", {"content": text, "add_special": True}, key=key)
    r, _ = jreq(p, "POST", "/detokenize", {"tokens": []}, key=key)
    if r["content"] != "":
        fail(f"empty detokenize: {r}")
    ok(f"/tokenize and /detokenize round trip ({len(toks)} tokens, with pieces too)")
    # llama-server's mixed arrays: strings tokenized in place, ids taken as they are.
    head, _ = jreq(p, "POST", "/tokenize", {"content": "Hello"}, key=key)
    tail, _ = jreq(p, "POST", "/tokenize", {"content": " world"}, key=key)
    r, _ = jreq(p, "POST", "/tokenize", {"content": ["Hello", toks[-1], " world", 0]}, key=key)
    want = head["tokens"] + [toks[-1]] + tail["tokens"] + [0]
    if r["tokens"] != want:
        fail(f"mixed /tokenize: {r['tokens']} != {want}")
    r, _ = jreq(p, "POST", "/tokenize", {"content": [toks[0], "Hello"], "with_pieces": True}, key=key)
    if [x["id"] for x in r["tokens"]] != [toks[0]] + head["tokens"] or r["tokens"][0]["piece"] != "Hello":
        fail(f"mixed /tokenize with pieces: {r}")
    ok(f"/tokenize with a mixed array of strings and ids ({want}), with pieces too")
    r, _ = jreq(p, "GET", "/props", key=key)
    for f in ("default_generation_settings", "total_slots", "model_alias", "model_path", "modalities",
              "endpoint_metrics", "endpoint_slots", "build_info"):
        if f not in r:
            fail(f"/props lacks {f}: {r}")
    if (r["default_generation_settings"]["n_ctx"] != 1024 or r["endpoint_metrics"] is not True or
            r["endpoint_slots"] is not True):
        fail(f"/props: {r}")
    # The model's own chat template (the GGUF's tokenizer.chat_template) and its BOS/EOS text, as
    # llama-server reports them (clients render prompts with them).
    tmpl = r.get("chat_template")
    if not isinstance(tmpl, str) or "{%" not in tmpl or "messages" not in tmpl:
        fail(f"/props chat_template is not the model's Jinja template: {str(tmpl)[:200]!r}")
    if not isinstance(r.get("bos_token"), str) or not isinstance(r.get("eos_token"), str) or not r["eos_token"]:
        fail(f"/props bos_token / eos_token: {r.get('bos_token')!r} / {r.get('eos_token')!r}")
    ok(f"/props with llama-server's fields (chat_template of {len(tmpl)} bytes, eos {r['eos_token']!r})")

    # --- /slots: llama-server's fields for each --parallel slot (8 by default), the last task of the
    # slot that ran the streamed continuation above, and a slot busy while a stream is open.
    st, _, _ = request(p, "GET", "/slots")
    if st != 401:
        fail(f"/slots without the key: {st}")
    slots, _ = jreq(p, "GET", "/slots?fail_on_no_slot=1", key=key)
    if len(slots) != 8 or [x["id"] for x in slots] != list(range(8)) or any(x["is_processing"] for x in slots):
        fail(f"/slots idle: {slots}")
    mine = [x for x in slots if x.get("mzcache", {}).get("conversation") == conv]
    if not mine:
        fail(f"no slot ran {conv}: {slots}")
    last = max(mine, key=lambda x: x["id_task"])
    if (last["n_prompt_tokens"] != u2["prompt_tokens"] or last["n_prompt_tokens_cache"] != t2["cache_n"] or
            last["n_prompt_tokens_processed"] != t2["prompt_n"] or last["params"]["n_predict"] != 4 or
            last["params"]["stream"] is not True or last["next_token"][0]["n_decoded"] != u2["completion_tokens"] or
            last["n_ctx"] != 1024):
        fail(f"/slots' last task of {conv}: {last} (usage {u2}, timings {t2})")
    tasks = [x["id_task"] for x in slots if "id_task" in x]
    if len(set(tasks)) != len(tasks):
        fail(f"/slots: task ids repeat: {tasks}")
    sc = http.client.HTTPConnection(HOST, p, timeout=120)
    sc.request("POST", "/v1/chat/completions", body=json.dumps(
        {"messages": [{"role": "user", "content": "Count slowly."}], "max_tokens": 200, "temperature": 1,
         "stream": True, "seed": 3}), headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    sr = sc.getresponse()
    busy = []
    for _ in range(60):
        sr.readline()  # the stream is flowing: read on while looking
        busy = [x for x in jreq(p, "GET", "/slots", key=key)[0] if x["is_processing"]]
        if busy and busy[0].get("params", {}).get("n_predict") == 200 and busy[0]["next_token"][0]["n_decoded"] > 0:
            break
    if len(busy) != 1 or busy[0]["params"]["n_predict"] != 200 or busy[0]["next_token"][0]["n_decoded"] <= 0:
        fail(f"/slots while a stream is open: {busy}")
    ok(f"/slots: 8 slots with llama-server's fields; the continuation's slot (task {last['id_task']}: "
       f"{last['n_prompt_tokens']} prompt tokens, {last['n_prompt_tokens_cache']} cached); a streaming turn's slot "
       f"busy with {busy[0]['next_token'][0]['n_decoded']} tokens decoded")
    sr.read()
    sc.close()

    # --- /slots actions (POST /slots/ID?action=save|restore|erase) on the streamed turn's slot and
    # conversation: save persists it now, restore brings its KV back after an evict, erase forgets it.
    sid, c2 = busy[0]["id"], busy[0]["mzcache"]["conversation"]
    for _ in range(100):
        if not jreq(p, "GET", "/slots", key=key)[0][sid]["is_processing"]:
            break
        time.sleep(0.05)
    st, _, _ = request(p, "POST", f"/slots/{sid}?action=save")
    if st != 401:
        fail(f"slot action without the key: {st}")
    sv, _ = jreq(p, "POST", f"/slots/{sid}?action=save", key=key)
    got = jreq(p, "GET", f"/v1/conversations/{c2}", key=key)[0]
    if (sv["id_slot"] != sid or sv["filename"] != c2 or sv["n_saved"] <= 0 or sv["n_saved"] != got["stored_tokens"] or
            sv["n_saved"] != got["tokens"] or sv["n_written"] != got["stored_bytes"] or "save_ms" not in sv["timings"]):
        fail(f"save: {sv} (conversation {got})")
    ev, _ = jreq(p, "POST", f"/v1/conversations/{c2}/evict", key=key)
    rs, _ = jreq(p, "POST", f"/slots/{sid}?action=restore", key=key, raw="{}")
    if (ev["bytes"]["resident"] != 0 or rs["n_restored"] != got["tokens"] or rs["n_read"] <= 0 or
            rs["mzcache"]["bytes"]["resident"] <= 0 or "restore_ms" not in rs["timings"]):
        fail(f"restore after evict: {rs} (evict {ev})")
    fresh = [x["id"] for x in jreq(p, "GET", "/slots", key=key)[0] if "id_task" not in x]
    if fresh:
        e404 = request(p, "POST", f"/slots/{fresh[0]}?action=save", key=key)
        if e404[0] != 404:
            fail(f"save on a slot that never ran: {e404[0]} {e404[1][:200]!r}")
        if jreq(p, "POST", f"/slots/{fresh[0]}?action=erase", key=key)[0]["n_erased"] != 0:
            fail("erase on a slot that never ran erased something")
    # bad input: a 400 naming the field; a file is never named by a request
    for path, body, param in ((f"/slots/{sid}", None, "action"), (f"/slots/{sid}?action=load", None, "action"),
                              (f"/slots/{sid}?action=save", {"filename": "x.bin"}, "filename"),
                              (f"/slots/{sid}?action=restore", {"filename": "../../etc/passwd"}, "filename"),
                              ("/slots/8?action=save", None, "id_slot"), ("/slots/-1?action=save", None, "id_slot"),
                              ("/slots/x?action=erase", None, "id_slot"),
                              ("/slots/99999999999?action=erase", None, "id_slot")):
        expect_400(p, key, path, body, param)
    expect_400(p, key, f"/slots/{sid}?action=save", None, None, raw="not json")
    expect_400(p, key, f"/slots/{sid}?action=save", None, None, raw="[1]")
    if jreq(p, "GET", f"/v1/conversations/{c2}", key=key)[0]["tokens"] != got["tokens"]:
        fail("a refused slot action changed the conversation")
    er, _ = jreq(p, "POST", f"/slots/{sid}?action=erase", key=key)
    if er["n_erased"] != got["tokens"] or er["mzcache"] != {"conversation": c2, "forgotten": True}:
        fail(f"erase: {er}")
    jreq(p, "GET", f"/v1/conversations/{c2}", key=key, expect=404)
    if jreq(p, "POST", f"/slots/{sid}?action=erase", key=key)[0]["n_erased"] != 0:
        fail("a second erase erased something")
    jreq(p, "POST", f"/slots/{sid}?action=save", key=key, expect=404)
    # a busy slot: 409, never waits (after the erase above: the new turn may take slot sid)
    sc = http.client.HTTPConnection(HOST, p, timeout=120)
    sc.request("POST", "/v1/chat/completions", body=json.dumps(
        {"messages": [{"role": "user", "content": "Count again."}], "max_tokens": 400, "temperature": 1,
         "stream": True, "seed": 4}), headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    sr = sc.getresponse()
    st, out = 0, b""
    for _ in range(60):  # the turn may end between the look and the action: look again
        sr.readline()
        bs = [x for x in jreq(p, "GET", "/slots", key=key)[0] if x["is_processing"]]
        if bs:
            st, out, _ = request(p, "POST", f"/slots/{bs[0]['id']}?action=erase", key=key)
            if st == 409:
                break
    if st != 409:
        fail(f"erase on a busy slot: {st} {out[:200]!r}")
    sr.read()
    sc.close()
    ok(f"/slots actions: save ({sv['n_saved']} tokens, {sv['n_written']} bytes stored), restore after evict "
       f"({rs['n_read']} bytes read), erase (forgotten, then 404); 400s naming action, filename, id_slot; 409 when busy")

    # --- conversations as resources
    r, _ = jreq(p, "GET", "/v1/conversations", key=key)
    ids = [c["id"] for c in r["data"]]
    if conv not in ids:
        fail(f"{conv} not listed: {ids}")
    c, _ = jreq(p, "GET", f"/v1/conversations/{conv}", key=key)
    if c["tokens"] <= 0 or c["bytes"]["resident"] <= 0 or "last_use_unix_ms" not in c:
        fail(f"GET conversation: {c}")
    m2 = parse_metrics(request(p, "GET", "/metrics", key=key)[1].decode(), npm_dir)
    time.sleep(0.2)
    e, _ = jreq(p, "POST", f"/v1/conversations/{conv}/evict", key=key)
    if e["bytes"]["resident"] != 0 or e["bytes"]["storage"] <= 0 or e["freed"] <= 0:
        fail(f"evict: {e} (before {c['bytes']})")
    m3 = parse_metrics(request(p, "GET", "/metrics", key=key)[1].decode(), npm_dir)
    if value(m3, "mzcache_evictions_total", reason="conversation") != value(
            m2, "mzcache_evictions_total", reason="conversation") + 1:
        fail("mzcache_evictions_total{reason=conversation} did not move")
    if value(m3, "mzcache_evicted_bytes_total", reason="conversation") - value(
            m2, "mzcache_evicted_bytes_total", reason="conversation") != e["freed"]:
        fail("mzcache_evicted_bytes_total{reason=conversation} is not what was freed")
    if value(m3, "mzcache_kv_bytes", tier="storage") <= 0:
        fail("mzcache_kv_bytes{tier=storage} did not move")
    ok(f"evict: {e['freed']} bytes left RAM for storage; the eviction counters moved")
    rs, _ = jreq(p, "POST", f"/v1/conversations/{conv}/restore", key=key)
    if rs["bytes"]["resident"] <= 0 or rs["bytes"]["storage"] != 0 or rs["restored"] <= 0:
        fail(f"restore: {rs}")
    ok(f"restore: {rs['restored']} bytes back in RAM")
    # trim: memory given back counted as trim
    jreq(p, "POST", "/v1/mzcache/trim", {"level": 80}, key=key)
    m4 = parse_metrics(request(p, "GET", "/metrics", key=key)[1].decode(), npm_dir)
    if value(m4, "mzcache_pressure_events_total", source="trim") != value(
            m3, "mzcache_pressure_events_total", source="trim") + 1:
        fail("mzcache_pressure_events_total{source=trim} did not move")
    if value(m4, "mzcache_evictions_total", reason="trim") != value(m3, "mzcache_evictions_total", reason="trim") + 1:
        fail("mzcache_evictions_total{reason=trim} did not move")
    ok("trim: mzcache_pressure_events_total{source=trim} and mzcache_evictions_total{reason=trim} moved")
    # The next turn restores: the restore counters move.
    msgs += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "Again."}]
    r, _ = jreq(p, "POST", "/v1/chat/completions",
                {"messages": msgs, "max_tokens": 2, "temperature": 0, "conversation": conv}, key=key)
    m5 = parse_metrics(request(p, "GET", "/metrics", key=key)[1].decode(), npm_dir)
    if value(m5, "mzcache_restore_seconds") != value(m4, "mzcache_restore_seconds") + 1:
        fail(f"a turn after trim restored nothing counted (mzcache: {r['mzcache']})")
    ok(f"the return after trim is counted in mzcache_restore_seconds (units restored {r['mzcache']['units_restored']})")
    d, _ = jreq(p, "DELETE", f"/v1/conversations/{conv}", key=key)
    if d != {"id": conv, "object": "conversation", "deleted": True}:
        fail(f"delete: {d}")
    jreq(p, "GET", f"/v1/conversations/{conv}", key=key, expect=404)
    jreq(p, "DELETE", f"/v1/conversations/{conv}", key=key, expect=404)
    jreq(p, "POST", f"/v1/conversations/{conv}/evict", key=key, expect=404)
    jreq(p, "POST", f"/v1/conversations/{conv}/restore", key=key, expect=404)
    r, _ = jreq(p, "GET", "/v1/conversations", key=key)
    if conv in [c["id"] for c in r["data"]]:
        fail("a deleted conversation is listed")
    ok("conversations: list, get, evict, restore, delete, then 404 on each")

    # --- bad input
    for bad in (".hidden", "a" * 129, "sp%20ace", "%C3%A9t%C3%A9"):
        for method, path in (("GET", f"/v1/conversations/{bad}"), ("DELETE", f"/v1/conversations/{bad}"),
                             ("POST", f"/v1/conversations/{bad}/evict"), ("POST", f"/v1/conversations/{bad}/restore")):
            st, out, _ = request(p, method, path, key=key)
            if st != 400 or json.loads(out)["error"]["param"] != "id":
                fail(f"{method} {path}: {st} {out[:200]!r}")
    expect_400(p, key, "/tokenize", {}, "content")
    expect_400(p, key, "/tokenize", {"content": 5}, "content")
    expect_400(p, key, "/tokenize", {"content": ["a", 1.5]}, "content[1]")
    expect_400(p, key, "/tokenize", {"content": ["a", -1]}, "content[1]")
    expect_400(p, key, "/tokenize", {"content": [{"a": 1}]}, "content[0]")
    expect_400(p, key, "/tokenize", {"content": [1 << 40]}, "content[0]")
    expect_400(p, key, "/tokenize", {"content": "a", "with_pieces": "yes"}, "with_pieces")
    expect_400(p, key, "/tokenize", {"content": "a", "add_special": 1}, "add_special")
    expect_400(p, key, "/tokenize", None, None, raw="not json")
    expect_400(p, key, "/tokenize", None, None, raw="[" * 100 + "]" * 100)
    expect_400(p, key, "/detokenize", {}, "tokens")
    expect_400(p, key, "/detokenize", {"tokens": "1 2"}, "tokens")
    expect_400(p, key, "/detokenize", {"tokens": [1, 1.5]}, "tokens[1]")
    expect_400(p, key, "/detokenize", {"tokens": [-1]}, "tokens[0]")
    expect_400(p, key, "/detokenize", {"tokens": [10 ** 12]}, "tokens[0]")
    expect_400(p, key, "/detokenize", {"tokens": [2 ** 64 - 1]}, "tokens[0]")
    expect_400(p, key, "/detokenize", None, None, raw="[]")
    ok("bad input on every new route: a 400 naming the field")
    jreq(p, "GET", "/health")
    b.stop()
    if b.proc.returncode != 0:
        fail(f"server B exit {b.proc.returncode}")
    print("serve_obs: all passed")


if __name__ == "__main__":
    main()
