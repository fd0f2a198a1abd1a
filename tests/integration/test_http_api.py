"""OpenAI API coverage of the HTTP front with the `openai` client: logprobs
(chat and completions, streamed and not), /v1/embeddings, per-request
"created", completions "echo"."""
import base64
import json
import math
import time

import numpy as np
import pytest

from test_http import HELLO, MODEL_ID, Engine, error_of, openai  # noqa: F401  (shared helpers)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = Engine(tmp_path_factory.mktemp("http-api"))
    yield e
    rc = e.stop()
    assert rc == 0, e.read_log()


# ---------------------------------------------------------------- logprobs

def check_chat_entries(content, n_top):
    assert content, "no logprobs entries"
    for ent in content:
        assert ent.logprob <= 0
        assert bytes(ent.bytes).decode("utf-8", errors="replace") == ent.token
        assert len(ent.top_logprobs) == n_top
        tl = [t.logprob for t in ent.top_logprobs]
        assert tl == sorted(tl, reverse=True)
        assert sum(math.exp(v) for v in tl) <= 1 + 1e-4
        # the sampled token is never more probable than the best alternative
        if n_top:
            assert ent.logprob <= tl[0] + 1e-5


def test_chat_logprobs_greedy(engine):
    c = engine.client()
    r = c.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=12, temperature=0,
                                  logprobs=True, top_logprobs=4)
    ch = r.choices[0]
    content = ch.logprobs.content
    assert len(content) == r.usage.completion_tokens
    check_chat_entries(content, 4)
    # greedy: each token is the most probable one, and the texts add up
    for ent in content:
        assert ent.token == ent.top_logprobs[0].token
        assert abs(ent.logprob - ent.top_logprobs[0].logprob) < 1e-6
    assert "".join(e.token for e in content) == ch.message.content
    # the same request without logprobs gives the same text, and logprobs null
    r2 = c.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=12, temperature=0)
    assert r2.choices[0].message.content == ch.message.content
    assert r2.choices[0].logprobs is None


def test_chat_logprobs_streamed_equal_blocking(engine):
    c = engine.client()
    kw = dict(model=MODEL_ID, messages=HELLO, max_tokens=10, temperature=0.9, seed=1234,
              logprobs=True, top_logprobs=2)
    r = c.chat.completions.create(**kw)
    got = []
    text = ""
    for ch in c.chat.completions.create(stream=True, **kw):
        if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
            got += ch.choices[0].logprobs.content
        if ch.choices and ch.choices[0].delta.content:
            text += ch.choices[0].delta.content
    want = r.choices[0].logprobs.content
    assert text == r.choices[0].message.content
    assert [e.token for e in got] == [e.token for e in want]
    assert all(abs(a.logprob - b.logprob) < 1e-5 for a, b in zip(got, want))
    check_chat_entries(got, 2)


NOTICE = [{"role": "system", "content": "You reply with JSON only."},
          {"role": "user", "content": "Copy the title and the first sentence of this notice into JSON.\n\n"
           "Title: Harbour closing hours\nThe harbour gates of Port Elsmere close at nine in the evening from "
           "the first of October until the end of March. Boats that arrive later must wait at the outer buoy."}]
NOTICE_FORMAT = {"type": "json_schema", "json_schema": {"name": "notice", "schema": {
    "type": "object", "properties": {"title": {"type": "string"}, "first_sentence": {"type": "string"}},
    "required": ["title", "first_sentence"], "additionalProperties": False}}}


def test_structured_output_with_logprobs_drafts(engine):
    """A json_schema request with logprobs drafts (docs/SPECULATIVE.md): the
    content and every logprob are those of the same request with spec off,
    streamed too, and the copied sentence was mostly accepted drafts."""
    c = engine.client()
    kw = dict(model=MODEL_ID, messages=NOTICE, max_tokens=120, temperature=0, logprobs=True, top_logprobs=3,
              response_format=NOTICE_FORMAT)
    off = c.chat.completions.create(extra_body={"spec": "off"}, **kw)
    on = c.chat.completions.create(extra_body={"spec": "ngram"}, **kw)
    assert set(json.loads(on.choices[0].message.content)) == {"title", "first_sentence"}
    assert on.choices[0].message.content == off.choices[0].message.content
    assert on.choices[0].finish_reason == off.choices[0].finish_reason == "stop"
    lo, ln = off.choices[0].logprobs.content, on.choices[0].logprobs.content
    assert [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in ln] == \
        [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in lo]
    check_chat_entries(ln, 3)
    assert off.usage.completion_tokens_details.accepted_prediction_tokens == 0
    assert on.usage.completion_tokens_details.accepted_prediction_tokens > 10, on.usage
    got, text = [], ""
    for ch in c.chat.completions.create(stream=True, extra_body={"spec": "ngram"}, **kw):
        if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
            got += ch.choices[0].logprobs.content
        if ch.choices and ch.choices[0].delta.content:
            text += ch.choices[0].delta.content
    assert text == off.choices[0].message.content
    assert [(e.token, e.logprob) for e in got] == [(e.token, e.logprob) for e in lo]


def test_chat_logprobs_errors(engine):
    for body, param in [({"logprobs": "yes"}, "logprobs"),
                        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                        ({"top_logprobs": 2}, "top_logprobs")]:
        st, _, raw = engine.request("POST", "/v1/chat/completions",
                                    dict(messages=HELLO, max_tokens=2, **body))
        assert st == 400, raw
        assert error_of(raw)["param"] == param


def token_ids(text):
    """The default model's token ids of text (rlai tokenize: no BOS)."""
    import subprocess
    from test_http import MODEL, RLAI
    out = subprocess.run([RLAI, "tokenize", "-m", str(MODEL), text], capture_output=True, text=True, check=True)
    return [int(t) for t in out.stdout.split()]


def test_logit_bias(engine):
    """OpenAI's logit_bias: -100 bans a token at every position, +100 makes
    it the greedy choice, logprobs stay the raw model's, and the streamed
    answer equals the blocking one; bad maps are a 400 naming the field."""
    c = engine.client()
    msgs = [{"role": "user", "content": "Repeat this sentence twice: The keeper of Harrow Bay lighthouse "
                                        "counted forty ships every night."}]
    kw = dict(model=MODEL_ID, messages=msgs, max_tokens=40, temperature=0)
    plain = c.chat.completions.create(**kw, logprobs=True, top_logprobs=3)
    text = plain.choices[0].message.content
    (ships,) = token_ids(" ships")
    assert " ships" in text
    banned = c.chat.completions.create(**kw, logprobs=True, top_logprobs=3, logit_bias={str(ships): -100})
    btext = banned.choices[0].message.content
    assert " ships" not in btext and btext != text
    # the first position is the same logits: the same raw top logprobs
    assert ([(t.token, t.logprob) for t in banned.choices[0].logprobs.content[0].top_logprobs] ==
            [(t.token, t.logprob) for t in plain.choices[0].logprobs.content[0].top_logprobs])
    streamed = "".join(ch.choices[0].delta.content or "" for ch in
                       c.chat.completions.create(**kw, stream=True, logit_bias={str(ships): -100}) if ch.choices)
    assert streamed == btext
    (banana,) = token_ids(" banana")
    up = c.completions.create(model=MODEL_ID, prompt="The keeper counted", max_tokens=3, temperature=0,
                              logit_bias={str(banana): 100})
    assert up.choices[0].text.startswith(" banana")
    for bias, needle in [({"x": 1}, "not a token id"), ({"99999999": 1}, "not a token id in [0, 49152)"),
                         ({str(ships): 101}, "must be a number in [-100, 100]"),
                         ({str(ships): "1"}, "must be a number in [-100, 100]"), ([1], "must be an object"),
                         ({str(i): 1 for i in range(1025)}, "at most 1024 entries")]:
        st, _, raw = engine.request("POST", "/v1/chat/completions", dict(messages=HELLO, max_tokens=2, logit_bias=bias))
        assert st == 400, raw
        err = error_of(raw)
        assert err["param"] == "logit_bias" and needle in err["message"], err


def test_prediction(engine):
    """OpenAI's predicted outputs: the answer is the same with a prediction
    (right, edited, as text parts, streamed), a right one is mostly accepted
    (usage), and bad or oversized predictions are refused naming the field."""
    c = engine.client()
    msgs = [{"role": "user", "content": "Tell me about your favourite season."}]
    kw = dict(model=MODEL_ID, messages=msgs, max_tokens=48, temperature=0)
    plain = c.chat.completions.create(**kw)
    text = plain.choices[0].message.content
    a0 = plain.usage.completion_tokens_details.accepted_prediction_tokens
    right = c.chat.completions.create(**kw, prediction={"type": "content", "content": text})
    assert right.choices[0].message.content == text
    a1 = right.usage.completion_tokens_details.accepted_prediction_tokens
    assert a1 >= right.usage.completion_tokens // 2 and a1 > a0, (a0, a1)
    words = text.split(" ")
    edited = " ".join(words[:6] + ["purple", "elephants"] + words[8:])
    parts = [{"type": "text", "text": edited[:20]}, {"type": "text", "text": edited[20:]}]
    r = c.chat.completions.create(**kw, prediction={"type": "content", "content": parts})
    assert r.choices[0].message.content == text
    assert r.usage.completion_tokens_details.accepted_prediction_tokens > a0
    streamed = "".join(ch.choices[0].delta.content or "" for ch in
                       c.chat.completions.create(**kw, stream=True, prediction={"type": "content", "content": text})
                       if ch.choices)
    assert streamed == text
    comp = c.completions.create(model=MODEL_ID, prompt="The keeper counted", max_tokens=8, temperature=0)
    st, _, raw = engine.request("POST", "/v1/completions", dict(prompt="The keeper counted", max_tokens=8, temperature=0,
                                                              prediction={"type": "content", "content": comp.choices[0].text}))
    assert st == 200 and json.loads(raw)["choices"][0]["text"] == comp.choices[0].text, raw
    for pred, needle in [("text", "must be {"), ({"type": "text", "content": "x"}, "must be {"),
                         ({"type": "content"}, "must be {"), ({"type": "content", "content": [{"text": "x"}]}, "parts"),
                         ({"type": "content", "content": [{"type": "text", "text": 3}]}, "parts")]:
        st, _, raw = engine.request("POST", "/v1/chat/completions", dict(messages=HELLO, max_tokens=2, prediction=pred))
        assert st == 400, raw
        err = error_of(raw)
        assert err["param"] == "prediction" and needle in err["message"], err
    st, _, raw = engine.request("POST", "/v1/chat/completions",
                                dict(messages=HELLO, max_tokens=2, prediction={"type": "content", "content": " a" * 9000}))
    assert st == 413 and error_of(raw)["message"] == "prediction has 9000 tokens; the limit is 8192", raw
    assert c.chat.completions.create(**kw).choices[0].message.content == text   # still serving


def test_n_choices(engine):
    """"n" > 1: n choices of one prompt, generated together; choice i is the
    single request with seed + i (chat and completions, blocking and
    streamed); the prompt counts once in usage; a list prompt's choices come
    prompt by prompt; bad values and unsupported mixes are a 400."""
    c = engine.client()
    msgs = [{"role": "user", "content": "Name a colour and say why you like it."}]
    kw = dict(model=MODEL_ID, messages=msgs, max_tokens=12, temperature=1.0, seed=77)
    r = c.chat.completions.create(**kw, n=3)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    texts = [ch.message.content for ch in r.choices]
    for i in range(3):
        one = c.chat.completions.create(**dict(kw, seed=77 + i))
        assert one.choices[0].message.content == texts[i], i
        assert r.choices[i].finish_reason == one.choices[0].finish_reason
    assert len(set(texts)) >= 2, texts
    single = c.chat.completions.create(**kw)
    assert r.usage.prompt_tokens == single.usage.prompt_tokens
    assert r.usage.completion_tokens >= 3 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    parts, roles = {}, {}
    for ch in c.chat.completions.create(**kw, n=3, stream=True):
        for choice in ch.choices:
            if choice.delta.role:
                roles[choice.index] = choice.delta.role
            parts[choice.index] = parts.get(choice.index, "") + (choice.delta.content or "")
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"}
    assert [parts[i] for i in range(3)] == texts
    # logprobs per choice
    lp = c.chat.completions.create(**kw, n=2, logprobs=True, top_logprobs=1)
    for ch in lp.choices:
        assert "".join(e.token for e in ch.logprobs.content) == ch.message.content
    # completions: one prompt, then a list of two prompts x n=2
    ck = dict(model=MODEL_ID, max_tokens=8, temperature=1.0, seed=5)
    cr = c.completions.create(prompt="Once upon a time", n=2, **ck)
    assert [ch.index for ch in cr.choices] == [0, 1]
    assert cr.choices[1].text == c.completions.create(prompt="Once upon a time", **dict(ck, seed=6)).choices[0].text
    lr = c.completions.create(prompt=["Once upon a time", "The dragon"], n=2, **ck)
    assert [ch.index for ch in lr.choices] == [0, 1, 2, 3]
    assert lr.choices[2].text == c.completions.create(prompt="The dragon", **dict(ck, seed=7)).choices[0].text
    assert lr.choices[1].text == cr.choices[1].text
    for body, needle in [(dict(n=0), "'n' must be an integer in [1, 16]"), (dict(n=17), "[1, 16]"),
                         (dict(n="2"), "[1, 16]"), (dict(n=1.5), "[1, 16]")]:
        st, _, raw = engine.request("POST", "/v1/chat/completions", dict(messages=HELLO, max_tokens=2, **body))
        assert st == 400, raw
        err = error_of(raw)
        assert err["param"] == "n" and needle in err["message"], err
    st, _, raw = engine.request("POST", "/v1/completions", dict(prompt=["a"] * 16, n=5, max_tokens=2))
    assert st == 400 and "at most 64 choices" in error_of(raw)["message"], raw


def test_completions_logprobs(engine):
    c = engine.client()
    r = c.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=8,
                             temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0
    for i in range(1, n):
        assert lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1])
    for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 3
        assert v <= 0
        assert abs(max(top.values()) - v) < 1e-6     # greedy picks the best
    # streamed: the same arrays, offsets continuing across chunks
    toks, offs = [], []
    for ch in c.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=8,
                                   temperature=0, logprobs=3, stream=True):
        if ch.choices and ch.choices[0].logprobs:
            toks += ch.choices[0].logprobs.tokens
            offs += ch.choices[0].logprobs.text_offset
    assert toks == lp.tokens and offs == lp.text_offset


# ---------------------------------------------------------------- created, echo

def test_created_is_request_time(engine):
    c = engine.client()
    time.sleep(1.2)
    t0 = int(time.time())
    r = c.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=2, temperature=0)
    assert t0 <= r.created <= int(time.time())
    chunks = list(c.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2, stream=True))
    assert all(t0 <= ch.created <= int(time.time()) for ch in chunks)


def test_completions_echo(engine):
    c = engine.client()
    prompt = "Once upon a time"
    plain = c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0)
    r = c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0, echo=True)
    assert r.choices[0].text == prompt + plain.choices[0].text
    s = "".join(ch.choices[0].text for ch in c.completions.create(
        model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0, echo=True, stream=True) if ch.choices)
    assert s == r.choices[0].text


def test_completions_echo_logprobs(engine):
    """echo + logprobs: the prompt tokens' log-probabilities come first (the
    first token's null), then the completion's; offsets index the echoed
    text. Scoring prompt + greedy continuation this way (what evaluation
    harnesses do for loglikelihood) gives back the logprobs reported while
    generating it, and the continuation is greedy under its own top-1."""
    c = engine.client()
    prompt = "Once upon a time"
    gen = c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0, logprobs=1,
                               extra_body={"ignore_eos": True})
    glp = gen.choices[0].logprobs
    r = c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0, logprobs=2, echo=True,
                             extra_body={"ignore_eos": True})
    ch = r.choices[0]
    lp = ch.logprobs
    n_p = r.usage.prompt_tokens
    assert ch.text == prompt + gen.choices[0].text
    assert len(lp.tokens) == n_p + r.usage.completion_tokens == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens) == ch.text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    for t, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert t <= 0 and 1 <= len(top) <= 2 and max(top.values()) >= t - 1e-6
    # the completion part is what a plain logprobs request reports
    assert lp.tokens[n_p:] == glp.tokens
    assert all(abs(a - b) < 1e-5 for a, b in zip(lp.token_logprobs[n_p:], glp.token_logprobs))
    # score prompt + continuation: the continuation's logprobs come back, all greedy
    sc = c.completions.create(model=MODEL_ID, prompt=ch.text, max_tokens=1, temperature=0, logprobs=1,
                              echo=True).choices[0].logprobs
    assert sc.tokens[:len(lp.tokens)] == lp.tokens
    cont = slice(n_p, len(lp.tokens))
    assert all(abs(a - b) < 1e-4 for a, b in zip(sc.token_logprobs[cont], lp.token_logprobs[cont]))
    assert all(abs(t - max(top.values())) < 1e-6 for t, top in zip(sc.token_logprobs[cont], sc.top_logprobs[cont]))
    # streamed: the echo chunk carries the prompt's entries, the rest follow
    toks, lps, text = [], [], ""
    for chunk in c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0, logprobs=2,
                                      echo=True, stream=True, extra_body={"ignore_eos": True}):
        for x in chunk.choices:
            text += x.text
            if x.logprobs:
                toks += x.logprobs.tokens
                lps += x.logprobs.token_logprobs
    assert text == ch.text and toks == lp.tokens
    assert lps[0] is None and all(abs(a - b) < 1e-6 for a, b in zip(lps[1:], lp.token_logprobs[1:]))
    # max_tokens 0 with echo: the prompt alone, scored (OpenAI's legacy form)
    z = c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=0, logprobs=2, echo=True)
    assert z.choices[0].text == prompt and z.choices[0].finish_reason == "length"
    assert z.usage.completion_tokens == 0 and z.usage.prompt_tokens == n_p
    assert z.choices[0].logprobs.tokens == lp.tokens[:n_p]
    assert z.choices[0].logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:n_p], abs=1e-5)
    zs = [x for chunk in c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=0, logprobs=0, echo=True,
                                              stream=True) for x in chunk.choices]
    assert "".join(x.text for x in zs) == prompt and zs[-1].finish_reason == "length"
    assert sum((x.logprobs.tokens for x in zs if x.logprobs), []) == lp.tokens[:n_p]
    st, _, raw = engine.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 0})
    assert st == 400 and "echo" in error_of(raw)["message"]
    # a list of prompts: each choice has its own prompt entries
    rr = c.completions.create(model=MODEL_ID, prompt=[prompt, "The capital of France is"], max_tokens=2,
                              temperature=0, logprobs=0, echo=True)
    for x in rr.choices:
        assert x.logprobs.token_logprobs[0] is None and "".join(x.logprobs.tokens) == x.text
    assert rr.choices[0].logprobs.token_logprobs[1:n_p] == pytest.approx(lp.token_logprobs[1:n_p], abs=1e-5)


# ---------------------------------------------------------------- embeddings

def cos(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_embeddings_openai_client(engine):
    c = engine.client()
    texts = ["The cat sat on the mat.", "A cat was sitting on the mat.", "Quarterly revenue grew by 4 percent."]
    r = c.embeddings.create(model=MODEL_ID, input=texts)
    assert r.object == "list" and r.model == MODEL_ID
    assert [d.index for d in r.data] == [0, 1, 2]
    v = [np.array(d.embedding) for d in r.data]
    assert all(len(x) == 576 for x in v)
    assert all(abs(np.linalg.norm(x) - 1) < 1e-5 for x in v)
    assert cos(v[0], v[1]) > cos(v[0], v[2])
    # batch equals singles
    for t, x in zip(texts, v):
        one = np.array(c.embeddings.create(model=MODEL_ID, input=t).data[0].embedding)
        assert np.max(np.abs(one - x)) < 1e-6
    assert r.usage.prompt_tokens == r.usage.total_tokens > 10
    # base64 (the openai client's default when numpy is around): same floats
    st, _, raw = engine.request("POST", "/v1/embeddings", {"input": texts[0], "encoding_format": "base64"})
    assert st == 200, raw
    b = np.frombuffer(base64.b64decode(json.loads(raw)["data"][0]["embedding"]), dtype="<f4")
    assert np.max(np.abs(b - v[0])) < 1e-6
    # token ids: the same as the text's tokens
    st, _, raw = engine.request("POST", "/v1/embeddings", {"input": [[1, 2, 3]]})
    assert st == 200 and json.loads(raw)["usage"]["prompt_tokens"] == 3
    two = c.embeddings.create(model=MODEL_ID, input=[[1, 2, 3], [4, 5]])
    assert len(two.data) == 2 and two.usage.prompt_tokens == 5
    one = c.embeddings.create(model=MODEL_ID, input=[1, 2, 3])
    assert np.max(np.abs(np.array(one.data[0].embedding) - np.array(two.data[0].embedding))) < 1e-6


def test_embeddings_errors(engine):
    cases = [({}, "input"), ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [1.5]}, "input"),
             ({"input": [[99999999]]}, "input"), ({"input": "x", "dimensions": 8}, "dimensions"),
             ({"input": "x", "encoding_format": "hex"}, "encoding_format"), ({"input": {"a": 1}}, "input"),
             ({"input": "x", "pooling": "max"}, "pooling")]
    for body, param in cases:
        st, _, raw = engine.request("POST", "/v1/embeddings", body)
        assert st == 400, (body, raw)
        assert error_of(raw)["param"] == param, (body, raw)
    st, _, raw = engine.request("POST", "/v1/embeddings", {"input": "x", "model": "nope"})
    assert st == 404
    st, _, raw = engine.request("POST", "/v1/embeddings", {"input": "x", "dimensions": 576})
    assert st == 200
    st, _, raw = engine.request("GET", "/v1/embeddings")
    assert st == 405


def test_embeddings_while_generating(engine):
    """Embeddings run between scheduler steps: the same vector while streams
    are decoding, and the streams' greedy text unchanged."""
    c = engine.client()
    base = np.array(c.embeddings.create(model=MODEL_ID, input="hello world").data[0].embedding)
    want = c.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=40, temperature=0,
                                     ).choices[0].message.content
    import threading
    out = []

    def gen():
        out.append(c.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=40,
                                             temperature=0).choices[0].message.content)
    ts = [threading.Thread(target=gen) for _ in range(2)]
    for t in ts:
        t.start()
    vecs = [np.array(c.embeddings.create(model=MODEL_ID, input="hello world").data[0].embedding)
            for _ in range(5)]
    for t in ts:
        t.join()
    assert out == [want, want]
    for v in vecs:
        assert np.max(np.abs(v - base)) < 1e-5


# ---------------------------------------------------------------- list prompts

def test_completions_list_prompt(engine):
    c = engine.client()
    prompts = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time"]
    singles = [c.completions.create(model=MODEL_ID, prompt=p, max_tokens=6, temperature=0).choices[0].text
               for p in prompts]
    r = c.completions.create(model=MODEL_ID, prompt=prompts, max_tokens=6, temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert [ch.text for ch in r.choices] == singles
    assert all(ch.finish_reason in ("stop", "length") for ch in r.choices)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # token-id lists, with echo and logprobs per choice
    ids = [[1, 504, 3575], [1, 28, 30]]
    r2 = c.completions.create(model=MODEL_ID, prompt=ids, max_tokens=3, temperature=0, logprobs=1)
    assert len(r2.choices) == 2 and all(len(ch.logprobs.tokens) >= 1 for ch in r2.choices)
    e = c.completions.create(model=MODEL_ID, prompt=prompts[:2], max_tokens=4, temperature=0, echo=True)
    assert [ch.text[:len(p)] for ch, p in zip(e.choices, prompts)] == prompts[:2]
    # streamed: chunks carry their index; the texts add up to the same
    texts = {0: "", 1: "", 2: ""}
    fins = {}
    for ch in c.completions.create(model=MODEL_ID, prompt=prompts, max_tokens=6, temperature=0, stream=True,
                                   stream_options={"include_usage": True}):
        for x in ch.choices:
            texts[x.index] += x.text
            if x.finish_reason:
                fins[x.index] = x.finish_reason
        if ch.usage:
            assert ch.usage.completion_tokens == r.usage.completion_tokens
    assert [texts[i] for i in range(3)] == singles
    assert sorted(fins) == [0, 1, 2]
    st, _, raw = engine.request("POST", "/v1/completions", {"prompt": ["a", 5], "max_tokens": 2})
    assert st == 400 and "prompt[1]" in error_of(raw)["message"]
    st, _, raw = engine.request("POST", "/v1/completions", {"prompt": ["a"] * 17, "max_tokens": 2})
    assert st == 400


# ---------------------------------------------------------------- 64-bit seeds

def test_seed_keeps_64_bits(engine):
    """2^53 and 2^53 + 1 are the same double: read from the text they are two
    seeds. The same seed reproduces; out-of-range seeds are refused."""
    c = engine.client()

    def gen(seed):
        return c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=24, temperature=1.5,
                                    top_p=1, seed=seed, extra_body={"top_k": 0, "min_p": 0}).choices[0].text
    a, b = gen(2 ** 53), gen(2 ** 53 + 1)
    assert a != b
    assert gen(2 ** 53 + 1) == b
    assert gen(2 ** 64 - 1) != gen(2 ** 64 - 2)
    assert gen(-1) == gen(2 ** 64 - 1)        # two's complement
    for bad in (2 ** 64, -(2 ** 63) - 1, 1.5, "7"):
        st, _, raw = engine.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1, "seed": bad})
        assert st == 400 and error_of(raw)["param"] == "seed", (bad, raw)


# ---------------------------------------------------------------- request log

def test_request_log_lines(engine):
    import re
    c = engine.client()
    r = c.completions.create(model=MODEL_ID, prompt="Hello there", max_tokens=3, temperature=0)
    st, _, _ = engine.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0})
    assert st == 400
    st, _, _ = engine.request("GET", "/v1/no-such-route-xyz")
    assert st == 404
    time.sleep(0.3)
    log = engine.read_log()
    line_re = re.compile(r'^rlai http: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "(\S+) (\S+)" (\d{3}|-) '
                         r'prompt_tokens=(\d+) completion_tokens=(\d+) ms=([0-9.]+)', re.M)
    lines = line_re.findall(log)
    ok = [m for m in lines if m[1] == "/v1/completions" and m[2] == "200"
          and int(m[3]) == r.usage.prompt_tokens and int(m[4]) == r.usage.completion_tokens]
    assert ok, log[-3000:]
    assert float(ok[-1][5]) > 0
    assert any(m[1] == "/v1/completions" and m[2] == "400" for m in lines)
    assert any(m[0] == "GET" and m[1] == "/v1/no-such-route-xyz" and m[2] == "404" for m in lines)
