"""The encoder and decoder against the test vectors of proto/PROTOCOL.md
(section 10), error mapping and option checks. No engine needed."""
from __future__ import annotations

import re
from pathlib import Path

import msgpack
import pytest

import rtx_localai as rl
from rtx_localai.protocol import decode_frame, default_pipe_endpoint, default_zmq_endpoint, encode_request
from rtx_localai.results import Metrics

PROTOCOL_MD = Path(__file__).resolve().parents[3] / "proto" / "PROTOCOL.md"


def vectors():
    if not PROTOCOL_MD.exists():
        pytest.skip(f"{PROTOCOL_MD} not found (tests run from a checkout)")
    text = PROTOCOL_MD.read_text()
    out = {}
    for name, body in re.findall(r"```hex name=(\w+)\n(.*?)```", text, re.S):
        out[name] = bytes.fromhex(body)
    assert len(out) >= 13, sorted(out)
    return out


REQUESTS = {
    "hello": ("hello", 1, {"client": "rlai-cli/0.1"}),
    "generate": ("generate", 2, {"prompt": "Hello", "max_tokens": 64, "temperature": 0.5, "top_k": 40,
                                 "top_p": 0.75, "min_p": 0.0625, "repeat_penalty": 1.125,
                                 "presence_penalty": 0.25, "frequency_penalty": -0.5, "seed": 42,
                                 "ignore_eos": True, "stop": ["\n\n", "User:"]}),
    "chat": ("chat", 3, {"messages": [{"role": "system", "content": "Be brief."}, ("user", "Hi")],
                         "max_tokens": 16}),
    "call": ("call", 4, {"command": "models.list", "params": '{"all":true}'}),
    "cancel": ("cancel", 5, {"target": 2}),
    "commands": ("commands", 6, {}),
    "stats": ("stats", 7, {}),
    "tokenize": ("tokenize", 8, {"text": "Hi <|im_end|>", "add_special": False, "parse_special": True}),
}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_requests_encode_to_the_vectors(name):
    type_, id_, fields = REQUESTS[name]
    assert encode_request(type_, id_, fields) == vectors()[name]


def test_field_order_is_canonical_whatever_the_input_order():
    f = dict(reversed(list(REQUESTS["generate"][2].items())))
    assert encode_request("generate", 2, f) == vectors()["generate"]


def test_defaults_are_omitted():
    # ignore_eos False, add_special True, parse_special False and None are the defaults: not written.
    a = encode_request("generate", 9, {"prompt": "x", "ignore_eos": False, "seed": None})
    assert msgpack.unpackb(a) == {"v": 1, "id": 9, "type": "generate", "prompt": "x"}
    b = encode_request("tokenize", 9, {"text": "x", "add_special": True, "parse_special": False})
    assert msgpack.unpackb(b) == {"v": 1, "id": 9, "type": "tokenize", "text": "x"}
    c = encode_request("generate", 9, {"prompt": "x", "temperature": 1, "stop": "END"})
    raw = msgpack.unpackb(c)
    assert raw["temperature"] == 1.0 and isinstance(raw["temperature"], float) and raw["stop"] == ["END"]
    assert b"\xcb" in c  # ints given for float fields are written as float64


def test_bad_options_are_refused_before_sending():
    with pytest.raises(TypeError, match="unknown generation option"):
        encode_request("generate", 1, {"prompt": "x", "max_token": 3})
    with pytest.raises(TypeError):
        encode_request("generate", 1, {"prompt": "x", "ignore_eos": 1})
    with pytest.raises(TypeError):
        encode_request("generate", 1, {"prompt": "x", "max_tokens": 2.5})
    with pytest.raises(ValueError):
        encode_request("generate", 1, {"prompt": "x", "max_tokens": -1})
    with pytest.raises(TypeError):
        encode_request("generate", 1, {"prompt": b"bytes"})
    with pytest.raises(TypeError):
        encode_request("chat", 1, {"messages": ["just a string"]})
    with pytest.raises(TypeError, match="unknown field"):
        encode_request("stats", 1, {"verbose": True})


def test_logit_bias_is_a_map_of_token_ids():
    # int or digit-str keys (OpenAI's JSON) become uint keys; values float64
    m = msgpack.unpackb(encode_request("generate", 4, {"prompt": "x", "logit_bias": {"7761": -100, 12: 2.5}}),
                        raw=False, strict_map_key=False)
    assert m["logit_bias"] == {7761: -100.0, 12: 2.5}
    assert "logit_bias" not in msgpack.unpackb(encode_request("generate", 4, {"prompt": "x", "logit_bias": {}}))
    for bad, exc in (([1], TypeError), ({"a": 1}, TypeError), ({-1: 1}, ValueError), ({1: 101}, ValueError),
                     ({1: "1"}, TypeError), ({i: 1 for i in range(1025)}, ValueError)):
        with pytest.raises(exc):
            encode_request("generate", 4, {"prompt": "x", "logit_bias": bad})


def test_prediction_is_a_str():
    m = msgpack.unpackb(encode_request("generate", 4, {"prompt": "x", "prediction": "int count;"}), raw=False)
    assert m["prediction"] == "int count;"
    assert "prediction" not in msgpack.unpackb(encode_request("generate", 4, {"prompt": "x", "prediction": ""}))
    with pytest.raises(TypeError):
        encode_request("generate", 4, {"prompt": "x", "prediction": b"x"})
    with pytest.raises(ValueError):
        encode_request("generate", 4, {"prompt": "x", "prediction": "x" * ((1 << 20) + 1)})


def test_call_deadline_is_an_optional_uint():
    m = msgpack.unpackb(encode_request("call", 3, {"command": "x.y", "timeout_ms": 1500}), raw=False)
    assert m["timeout_ms"] == 1500 and m["command"] == "x.y"
    assert "timeout_ms" not in msgpack.unpackb(encode_request("call", 3, {"command": "x.y"}), raw=False)
    for bad in (0, -5, 86400001, 1.5, "100"):
        with pytest.raises((TypeError, ValueError)):
            encode_request("call", 3, {"command": "x.y", "timeout_ms": bad})


def test_oversized_request_raises_too_large_locally():
    with pytest.raises(rl.TooLarge) as ei:
        encode_request("generate", 1, {"prompt": "a" * (4 << 20)})
    assert ei.value.code == 4 and ei.value.name == "TOO_LARGE"


def test_frames_decode():
    v = vectors()
    tok = decode_frame(v["token"])
    assert tok == {"v": 1, "id": 2, "type": "token", "text": " wörld", "tokens": [1917, 300]}
    res = decode_frame(v["result"])
    assert res["data"] == {"tokens": [1, 300, -1]}
    done = decode_frame(v["done_metrics"])
    m = Metrics.from_wire(done["metrics"])
    assert m == Metrics(queue_ms=0.5, ttft_ms=12.25, prefill_tps=1024.0, decode_tps=48.5,
                        prompt_tokens=5, gen_tokens=3, reused_tokens=0)
    assert decode_frame(v["done"]) == {"v": 1, "id": 5, "type": "done", "stop": ""}
    err = rl.error_from_frame(decode_frame(v["error"]))
    assert isinstance(err, rl.BadRequest) and isinstance(err, rl.RTXLocalAIError)
    assert (err.code, err.name, err.message, err.request_id) == (3, "BAD_REQUEST", "unknown message type 'foo'", 9)
    assert str(err) == "BAD_REQUEST (3): unknown message type 'foo'"


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01\x02\x03", b"\x81\xa1v\x01",
                                  msgpack.packb({"v": 2, "id": 1, "type": "done"}),
                                  msgpack.packb({"v": 1, "id": 1, "type": "done"}) + b"\x00"])
def test_bad_frames_raise_protocol_error(data):
    with pytest.raises(rl.ProtocolError):
        decode_frame(data)


def test_every_protocol_code_has_its_class():
    names = {1: "BAD_FRAME", 2: "BAD_VERSION", 3: "BAD_REQUEST", 4: "TOO_LARGE", 5: "BUSY", 6: "NOT_FOUND",
             7: "CANCELLED", 8: "CONTEXT_FULL", 9: "ENGINE", 10: "DUPLICATE_ID", 11: "SHUTDOWN",
             12: "INTERNAL", 13: "NOT_IMPLEMENTED", 14: "TIMEOUT"}
    # The table of section 8 lists exactly these.
    table = dict(re.findall(r"^\| (\d+)\s+\| `([A-Z_]+)`", PROTOCOL_MD.read_text(), re.M)) if PROTOCOL_MD.exists() else {}
    if table:
        assert {int(k): v for k, v in table.items()} == names
    assert set(rl.ERROR_CLASSES) == set(names)
    for code, name in names.items():
        e = rl.error_from_frame({"v": 1, "id": 4, "type": "error", "code": code, "name": name, "msg": "m"})
        assert type(e) is rl.ERROR_CLASSES[code] and e.code == code and e.name == name
    assert rl.ERROR_CLASSES[6] is rl.NotFound and rl.ERROR_CLASSES[4] is rl.TooLarge
    assert rl.ERROR_CLASSES[8] is rl.ContextFull and rl.ERROR_CLASSES[11] is rl.Shutdown
    # An unknown code is treated like INTERNAL but keeps what was sent.
    e = rl.error_from_frame({"v": 1, "id": 4, "type": "error", "code": 77, "name": "NEW_THING", "msg": ""})
    assert type(e) is rl.InternalError and (e.code, e.name) == (77, "NEW_THING")


def test_exception_hierarchy():
    assert issubclass(rl.EngineNotRunning, ConnectionError) and issubclass(rl.EngineDisconnected, ConnectionError)
    assert issubclass(rl.EngineNotRunning, rl.RTXLocalAIError)
    assert issubclass(rl.RequestTimeout, TimeoutError)
    assert issubclass(rl.NotFound, rl.EngineErrorFrame)


def test_default_endpoints(monkeypatch):
    import os
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    assert default_zmq_endpoint() == "ipc:///run/user/1234/rlai/engine.zmq"
    assert default_pipe_endpoint() == "unix:///run/user/1234/rlai/engine.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_zmq_endpoint() == f"ipc:///tmp/rlai-{os.getuid()}/engine.zmq"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/dir")  # not absolute: the fallback, as the C client does
    assert default_pipe_endpoint() == f"unix:///tmp/rlai-{os.getuid()}/engine.sock"
