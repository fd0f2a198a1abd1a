"""The engine's API key on tcp:// (ZeroMQ PLAIN) through the SDK: refused
without or with a wrong key, served with api_key= or RLAI_API_KEY; ipc://
and unix:// need none (see conftest.py: the engines get API_KEY)."""
from __future__ import annotations

import pytest

import rtx_localai as rl
from rtx_localai import RTXLocalAIClient

from conftest import API_KEY


def test_tcp_refused_without_or_with_a_wrong_key(engine, monkeypatch):
    monkeypatch.delenv("RLAI_API_KEY", raising=False)
    with pytest.raises(rl.AuthenticationFailed, match="requires an API key"):
        RTXLocalAIClient(engine.tcp, connect_timeout=10)
    with pytest.raises(rl.AuthenticationFailed, match="refused the API key"):
        RTXLocalAIClient(engine.tcp, api_key="wrong", connect_timeout=10)
    assert issubclass(rl.AuthenticationFailed, rl.EngineConnectionError)


def test_tcp_served_with_the_key(engine, monkeypatch):
    monkeypatch.delenv("RLAI_API_KEY", raising=False)
    with RTXLocalAIClient(engine.tcp, api_key=API_KEY, timeout=120) as c:
        assert c.info["engine"]
        assert c.generate("Hello", max_tokens=2, temperature=0).text is not None
    monkeypatch.setenv("RLAI_API_KEY", API_KEY)
    with RTXLocalAIClient(engine.tcp, timeout=120) as c:  # the default: RLAI_API_KEY
        assert c.info["engine"]


@pytest.mark.parametrize("kind", ["ipc", "unix"])
def test_local_endpoints_need_no_key(engine, monkeypatch, kind):
    monkeypatch.delenv("RLAI_API_KEY", raising=False)
    with RTXLocalAIClient(engine.endpoint(kind), timeout=120) as c:
        assert c.info["engine"]
