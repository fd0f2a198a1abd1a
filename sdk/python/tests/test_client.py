"""RTXLocalAIClient against a real `rlai serve` (see conftest.py)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

import rtx_localai as rl
from rtx_localai import RTXLocalAIClient

from conftest import MODEL, RLAI, free_port, serve_help

PROMPT = ("The history of the Roman Empire is long and complicated. It began when Augustus "
          "became the first emperor and")
FRANCE = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


# ------------------------------------------------------------ basics


def test_connect_reads_the_engine_description(client):
    info = client.info
    assert info["version"] == 1
    assert info["model"] and info["engine"].startswith("rtx-localai")
    assert info["limits"]["max_prompt_tokens"] == 600
    assert info["limits"]["max_frame_bytes"] == 4 << 20
    assert client.hello("again")["version"] == 1


@pytest.mark.parametrize("kind", ["ipc", "tcp", "unix"])
def test_stream_pieces_join_to_the_generated_text(engine, kind):
    with RTXLocalAIClient(engine.endpoint(kind), timeout=120) as c:
        g = c.generate(PROMPT, max_tokens=24, temperature=0)
        s = c.stream_generate(PROMPT, max_tokens=24, temperature=0)
        pieces = list(s)
    assert len(pieces) > 5 and all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == g.text == s.text
    assert s.tokens == g.tokens and len(g.tokens) == 24
    assert g.stop == s.stop == "max_tokens"
    m = g.metrics
    assert m is not None and s.metrics is not None
    assert m.prompt_tokens == len(c_tokens(engine, PROMPT)) and m.gen_tokens == 24
    assert m.ttft_ms > 0 and m.queue_ms >= 0 and m.decode_tps > 0 and m.prefill_tps > 0
    # The second run of the same prompt is served partly from the prefix cache.
    assert s.metrics.reused_tokens > 0 and s.metrics.prompt_tokens == m.prompt_tokens


def c_tokens(engine, text):
    with RTXLocalAIClient(engine.ipc) as c:
        return c.tokenize(text)


def test_stop_string_and_eog(client):
    g = client.generate(PROMPT, max_tokens=40, stop=[" Roman"])
    assert g.stop == "stop_string" and " Roman" not in g.text
    full = client.generate(PROMPT, max_tokens=40)
    assert full.text.startswith(g.text) and " Roman" in full.text
    c = client.chat(FRANCE, max_tokens=64)
    assert c.stop == "eog" and c.metrics.gen_tokens < 64


def test_chat(client):
    g = client.chat(FRANCE, max_tokens=24)
    assert isinstance(g, rl.Generation)
    assert "Paris" in g.text and g.stop in ("eog", "max_tokens")
    assert g.metrics.prompt_tokens > 20  # the chat template was applied
    s = client.chat([("user", FRANCE[0]["content"])], stream=True, max_tokens=24)
    assert isinstance(s, rl.Stream)
    assert "".join(s) == g.text
    system = {"role": "system", "content": "You are terse."}
    one = client.chat([system, *FRANCE], max_tokens=8)
    multi = client.chat([system, *FRANCE, {"role": "assistant", "content": "Paris."},
                         {"role": "user", "content": "And of Italy?"}], max_tokens=24)
    # Every message went through the template: the prompt grew by at least their text.
    extra = client.tokenize("Paris. And of Italy?", add_special=False)
    assert multi.metrics.prompt_tokens >= one.metrics.prompt_tokens + len(extra)
    assert multi.text and multi.metrics.gen_tokens > 0


def test_tokenize_matches_the_cli(client):
    text = "Hello, wörld! <|im_end|> 123"
    cli = subprocess.run([RLAI, "tokenize", "-m", str(MODEL), text], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    cli_ids = [int(x) for x in cli.stdout.split()]
    # `rlai tokenize`: no BOS, special tokens not parsed.
    assert client.tokenize(text, add_special=False, parse_special=False) == cli_ids
    with_special = client.tokenize(text)  # add_special=True: BOS/EOS only as the model wants
    assert with_special[len(with_special) - len(cli_ids):] == cli_ids and len(with_special) - len(cli_ids) <= 2
    parsed = client.tokenize("<|im_end|>", add_special=False, parse_special=True)
    assert len(parsed) == 1
    assert len(client.tokenize("<|im_end|>", add_special=False)) > 1
    assert client.tokenize("", add_special=False) == []


def test_stats_fields(client):
    before = client.stats()
    for key in ("engine", "requests_total", "requests_inflight", "running", "queue_length", "errors_total",
                "tokens_generated", "prompt_tokens", "prompt_tokens_reused", "kv_blocks", "model"):
        assert key in before, key
    assert set(before["kv_blocks"]) >= {"total", "used", "cached", "pinned", "free"}
    assert before["model"]["name"] == client.info["model"] and before["model"]["context"] == 1024
    client.generate("Hello", max_tokens=5, ignore_eos=True)
    after = client.stats()
    assert after["requests_total"] >= before["requests_total"] + 2
    assert after["tokens_generated"] >= before["tokens_generated"] + 5


def test_commands_is_a_list(client):
    cmds = client.commands()
    assert isinstance(cmds, list)
    for c in cmds:
        assert isinstance(c["name"], str) and c["name"]
    if "--no-plugins" in serve_help():  # the shared engine runs without plugins
        assert cmds == [] and client.plugins() == []


# ------------------------------------------------------------ errors


def test_unknown_command_is_not_found(client):
    with pytest.raises(rl.NotFound) as ei:
        client.call("no.such_command", {"x": 1})
    e = ei.value
    assert e.code == 6 and e.name == "NOT_FOUND" and "no.such_command" in e.message
    assert isinstance(e, rl.RTXLocalAIError) and e.request_id is not None
    with pytest.raises(rl.NotFound):
        list(client.stream_call("no.such_command"))
    assert client.stats()["requests_inflight"] == 0  # the client stays usable


def test_too_long_prompt_is_too_large(client):
    with pytest.raises(rl.TooLarge) as ei:
        client.generate("word " * 1000, max_tokens=4)
    assert ei.value.code == 4 and ei.value.name == "TOO_LARGE" and "600" in ei.value.message
    with pytest.raises(rl.TooLarge):
        client.chat([{"role": "user", "content": "word " * 1000}])


def test_over_the_frame_limit_is_refused_locally(client):
    with pytest.raises(rl.TooLarge):
        client.generate("a" * (5 << 20))
    # libzmq would have dropped the connection for such a message: it was never sent.
    assert client.generate("Hi", max_tokens=2).metrics.gen_tokens >= 1


def test_bad_values_raise_bad_request(client):
    with pytest.raises(rl.BadRequest) as ei:
        client.generate("Hi", temperature=-1.0)
    assert ei.value.code == 3 and "temperature" in ei.value.message
    with pytest.raises(rl.BadRequest):
        client.generate("Hi", top_p=2.0)
    with pytest.raises(rl.BadRequest):
        client.generate("Hi", stop=[""])
    with pytest.raises(rl.BadRequest):
        client.chat([{"role": "user", "content": "nul \x00 byte"}])
    with pytest.raises(TypeError):
        client.generate("Hi", max_tokenz=3)


# ------------------------------------------------------------ cancel, concurrency, timeouts


@pytest.mark.parametrize("kind", ["ipc", "unix"])
def test_cancel_mid_stream_ends_the_stream(engine, kind):
    with RTXLocalAIClient(engine.endpoint(kind), timeout=60) as c:
        s = c.stream_generate("Once upon a time", max_tokens=400, ignore_eos=True)
        got = []
        for piece in s:
            got.append(piece)
            if len(got) == 3:
                assert s.cancel() is True
        assert s.done and s.stop == "cancelled"
        assert s.metrics is not None and 3 <= s.metrics.gen_tokens < 400
        assert s.cancel() is False          # already ended
        assert c.cancel(10_000) is False    # never existed: NOT_FOUND -> False
        assert c.stats()["requests_inflight"] == 0


def test_closing_a_stream_cancels_it(client):
    with client.stream_generate("Once upon a time", max_tokens=400, ignore_eos=True) as s:
        next(s)
    assert s.done and s.stop == "cancelled"
    # A dropped stream is cancelled too (at the client's next I/O).
    s2 = client.stream_generate("Once upon a time", max_tokens=400, ignore_eos=True)
    next(s2)
    del s2
    client.generate("Hi", max_tokens=1)
    deadline = time.monotonic() + 10
    while client.stats()["requests_inflight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.stats()["requests_inflight"] == 0


def test_interleaved_streams(client):
    p2 = "Write a short poem about the sea:"
    ref1 = client.generate(PROMPT, max_tokens=16).text
    ref2 = client.generate(p2, max_tokens=16).text
    a = client.stream_generate(PROMPT, max_tokens=16)
    b = client.stream_generate(p2, max_tokens=16)
    ta, tb = [], []
    for x, y in zip(a, b):      # read them alternately
        ta.append(x)
        tb.append(y)
    ta.extend(a)
    tb.extend(b)
    assert "".join(ta) == ref1 and "".join(tb) == ref2


def test_threads_share_a_client(client):
    ref = client.generate(PROMPT, max_tokens=12).text
    out, errs = [], []

    def work():
        try:
            out.append(client.generate(PROMPT, max_tokens=12).text)
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errs and out == [ref] * 4


def test_timeout_raises_and_cancels(client):
    t0 = time.monotonic()
    with pytest.raises(rl.RequestTimeout) as ei:
        client.generate("Once upon a time", max_tokens=800, ignore_eos=True, timeout=0.0)
    assert isinstance(ei.value, TimeoutError) and time.monotonic() - t0 < 2
    deadline = time.monotonic() + 10
    while client.stats()["requests_inflight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.stats()["requests_inflight"] == 0  # the timed-out request was cancelled


def test_busy_when_too_many_in_flight(client):
    limit = client.info["limits"]["max_inflight_per_client"]
    streams = [client.stream_generate("Once upon a time", max_tokens=200, ignore_eos=True) for _ in range(limit)]
    with pytest.raises(rl.Busy) as ei:
        client.generate("Hi", max_tokens=1)
    assert ei.value.code == 5
    for s in streams:
        s.close()
    assert client.generate("Hi", max_tokens=1).metrics is not None


def test_context_manager_closes(engine):
    with RTXLocalAIClient(engine.ipc) as c:
        assert not c.closed
    assert c.closed
    with pytest.raises(rl.EngineConnectionError):
        c.stats()
    c.close()  # idempotent


# ------------------------------------------------------------ absent or dying engine


def test_absent_engine_raises_quickly(tmp_path, monkeypatch):
    cases = [f"ipc://{tmp_path}/none.zmq", f"unix://{tmp_path}/none.sock", f"tcp://127.0.0.1:{free_port()}"]
    # A socket file left by a dead engine: the path exists, nobody listens.
    stale = tmp_path / "stale.zmq"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()
    cases += [f"ipc://{stale}", f"unix://{stale}"]
    for ep in cases:
        t0 = time.monotonic()
        with pytest.raises(rl.EngineNotRunning) as ei:
            RTXLocalAIClient(ep, connect_timeout=3)
        assert isinstance(ei.value, ConnectionError)
        assert time.monotonic() - t0 < 3.5, ep
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "nothing-here"))
    with pytest.raises(rl.EngineNotRunning, match="engine.zmq"):
        RTXLocalAIClient()  # the default endpoint


def test_default_endpoint_reaches_the_engine(engine, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(engine.dir))
    with RTXLocalAIClient() as c:
        assert c.endpoint == engine.ipc and c.stats()["engine"]


@pytest.mark.parametrize("kind", ["ipc", "tcp", "unix"])
def test_engine_killed_mid_stream(private_engine, kind):
    with RTXLocalAIClient(private_engine.endpoint(kind), timeout=60) as c:
        s = c.stream_generate("Once upon a time", max_tokens=800, ignore_eos=True)
        next(s)
        private_engine.proc.kill()
        t0 = time.monotonic()
        with pytest.raises(rl.EngineDisconnected):
            for _ in s:
                pass
        assert time.monotonic() - t0 < 5
        assert s.done and isinstance(s.error, rl.EngineDisconnected)
        with pytest.raises(rl.EngineConnectionError):
            c.stats()


def test_frozen_engine_is_noticed_by_heartbeats(private_engine):
    with RTXLocalAIClient(private_engine.ipc, timeout=60) as c:
        s = c.stream_generate("Once upon a time", max_tokens=800, ignore_eos=True)
        next(s)
        os.kill(private_engine.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            with pytest.raises(rl.EngineDisconnected):
                for _ in s:
                    pass
            elapsed = time.monotonic() - t0
        finally:
            os.kill(private_engine.proc.pid, signal.SIGCONT)
        assert elapsed < 5, elapsed  # heartbeat timeout 1.5 s


def test_engine_stopping_ends_streams_with_shutdown(private_engine):
    with RTXLocalAIClient(private_engine.unix, timeout=60) as c:
        s = c.stream_generate("Once upon a time", max_tokens=800, ignore_eos=True)
        next(s)
        private_engine.proc.send_signal(signal.SIGTERM)
        with pytest.raises(rl.Shutdown) as ei:
            for _ in s:
                pass
        assert ei.value.code == 11
        assert private_engine.proc.wait(30) == 0


def test_timeout_ms_ends_with_stop_timeout(client):
    g = client.generate(PROMPT, max_tokens=400, ignore_eos=True, timeout_ms=1)
    assert g.stop == "timeout" and g.timed_out and not g.cancelled
    assert g.metrics.gen_tokens < 400
    assert not client.generate(PROMPT, max_tokens=4, ignore_eos=True).timed_out
    with pytest.raises(ValueError):
        client.generate(PROMPT, timeout_ms=1 << 32)


def test_speculative_decoding_option(client):
    task = [{"role": "user", "content": "Repeat this sentence twice: Mira the smith of Oakvale forged "
             "the silver key that opens the north gate."}]
    off = client.chat(task, max_tokens=40, spec="off")
    on = client.chat(task, max_tokens=40, spec="ngram", spec_max_draft=8)
    assert on.text == off.text
    assert off.metrics.drafted_tokens == 0
    assert 0 < on.metrics.accepted_tokens <= on.metrics.drafted_tokens
    with pytest.raises(ValueError, match="not implemented"):
        client.chat(task, spec="self")
    with pytest.raises(ValueError):
        client.chat(task, spec_max_draft=0)


def test_top_logprobs_per_token(client):
    g = client.generate("The capital of France is", max_tokens=6, temperature=0, ignore_eos=True, top_logprobs=3)
    assert len(g.logprobs) == len(g.tokens) == 6
    for tok, e in zip(g.tokens, g.logprobs):
        assert e["token"] == tok and e["logprob"] <= 0
        assert len(e["top"]) == 3
        lps = [lp for _, lp in e["top"]]
        assert lps == sorted(lps, reverse=True)
        assert e["top"][0][0] == tok and abs(e["top"][0][1] - e["logprob"]) < 1e-6   # greedy: the best
    plain = client.generate("The capital of France is", max_tokens=6, temperature=0, ignore_eos=True)
    assert plain.tokens == g.tokens and plain.logprobs == []
    with pytest.raises(ValueError):
        client.generate("x", top_logprobs=21)
def test_logit_bias_bans_and_favours_tokens(client):
    plain = client.generate("The capital of France is", max_tokens=8, temperature=0, ignore_eos=True)
    first = plain.tokens[0]
    banned = client.generate("The capital of France is", max_tokens=8, temperature=0, ignore_eos=True,
                             logit_bias={first: -100})
    assert first not in banned.tokens and banned.tokens != plain.tokens
    (fav,) = client.tokenize(" banana", add_special=False)
    up = client.generate("The capital of France is", max_tokens=2, temperature=0, logit_bias={str(fav): 100})
    assert up.tokens[0] == fav
    with pytest.raises(rl.BadRequest) as ei:   # outside the vocabulary: the engine refuses it
        client.generate("Hi", max_tokens=2, logit_bias={10**9: 1})
    assert "logit_bias" in ei.value.message


def test_prediction_drafts_the_same_answer(client):
    prompt = "<|im_start|>user\nTell me about your favourite season.<|im_end|>\n<|im_start|>assistant\n"
    kw = dict(max_tokens=40, temperature=0, ignore_eos=True)
    plain = client.generate(prompt, **kw)
    pred = client.generate(prompt, prediction=plain.text, **kw)
    assert pred.tokens == plain.tokens and pred.text == plain.text
    assert pred.metrics.accepted_tokens >= 20 and pred.metrics.accepted_tokens > plain.metrics.accepted_tokens
    off = client.generate(prompt, prediction=plain.text, spec="off", **kw)
    assert off.tokens == plain.tokens and off.metrics.drafted_tokens == 0
    with pytest.raises(rl.TooLarge) as ei:
        client.generate(prompt, prediction=" a" * 9000, **kw)
    assert "prediction has 9000 tokens" in ei.value.message


def test_prompt_logprobs(client):
    """prompt_logprobs: one entry per prompt token (the first without a
    distribution), in frames of their own before the text; a long prompt
    spans several frames. Scoring prompt + greedy continuation gives back
    the logprobs reported while generating it."""
    prompt = "The capital of France is"
    g = client.generate(prompt, max_tokens=2, temperature=0, ignore_eos=True, top_logprobs=2, prompt_logprobs=True)
    ids = client.tokenize(prompt)
    assert [e["token"] for e in g.prompt_logprobs] == ids
    assert g.prompt_logprobs[0]["logprob"] is None and g.prompt_logprobs[0]["top"] == []
    assert all(e["logprob"] <= 0 and len(e["top"]) == 2 for e in g.prompt_logprobs[1:])
    plain = client.generate(prompt, max_tokens=2, temperature=0, ignore_eos=True, top_logprobs=0)
    assert plain.tokens == g.tokens and plain.prompt_logprobs == []
    sc = client.generate(prompt + g.text, max_tokens=1, temperature=0, top_logprobs=0, prompt_logprobs=True)
    cont = sc.prompt_logprobs[len(ids):]
    assert [e["token"] for e in cont] == g.tokens
    assert all(abs(a["logprob"] - b["logprob"]) < 1e-4 for a, b in zip(cont, g.logprobs))
    long_text = " ".join(["the lamp was lit at dusk and put out at dawn"] * 40)
    lg = client.generate(long_text, max_tokens=1, temperature=0, top_logprobs=0, prompt_logprobs=True)
    assert [e["token"] for e in lg.prompt_logprobs] == client.tokenize(long_text)
    assert len(lg.prompt_logprobs) > 256
    with pytest.raises(ValueError, match="top_logprobs"):
        client.generate(prompt, prompt_logprobs=True)


def test_response_format_json_schema(client):
    schema = {"type": "object", "properties": {"country": {"type": "string", "maxLength": 30},
                                               "capital": {"type": "string", "maxLength": 30}},
              "required": ["country", "capital"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}}
    g = client.chat(FRANCE, max_tokens=80, temperature=0, response_format=rf)
    obj = json.loads(g.text)
    assert set(obj) == {"country", "capital"} and all(isinstance(v, str) for v in obj.values())
    assert g.stop == "eog"
    j = client.generate(PROMPT, max_tokens=60, temperature=0, response_format={"type": "json_object"})
    assert j.stop in ("eog", "max_tokens") and j.text.startswith("{")
    if j.stop == "eog":
        assert isinstance(json.loads(j.text), dict)
    with pytest.raises(rl.BadRequest) as ei:
        client.chat(FRANCE, max_tokens=8, response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "integer", "not": {"const": 3}}}})
    assert "'not' is not supported" in str(ei.value)


def test_drafts_under_a_schema_and_with_logprobs(client):
    """Structured output and logprobs requests draft too (docs/SPECULATIVE.md):
    over the wire the text, and every logprob, are the same with and without
    speculation, and a copying answer is mostly drafted."""
    notice = ("Copy the title and the first sentence of this notice into JSON.\n\nTitle: Harbour closing hours\n"
              "The harbour gates of Port Elsmere close at nine in the evening from the first of October until "
              "the end of March. Boats that arrive later must wait at the outer buoy.")
    schema = {"type": "object", "properties": {"title": {"type": "string"}, "first_sentence": {"type": "string"}},
              "required": ["title", "first_sentence"], "additionalProperties": False}
    task = [{"role": "system", "content": "You reply with JSON only."}, {"role": "user", "content": notice}]
    rf = {"type": "json_schema", "json_schema": {"name": "notice", "schema": schema}}
    runs = {spec: client.chat(task, max_tokens=120, temperature=0, response_format=rf, top_logprobs=2, spec=spec)
            for spec in ("off", "ngram")}
    off, on = runs["off"], runs["ngram"]
    assert off.stop == on.stop == "eog"
    assert set(json.loads(on.text)) == {"title", "first_sentence"}
    assert on.text == off.text and on.tokens == off.tokens
    assert on.logprobs == off.logprobs and len(on.logprobs) == len(on.tokens)
    assert off.metrics.drafted_tokens == 0
    assert 10 < on.metrics.accepted_tokens <= on.metrics.drafted_tokens
