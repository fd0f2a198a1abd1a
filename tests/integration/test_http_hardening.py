"""Hardening of the HTTP front (issue #11, items 3, 4, 9, 10): cross-site
requests and CORS, slowloris limits, strict JSON, half-close. A real `rlai
serve` on the default model, spoken to with raw sockets and urllib."""
import json
import socket
import threading
import time

import pytest

from test_http import HELLO, Engine, error_of, sample  # noqa: F401  (shared helpers)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = Engine(tmp_path_factory.mktemp("hard"))
    yield e
    rc = e.stop()
    assert rc == 0, e.read_log()


def raw_post(port, path, body, headers=b"Content-Type: application/json\r\n"):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n" % path.encode() + headers +
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return s


def read_all(s, timeout=120):
    s.settimeout(timeout)
    buf = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return buf
        buf += chunk
        if buf.endswith(b"data: [DONE]\n\n\r\n") or b"0\r\n\r\n" in buf[-7:]:
            return buf


def wait_running(engine, n, limit):
    t0 = time.time()
    while engine.get_json("/health")["running"] != n:
        if time.time() - t0 > limit:
            return False
        time.sleep(0.02)
    return True


# ---------------------------------------------------------------- 10. half-close

def test_half_close_keeps_the_stream(engine):
    """shutdown(SHUT_WR) after the request is not a disconnect: the whole
    SSE stream still arrives."""
    want = engine.client().chat.completions.create(model="default", messages=HELLO, max_tokens=40,
                                                   temperature=0).choices[0].message.content
    body = json.dumps({"messages": HELLO, "max_tokens": 40, "temperature": 0, "stream": True}).encode()
    s = raw_post(engine.port, "/v1/chat/completions", body)
    s.shutdown(socket.SHUT_WR)
    raw = read_all(s)
    s.close()
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    assert b"data: [DONE]" in raw, raw[-300:]
    text = ""
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            ch = json.loads(line[6:])
            assert "error" not in ch, ch
            text += ch["choices"][0]["delta"].get("content") or ""
    assert text == want
    # Non-streaming too: the JSON answer arrives after the half-close.
    body = json.dumps({"messages": HELLO, "max_tokens": 40, "temperature": 0}).encode()
    s = raw_post(engine.port, "/v1/chat/completions", body)
    s.shutdown(socket.SHUT_WR)
    raw = read_all(s)
    s.close()
    # The server probes a half-closed client with an interim 100 (Continue),
    # which HTTP/1.1 clients skip; then the answer.
    if raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"):
        raw = raw[len(b"HTTP/1.1 100 Continue\r\n\r\n"):]
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    js = raw.split(b"\r\n\r\n", 1)[1]
    assert json.loads(js)["choices"][0]["message"]["content"] == want


def test_real_close_still_cancels(engine):
    before = engine.metrics()
    for stream in (True, False):
        body = json.dumps({"messages": [{"role": "user", "content": "Tell me a very long story about the sea."}],
                           "max_tokens": 1500, "temperature": 0, "stream": stream, "ignore_eos": True}).encode()
        s = raw_post(engine.port, "/v1/chat/completions", body)
        assert wait_running(engine, 1, 30)
        time.sleep(0.3)
        s.close()
        assert wait_running(engine, 0, 10), f"stream={stream}: the closed client's request was not cancelled"
    after = engine.metrics()
    # Both ended early: far fewer tokens than 2 x 1500.
    grown = sample(after, "rlai_tokens_generated_total", transport="http") - \
        sample(before, "rlai_tokens_generated_total", transport="http")
    assert grown < 1500, grown
