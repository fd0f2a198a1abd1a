"""Remote upstreams (issue 16, docs/REMOTE.md): a routing `rlai serve`
whose config names upstreams -- a second, real `rlai serve` acting as the
OpenAI-compatible upstream ("up"), and a small misbehaving Python upstream
(bad_upstream.py) for the fault cases ("bad", "flaky") plus a closed port
("down"). Greedy output through the route equals the upstream's direct
answer; a client's cancel reaches the upstream; retries, breaker,
deadlines and clear errors. Paths from meson (RLAI_BIN, RLAI_MODELS_DIR)."""
import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
HERE = Path(__file__).resolve().parent

from test_http import RLAI, MODEL, MODEL_ID, SHIPPED_PLUGINS, Engine, free_port, sample  # noqa: E402

SDK = Path(os.environ.get("RLAI_SOURCE_ROOT", HERE.parent.parent)) / "sdk" / "python"
sys.path.insert(0, str(SDK))
import rtx_localai  # noqa: E402
from tiny_lore import plugins_with_tiny_lore  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not RLAI, reason="RLAI_BIN not set (run through meson test)"),
    pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched (scripts/setup.sh)"),
]

HELLO = [{"role": "user", "content": "Name three planets."}]


TLS = HERE.parent / "data" / "tls"   # a self-signed test certificate for 127.0.0.1 (tests/data/README.md)


class BadUpstream:
    def __init__(self, tls=False):
        self.port = free_port()
        cert = [str(TLS / "upstream.pem"), str(TLS / "upstream.key")] if tls else []
        self.proc = subprocess.Popen([sys.executable, str(HERE / "bad_upstream.py"), str(self.port)] + cert,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout.readline().strip() == b"ready"

    def stats(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(b"GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        buf = b""
        while True:
            c = s.recv(65536)
            if not c:
                break
            buf += c
        s.close()
        return json.loads(buf.split(b"\r\n\r\n", 1)[1])

    def hits(self, model):
        return self.stats()["hits"].get(model, 0)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


LORE = bool(SHIPPED_PLUGINS) and (Path(SHIPPED_PLUGINS) / "loremaster" / "manifest.json").exists()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    plugins = plugins_with_tiny_lore(SHIPPED_PLUGINS, tmp_path_factory.mktemp("plugins")) if LORE else None
    up = Engine(tmp_path_factory.mktemp("upstream"), plugins=plugins)
    bad = BadUpstream()
    tls = BadUpstream(tls=True)
    tls_url = f"https://127.0.0.1:{tls.port}/v1"
    closed = free_port()
    tmp = tmp_path_factory.mktemp("router")
    fast = {"retry_backoff_ms": 50, "first_token_timeout_ms": 1500, "stall_timeout_ms": 1500}
    conf = {
        "upstreams": [
            {"name": "up", "base_url": f"http://127.0.0.1:{up.port}/v1", "api_key_file": str(up.key_path),
             "models": {"remote-smol": "default"}, "spill_model": "default"},
            dict(fast, name="bad", base_url=f"http://127.0.0.1:{bad.port}/v1", max_retries=2,
                 breaker_failures=1000,
                 models={f"bad-{m}": m for m in ("ok", "500once", "500", "429", "400", "malformed", "slow",
                                                 "stall", "short", "echo")}),
            dict(fast, name="flaky", base_url=f"http://127.0.0.1:{bad.port}/v1", max_retries=0,
                 breaker_failures=3, breaker_cooldown_ms=1500,
                 models={"flaky-500": "500", "flaky-ok": "ok"}),
            dict(fast, name="down", base_url=f"http://127.0.0.1:{closed}/v1", max_retries=1,
                 breaker_failures=1000, models={"down-x": "x"}),
            dict(fast, name="tls", base_url=tls_url, ca_file=str(TLS / "upstream.pem"),
                 models={"tls-ok": "ok", "tls-burst": "burst"}),
            dict(fast, name="tlsnoca", base_url=tls_url, max_retries=0, breaker_failures=1000,
                 models={"tls-noca": "ok"}),
            dict(fast, name="tlswrong", base_url=tls_url, ca_file=str(TLS / "other_ca.pem"), max_retries=2,
                 breaker_failures=1000, models={"tls-wrongca": "ok"}),
        ],
        "plugins": {"config": {"loremaster": {"model": "remote-smol"},
                               "screen": {"model": "bad-echo", "remote_vision": True}}},
    }
    cp = tmp / "router.json"
    cp.write_text(json.dumps(conf))
    router = Engine(tmp, plugins=plugins, extra=("--config", str(cp)))
    yield up, router, bad
    rc = router.stop()
    bad.stop()
    tls.stop()
    rc_up = up.stop()
    assert rc == 0, router.read_log()
    assert rc_up == 0, up.read_log()


def chat(engine, model, messages=HELLO, **kw):
    body = dict({"model": model, "messages": messages, "max_tokens": 24, "temperature": 0}, **kw)
    st, _, raw = engine.request("POST", "/v1/chat/completions", body, timeout=60)
    return st, json.loads(raw) if raw else None


def stream_events(engine, path, body, timeout=60):
    """POSTs a streamed request; returns the decoded data events (until [DONE])."""
    st, _, raw = engine.request("POST", path, dict(body, stream=True), timeout=timeout)
    assert st == 200, raw
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            d = line[6:]
            out.append(d if d == "[DONE]" else json.loads(d))
    return out


def streamed_text(events, chat_kind=True):
    t = ""
    for e in events:
        if isinstance(e, dict) and e.get("choices"):
            c = e["choices"][0]
            t += (c.get("delta", {}).get("content") or "") if chat_kind else (c.get("text") or "")
    return t


# ---------------------------------------------------------------- models, equality

def test_models_list_local_and_remote(cluster):
    _, router, _ = cluster
    ids = [m["id"] for m in router.get_json("/v1/models")["data"]]
    assert ids[:2] == [MODEL_ID, "default"]
    assert "remote-smol" in ids and "bad-ok" in ids and "down-x" in ids
    assert router.get_json("/v1/models/remote-smol")["id"] == "remote-smol"


def test_greedy_chat_equals_upstream_blocking_and_streamed(cluster):
    up, router, _ = cluster
    st, direct = chat(up, "default")
    assert st == 200
    want = direct["choices"][0]["message"]["content"]
    assert want
    st, routed = chat(router, "remote-smol")
    assert st == 200, routed
    assert routed["choices"][0]["message"]["content"] == want
    assert routed["model"] == "remote-smol"
    assert routed["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"]
    assert routed["choices"][0]["finish_reason"] == direct["choices"][0]["finish_reason"]
    ev = stream_events(router, "/v1/chat/completions",
                       {"model": "remote-smol", "messages": HELLO, "max_tokens": 24, "temperature": 0})
    assert ev[-1] == "[DONE]"
    assert streamed_text(ev) == want, ev
    # the same through the official client
    c = router.client()
    r = c.chat.completions.create(model="up/default", messages=HELLO, max_tokens=24, temperature=0)
    assert r.choices[0].message.content == want


def test_greedy_completion_equals_upstream(cluster):
    up, router, _ = cluster
    body = {"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}
    st, _, raw = up.request("POST", "/v1/completions", dict(body, model="default"))
    assert st == 200
    want = json.loads(raw)["choices"][0]["text"]
    st, _, raw = router.request("POST", "/v1/completions", dict(body, model="remote-smol"))
    assert st == 200, raw
    assert json.loads(raw)["choices"][0]["text"] == want
    ev = stream_events(router, "/v1/completions", dict(body, model="remote-smol"))
    assert streamed_text(ev, chat_kind=False) == want


def test_metrics_say_where_it_ran(cluster):
    _, router, _ = cluster
    before = router.metrics()
    assert chat(router, "remote-smol", max_tokens=2)[0] == 200
    assert chat(router, "default", max_tokens=2)[0] == 200
    m = router.metrics()
    assert sample(m, "rlai_route_requests_total", place="upstream:up") == \
        sample(before, "rlai_route_requests_total", place="upstream:up") + 1
    assert sample(m, "rlai_route_requests_total", place="local") >= \
        sample(before, "rlai_route_requests_total", place="local") + 1
    assert sample(m, "rlai_upstream_up", upstream="up") == 1
    assert m["types"]["rlai_upstream_requests_total"] == "counter"


def test_concurrent_streams_each_arrive_whole(cluster):
    # A streaming connection thread drives the remote transfers itself while
    # it waits (leader/follower, docs/REMOTE.md "What the route costs"); only
    # one does at a time, and it delivers the other streams' pieces too.
    # Streams to two upstreams and the local model at once: each complete.
    import threading
    up, router, _ = cluster
    st, direct = chat(up, "default")
    assert st == 200
    want = direct["choices"][0]["message"]["content"]
    st, local = chat(router, "default")
    assert st == 200
    want_local = local["choices"][0]["message"]["content"]
    jobs = [("remote-smol", want), ("bad-ok", "Hello from bad upstream"), ("remote-smol", want),
            ("bad-ok", "Hello from bad upstream"), ("default", want_local)]
    got = [None] * len(jobs)

    def run(i, model):
        ev = stream_events(router, "/v1/chat/completions",
                           {"model": model, "messages": HELLO, "max_tokens": 24, "temperature": 0})
        got[i] = (ev[-1] == "[DONE]", streamed_text(ev))

    for _ in range(3):
        ths = [threading.Thread(target=run, args=(i, m)) for i, (m, _) in enumerate(jobs)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(120)
        for (model, text), g in zip(jobs, got):
            assert g == (True, text), (model, g)


# ---------------------------------------------------------------- cancel

def test_client_disconnect_cancels_upstream(cluster):
    # (400 tokens: the upstream's KV pool also holds LoreMaster's pinned lore,
    # a prompt plus 1500 would wait for admission there)
    up, router, _ = cluster
    before = router.metrics()
    body = json.dumps({"model": "remote-smol", "messages": [{"role": "user", "content": "Tell me a very long story."}],
                       "max_tokens": 400, "temperature": 0, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", router.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + router.auth_bytes() +
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    buf = b""
    s.settimeout(120)
    while buf.count(b"data: ") < 5:
        c = s.recv(4096)
        assert c, buf
        buf += c
    assert up.get_json("/health")["running"] == 1          # it runs on the upstream
    assert router.get_json("/health")["running"] == 0      # not locally
    s.close()
    t0 = time.time()
    while up.get_json("/health")["running"] != 0:
        assert time.time() - t0 < 10, "the cancel did not reach the upstream"
        time.sleep(0.02)
    t0 = time.time()
    while sample(router.metrics(), "rlai_upstream_requests_total", upstream="up", result="cancelled") <= \
            sample(before, "rlai_upstream_requests_total", upstream="up", result="cancelled"):
        assert time.time() - t0 < 10
        time.sleep(0.05)


# ---------------------------------------------------------------- faults

def test_connection_refused_is_a_clear_error(cluster):
    _, router, _ = cluster
    t0 = time.time()
    st, j = chat(router, "down-x")
    assert st == 503, j
    assert "upstream 'down'" in j["error"]["message"] and "2 attempts" in j["error"]["message"]
    assert time.time() - t0 < 5
    ev = stream_events(router, "/v1/chat/completions", {"model": "down-x", "messages": HELLO})
    assert ev[-1] == "[DONE]" and "error" in ev[-2], ev


def test_500_then_success_is_retried(cluster):
    _, router, bad = cluster
    n = bad.hits("500once")
    st, j = chat(router, "bad-500once", messages=[{"role": "user", "content": "retry me"}])
    assert st == 200, j
    assert j["choices"][0]["message"]["content"] == "Hello from bad upstream"
    assert bad.hits("500once") == n + 2
    assert sample(router.metrics(), "rlai_upstream_retries_total", upstream="bad") >= 1


def test_persistent_500_and_429_give_up_after_bounded_retries(cluster):
    _, router, bad = cluster
    n = bad.hits("500")
    st, j = chat(router, "bad-500")
    assert st == 503, j
    assert "HTTP 500" in j["error"]["message"] and "upstream is broken" in j["error"]["message"]
    assert bad.hits("500") == n + 3                      # 1 + max_retries 2
    st, j = chat(router, "bad-429")
    assert st == 429, j
    st, j = chat(router, "bad-400")                      # a client error is not retried
    assert st == 400, j
    assert "bad parameter" in j["error"]["message"]
    assert bad.hits("400") == 1


def test_malformed_sse_is_an_error_not_a_hang(cluster):
    _, router, bad = cluster
    st, j = chat(router, "bad-malformed")
    assert st == 503, j
    assert "malformed" in j["error"]["message"]
    assert bad.hits("malformed") == 3


def test_slow_first_token_ends_at_the_deadline(cluster):
    _, router, bad = cluster
    t0 = time.time()
    st, j = chat(router, "bad-slow", timeout_ms=800)
    took = time.time() - t0
    assert st == 200, j
    assert j["choices"][0]["finish_reason"] == "timeout"
    assert took < 3, took
    # without a request deadline: first_token_timeout_ms per attempt, bounded retries, then 504
    t0 = time.time()
    st, j = chat(router, "bad-slow")
    assert st == 504, j
    assert "first token" in j["error"]["message"]
    assert time.time() - t0 < 3 * 1.5 + 2


def test_stall_and_early_close_mid_stream(cluster):
    _, router, bad = cluster
    for model, words in (("bad-stall", "stall_timeout_ms"), ("bad-short", "before [DONE]")):
        n = bad.hits(model[4:])
        t0 = time.time()
        ev = stream_events(router, "/v1/chat/completions", {"model": model, "messages": HELLO})
        assert time.time() - t0 < 6
        assert streamed_text(ev) == "Hello"
        assert ev[-1] == "[DONE]"
        err = ev[-2]
        assert "error" in err and words in err["error"]["message"], ev
        assert bad.hits(model[4:]) == n + 1            # no retry after the first token


def test_breaker_opens_and_half_opens(cluster):
    _, router, bad = cluster
    for _ in range(3):
        assert chat(router, "flaky-500")[0] == 503
    m = router.metrics()
    assert sample(m, "rlai_upstream_up", upstream="flaky") == 0
    assert sample(m, "rlai_upstream_breaker_state", upstream="flaky", state="open") == 1
    n = bad.hits("ok")
    t0 = time.time()
    st, j = chat(router, "flaky-ok")
    assert st == 503 and "circuit breaker open" in j["error"]["message"], j
    assert time.time() - t0 < 1
    assert bad.hits("ok") == n                          # refused without a request upstream
    time.sleep(1.6)
    st, j = chat(router, "flaky-ok")                    # the half-open trial
    assert st == 200, j
    m = router.metrics()
    assert sample(m, "rlai_upstream_up", upstream="flaky") == 1
    assert sample(m, "rlai_upstream_breaker_opens_total", upstream="flaky") >= 1


def test_ignore_eos_is_forwarded(cluster):
    # a short answer (HELLO ends well before 200 tokens) runs to max_tokens
    # through the route exactly as on the upstream directly
    up, router, _ = cluster
    st, natural = chat(up, "default", max_tokens=200)
    assert st == 200 and natural["choices"][0]["finish_reason"] == "stop", natural
    n = natural["usage"]["completion_tokens"] + 6
    st, direct = chat(up, "default", max_tokens=n, ignore_eos=True)
    assert st == 200, direct
    st, routed = chat(router, "remote-smol", max_tokens=n, ignore_eos=True)
    assert st == 200, routed
    assert routed["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"] == n
    assert routed["choices"][0]["finish_reason"] == "length"
    assert routed["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]


def test_logit_bias_is_forwarded(cluster):
    # a ban of the answer's first token changes the answer on the upstream,
    # and the route gives exactly what the upstream gives directly
    up, router, _ = cluster
    st, plain = chat(up, "default", logprobs=True, top_logprobs=1)
    assert st == 200, plain
    first = plain["choices"][0]["logprobs"]["content"][0]["token"]
    ids = subprocess.run([RLAI, "tokenize", "-m", str(MODEL), first], capture_output=True, text=True,
                         check=True).stdout.split()
    assert len(ids) == 1, (first, ids)
    st, direct = chat(up, "default", logit_bias={ids[0]: -100})
    assert st == 200, direct
    assert direct["choices"][0]["message"]["content"] != plain["choices"][0]["message"]["content"]
    st, routed = chat(router, "remote-smol", logit_bias={ids[0]: -100})
    assert st == 200, routed
    assert routed["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]


def test_prediction_is_forwarded(cluster):
    # a predicted output reaches the upstream (its drafts accepted there)
    # and changes nothing in the answer
    up, router, _ = cluster
    st, plain = chat(up, "default")
    assert st == 200, plain
    text = plain["choices"][0]["message"]["content"]
    st, routed = chat(router, "remote-smol", prediction={"type": "content", "content": text})
    assert st == 200, routed
    assert routed["choices"][0]["message"]["content"] == text
    assert routed["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0, routed["usage"]
    st, bad = chat(router, "remote-smol", prediction={"type": "content", "content": 5})
    assert st == 400 and bad["error"]["param"] == "prediction", bad


def test_n_choices_on_a_remote_model(cluster):
    # "n" > 1 on a remote model: each choice is its own upstream request
    # (seed + i), so choice i is the upstream's answer with that seed
    up, router, _ = cluster
    st, two = chat(router, "remote-smol", n=2, temperature=1.0, seed=11)
    assert st == 200, two
    assert [c["index"] for c in two["choices"]] == [0, 1]
    for i in range(2):
        st, direct = chat(up, "default", temperature=1.0, seed=11 + i)
        assert st == 200, direct
        assert two["choices"][i]["message"]["content"] == direct["choices"][0]["message"]["content"]


def test_https_upstream_with_its_own_ca(cluster):
    # an https upstream whose certificate a private CA signed (ca_file): the
    # stream arrives whole, also a burst of 3000 events at once (many TLS
    # records per read: libcurl drains what TLS buffered)
    _, router, _ = cluster
    st, j = chat(router, "tls-ok")
    assert st == 200, j
    assert j["choices"][0]["message"]["content"] == "Hello from bad upstream"
    ev = stream_events(router, "/v1/chat/completions", {"model": "tls-burst", "messages": HELLO})
    assert ev[-1] == "[DONE]"
    assert streamed_text(ev) == "".join(str(i % 10) for i in range(3000))
    st, _, raw = router.request("POST", "/v1/completions", {"model": "tls-burst", "prompt": "x"})
    assert st == 200, raw
    assert json.loads(raw)["choices"][0]["text"] == "".join(str(i % 10) for i in range(3000))


def test_https_upstream_not_trusted_is_a_clear_error(cluster):
    # without ca_file (the system store) and with another CA: refused at the
    # TLS handshake, a clear error at once, nothing hangs
    _, router, _ = cluster
    for model in ("tls-noca", "tls-wrongca"):
        t0 = time.monotonic()
        st, j = chat(router, model)
        assert st >= 500 and st != 504, (model, st, j)
        msg = j["error"]["message"].lower()
        assert "certificate" in msg and "ssl" in msg, (model, msg)
        assert "attempts" not in msg, msg        # not retried: it would fail the same way
        assert time.monotonic() - t0 < 5


def same_entries(got, want):
    assert [e["token"] for e in got] == [e["token"] for e in want]
    for g, w in zip(got, want):
        assert g["bytes"] == w["bytes"]
        assert abs(g["logprob"] - w["logprob"]) < 1e-9
        assert [t["token"] for t in g["top_logprobs"]] == [t["token"] for t in w["top_logprobs"]]
        assert all(abs(a["logprob"] - b["logprob"]) < 1e-9 for a, b in zip(g["top_logprobs"], w["top_logprobs"]))


def test_logprobs_equal_upstream(cluster):
    # the upstream's log-probabilities reach the client as the upstream gave
    # them: chat entries as they are, legacy completions arrays rebuilt
    up, router, _ = cluster
    kw = {"max_tokens": 8, "logprobs": True, "top_logprobs": 2}
    st, direct = chat(up, "default", **kw)
    assert st == 200, direct
    want = direct["choices"][0]["logprobs"]["content"]
    assert len(want) == direct["usage"]["completion_tokens"] and len(want[0]["top_logprobs"]) == 2
    st, routed = chat(router, "remote-smol", **kw)
    assert st == 200, routed
    same_entries(routed["choices"][0]["logprobs"]["content"], want)
    ev = stream_events(router, "/v1/chat/completions", dict(kw, model="remote-smol", messages=HELLO, temperature=0))
    got = [e for c in ev if isinstance(c, dict) and c.get("choices") and c["choices"][0].get("logprobs")
           for e in c["choices"][0]["logprobs"]["content"]]
    same_entries(got, want)

    body = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    st, _, raw = up.request("POST", "/v1/completions", dict(body, model="default"))
    assert st == 200
    want = json.loads(raw)["choices"][0]["logprobs"]
    st, _, raw = router.request("POST", "/v1/completions", dict(body, model="remote-smol"))
    assert st == 200, raw
    got = json.loads(raw)["choices"][0]["logprobs"]
    assert got["tokens"] == want["tokens"] and got["text_offset"] == want["text_offset"]
    assert all(abs(a - b) < 1e-9 for a, b in zip(got["token_logprobs"], want["token_logprobs"]))
    assert [sorted(t) for t in got["top_logprobs"]] == [sorted(t) for t in want["top_logprobs"]]
    ev = stream_events(router, "/v1/completions", dict(body, model="remote-smol"))
    lps = [c["choices"][0]["logprobs"] for c in ev if isinstance(c, dict) and c.get("choices")
           and c["choices"][0].get("logprobs")]
    assert [t for lp in lps for t in lp["tokens"]] == want["tokens"]
    assert [o for lp in lps for o in lp["text_offset"]] == want["text_offset"]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}


def streamed_calls(events):
    """Folds streamed tool_calls fragments by index, as OpenAI clients do."""
    calls, finish = {}, None
    for e in events:
        if not isinstance(e, dict) or not e.get("choices"):
            continue
        c = e["choices"][0]
        finish = c.get("finish_reason") or finish
        for tc in c.get("delta", {}).get("tool_calls") or []:
            d = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
            d["id"] = tc.get("id") or d["id"]
            fn = tc.get("function") or {}
            d["name"] += fn.get("name") or ""
            d["arguments"] += fn.get("arguments") or ""
    return calls, finish


def test_tools_are_forwarded_to_the_upstream(cluster):
    # tools, tool_choice and the messages (calls and results included) go to
    # the upstream as they are; its calls come back, blocking and streamed
    up, router, _ = cluster
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = {"messages": msgs, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 80}
    st, direct = chat(up, "default", **kw)
    assert st == 200, direct
    want = direct["choices"][0]["message"]["tool_calls"][0]["function"]
    st, routed = chat(router, "remote-smol", **kw)
    assert st == 200, routed
    c = routed["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None
    call = c["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["id"] and call["function"] == want
    ev = stream_events(router, "/v1/chat/completions", dict(kw, model="remote-smol", temperature=0))
    calls, finish = streamed_calls(ev)
    assert finish == "tool_calls"
    assert calls[0]["id"] and {"name": calls[0]["name"], "arguments": calls[0]["arguments"]} == want
    # the call and its result go back; the answer is text, as on the upstream
    msgs2 = msgs + [{"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": call["id"], "content": "{\"temperature\": 21}"}]
    kw2 = {"messages": msgs2, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 30}
    st, direct = chat(up, "default", **kw2)
    st2, routed = chat(router, "remote-smol", **kw2)
    assert st == st2 == 200, routed
    assert routed["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    assert not routed["choices"][0]["message"].get("tool_calls")
    # exactly what the client sent reaches the upstream
    st, j = chat(router, "bad-echo", **kw2)
    assert st == 200, j
    assert json.loads(j["choices"][0]["message"]["content"]) == {"messages": msgs2, "tools": [WEATHER]}
    # the official client sees a normal tool call
    r = router.client().chat.completions.create(model="remote-smol", temperature=0, **kw)
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    # the local model sent to an upstream on request: tools forwarded too
    st, j = chat(router, "default", route="remote", **kw)
    assert st == 200 and j["choices"][0]["message"]["tool_calls"][0]["function"] == want, j
    # legacy functions are not forwarded
    st, j = chat(router, "remote-smol", functions=[WEATHER["function"]])
    assert st == 400 and "functions" in j["error"]["message"], j


def test_image_parts_reach_a_remote_model(cluster):
    # OpenAI image_url content parts go to the upstream with the messages as
    # they are; a local model refuses them with a clear 400
    up, router, _ = cluster
    img = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode()
    msgs = [{"role": "system", "content": "You see screens."},
            {"role": "user", "content": [{"type": "text", "text": "What is on screen?"},
                                         {"type": "image_url", "image_url": {"url": img, "detail": "low"}}]}]
    st, j = chat(router, "bad-echo", messages=msgs)
    assert st == 200, j
    assert json.loads(j["choices"][0]["message"]["content"]) == {"messages": msgs, "tools": None}
    ev = stream_events(router, "/v1/chat/completions", {"model": "bad-echo", "messages": msgs})
    assert json.loads(streamed_text(ev))["messages"] == msgs
    for where, model in ((router, "default"), (up, "default")):
        st, j = chat(where, model, messages=msgs)
        assert st == 400 and "image_url parts go to remote models" in j["error"]["message"], j


def test_unsupported_features_are_refused(cluster):
    _, router, _ = cluster
    st, _, raw = router.request("POST", "/v1/completions", {"model": "remote-smol", "prompt": [1, 2, 3]})
    assert st in (400, 501), raw
    assert "not implemented" in json.loads(raw)["error"]["message"]


def test_router_keeps_serving_locally(cluster):
    up, router, _ = cluster
    st, a = chat(router, "default")
    st2, b = chat(up, "default")
    assert st == st2 == 200
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


# ---------------------------------------------------------------- wire protocol, plugins

def pipe_client(engine):
    return rtx_localai.RTXLocalAIClient("unix://" + str(engine.sock_path), timeout=120)


SCREEN = LORE and (Path(SHIPPED_PLUGINS) / "screen" / "manifest.json").exists()


@pytest.mark.skipif(not SCREEN, reason="screen plugin not built (tesseract/xcb/png/jpeg missing)")
def test_screen_analyze_reaches_remote_model(cluster):
    # screen.analyze with "model" naming a remote model: vision sends the
    # frame as a PNG data URL with the question (the echo upstream returns
    # what it got: the pixels must be the frame's); ocr sends the text
    from io import BytesIO
    from PIL import Image
    _, router, _ = cluster
    img = Image.new("RGB", (96, 64))
    img.putdata([((x * 7) % 256, (y * 11) % 256, (x * y) % 256) for y in range(64) for x in range(96)])
    buf = BytesIO()
    img.save(buf, format="PNG")
    b64 = base64.b64encode(buf.getvalue()).decode()
    q = "What does the screen show?"
    with pipe_client(router) as c:
        got = c.call("screen.analyze", {"question": q, "image": b64, "temperature": 0})   # auto: remote_vision
    assert got.data["mode"] == "vision" and got.data["model"] == "bad-echo"
    msgs = json.loads(got.data["answer"])["messages"]
    assert msgs[0]["role"] == "system" and msgs[-1]["role"] == "user"
    text, image = msgs[-1]["content"]
    assert text == {"type": "text", "text": q}
    url = image["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    sent = Image.open(BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert sent.size == img.size and sent.convert("RGB").tobytes() == img.tobytes()
    with pipe_client(router) as c:
        got = c.call("screen.analyze", {"question": q, "image": b64, "mode": "ocr", "temperature": 0})
    assert got.data["mode"] == "ocr"
    msgs = json.loads(got.data["answer"])["messages"]
    assert isinstance(msgs[-1]["content"], str) and q in msgs[-1]["content"]


def test_wire_protocol_reaches_remote_model(cluster):
    up, router, _ = cluster
    with pipe_client(up) as c:
        want = c.chat(HELLO, max_tokens=24, temperature=0)
    with pipe_client(router) as c:
        got = c.chat(HELLO, max_tokens=24, temperature=0, model="remote-smol")
        assert got.text == want.text
        assert got.metrics.where == "upstream:up"
        assert got.metrics.gen_tokens == want.metrics.gen_tokens
        local = c.chat(HELLO, max_tokens=4, temperature=0)
        assert local.metrics.where == "local"
        # streamed, with a cancel that reaches the upstream
        s = c.chat([{"role": "user", "content": "Tell me a very long story."}], stream=True, max_tokens=400,
                   temperature=0, model="remote-smol")
        for i, _piece in enumerate(s):
            if i >= 4:
                break
        assert up.get_json("/health")["running"] == 1
        s.cancel()
        g = s.finish()
        assert g.stop == "cancelled"
        t0 = time.time()
        while up.get_json("/health")["running"] != 0:
            assert time.time() - t0 < 10, "the cancel did not reach the upstream"
            time.sleep(0.02)
        # errors name the upstream; what a remote model cannot do is refused
        with pytest.raises(rtx_localai.RTXLocalAIError) as ei:
            c.chat(HELLO, max_tokens=4, model="down-x")
        assert "upstream 'down'" in str(ei.value)
        # top_logprobs: the upstream's, as text entries (PROTOCOL.md 6.1),
        # equal to what the upstream answers over HTTP
        lg = c.chat(HELLO, max_tokens=8, temperature=0, model="remote-smol", top_logprobs=2)
        with pytest.raises(rtx_localai.RTXLocalAIError):
            c.chat(HELLO, max_tokens=4, model="no-such-model")
    st, direct = chat(up, "default", max_tokens=8, logprobs=True, top_logprobs=2)
    assert st == 200, direct
    want = direct["choices"][0]["logprobs"]["content"]
    assert lg.tokens == [] and len(lg.logprobs) == len(want) == direct["usage"]["completion_tokens"]
    assert lg.text == direct["choices"][0]["message"]["content"] == "".join(e["text"] for e in lg.logprobs)
    for g, w in zip(lg.logprobs, want):
        assert g["token"] is None and g["text"] == w["token"] and g["bytes"] == bytes(w["bytes"])
        assert abs(g["logprob"] - w["logprob"]) < 1e-9
        assert [t for t, _ in g["top"]] == [t["token"] for t in w["top_logprobs"]]
        assert all(abs(a - b["logprob"]) < 1e-9 for (_, a), b in zip(g["top"], w["top_logprobs"]))


def test_route_override_and_stats(cluster):
    up, router, _ = cluster
    before = sample(router.metrics(), "rlai_route_spills_total", reason="asked")
    st, j = chat(router, "default", route="remote", max_tokens=8)
    assert st == 200, j
    st2, direct = chat(up, "default", max_tokens=8)
    assert j["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    assert sample(router.metrics(), "rlai_route_spills_total", reason="asked") == before + 1
    st, j = chat(router, "remote-smol", route="local")
    assert st == 400, j
    st, j = chat(router, "default", route="elsewhere")
    assert st == 400 and "elsewhere" in j["error"]["message"], j
    out = subprocess.run([RLAI, "stats", "--endpoint", "unix://" + str(router.sock_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "upstreams.up.breaker" in out.stdout and "upstreams.down.requests" in out.stdout


@pytest.mark.skipif(not LORE, reason="loremaster plugin not built")
def test_loremaster_talk_reaches_remote_model(cluster):
    up, router, _ = cluster
    params = {"character": "pell", "message": "Good evening. Who are you?", "temperature": 0, "max_tokens": 24}
    with pipe_client(up) as c:
        want = c.call("loremaster.talk", params)         # the upstream's own LoreMaster, local model
    before = sample(router.metrics(), "rlai_route_requests_total", place="upstream:up")
    gens = sample(up.metrics(), "rlai_generations_total", transport="http")
    with pipe_client(router) as c:
        got = c.call("loremaster.talk", params)          # the router's LoreMaster, model remote-smol
    assert got.data["reply"] == want.data["reply"]
    assert sample(router.metrics(), "rlai_route_requests_total", place="upstream:up") == before + 1
    assert sample(up.metrics(), "rlai_generations_total", transport="http") == gens + 1
