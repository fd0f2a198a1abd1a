"""Plugin commands through the SDK: a real `rlai serve --plugins DIR` with
the LoreMaster plugin of the build tree (skipped when this build has no
plugin host or the plugin is not built)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import rtx_localai as rl
from rtx_localai import RTXLocalAIClient

from conftest import RLAI, Engine, serve_help

# The repository's helper that swaps LoreMaster's sample pack for a tiny one
# (tests/integration/tiny_lore.py): these tests need characters, not lore.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "integration"))
from tiny_lore import plugins_with_tiny_lore  # noqa: E402


def plugins_dir() -> Path:
    env = os.environ.get("RLAI_PLUGIN_DIR")
    if env:
        return Path(env)
    return Path(RLAI).resolve().parent.parent / "plugins"


@pytest.fixture(scope="module")
def lore_engine(tmp_path_factory):
    if "--plugins" not in serve_help():
        pytest.skip("this rlai has no plugin host (`rlai serve --help` has no --plugins)")
    d = plugins_dir()
    lm = d / "loremaster"
    if not (lm / "manifest.json").exists() or not (lm / "libloremaster.so").exists():
        pytest.skip(f"the LoreMaster plugin is not built in {d} (ninja plugins/loremaster/libloremaster.so)")
    e = Engine(tmp_path_factory.mktemp("lore"), plugins=plugins_with_tiny_lore(d, tmp_path_factory.mktemp("plugins")))
    yield e
    assert e.stop() == 0, e.log()


@pytest.fixture()
def lc(lore_engine):
    with RTXLocalAIClient(lore_engine.ipc, timeout=120) as c:
        yield c


def first_character(c):
    chars = c.call("loremaster.characters").data["characters"]
    assert chars
    return chars[0]


def test_plugin_commands_are_listed(lc):
    cmds = {c["name"]: c for c in lc.commands()}
    for name in ("loremaster.characters", "loremaster.talk", "loremaster.reset"):
        assert name in cmds, sorted(cmds)
        assert cmds[name]["plugin"] == "loremaster" and cmds[name]["description"]
    talk = cmds["loremaster.talk"]
    assert talk["streams"] is True and cmds["loremaster.characters"]["streams"] is False
    # The JSON schema arrives as a msgpack map.
    assert talk["parameters"]["type"] == "object"
    assert {"character", "message"} <= set(talk["parameters"]["required"])


def test_plugins_are_listed(lc):
    plugins = {p["name"]: p for p in lc.plugins()}
    lm = plugins["loremaster"]
    assert lm["version"] == "1.0.0" and lm["dir"].endswith("loremaster")
    assert sorted(lm["commands"]) == ["loremaster.characters", "loremaster.reset", "loremaster.talk"]


def test_call_characters(lc):
    r = lc.call("loremaster.characters", {})
    assert isinstance(r, rl.CallResult) and len(r.results) == 1
    assert r.stop == "" and r.text == "" and r.metrics is None  # no engine job
    for ch in r.data["characters"]:
        assert ch["id"] and ch["name"] and ch["lore_tokens"] > 0


def test_talk_streams_the_reply(lc):
    ch = first_character(lc)
    params = {"character": ch["id"], "message": "Hello! Who are you?", "temperature": 0, "max_tokens": 24}
    s = lc.stream_call("loremaster.talk", params)
    pieces = list(s)
    r = s.finish()
    assert len(pieces) > 3
    assert "".join(pieces) == r.text == r.data["reply"]
    assert r.data["character"] == ch["id"] and r.stop in ("eog", "max_tokens") and r.stop == r.data["stop"]
    assert r.metrics is not None and r.metrics.gen_tokens == r.data["gen_tokens"] > 0
    assert r.metrics.prompt_tokens == r.data["prompt_tokens"] > ch["lore_tokens"]
    # Not streamed: the same deterministic reply, the lore prefix now reused from the KV cache.
    again = lc.call("loremaster.talk", params)
    assert again.data["reply"] == r.data["reply"] and again.text == r.text
    assert again.metrics.reused_tokens > 0


def test_plugin_errors_carry_protocol_codes(lc):
    ch = first_character(lc)
    with pytest.raises(rl.NotFound) as ei:
        lc.call("loremaster.talk", {"character": "nobody-at-all", "message": "hi"})
    assert ei.value.code == 6 and "nobody-at-all" in ei.value.message
    with pytest.raises(rl.BadRequest) as ei:
        lc.call("loremaster.talk", {"character": ch["id"], "message": "hi", "bogus": 1})
    assert ei.value.code == 3 and "bogus" in ei.value.message
    with pytest.raises(rl.BadRequest):
        lc.call("loremaster.talk", "{not json")  # params given as (invalid) JSON text
    with pytest.raises(rl.NotFound):
        lc.call("loremaster.no_such_verb")


def test_cancel_a_plugin_stream(lc):
    ch = first_character(lc)
    s = lc.stream_call("loremaster.talk", {"character": ch["id"], "message": "Tell me the long story of your life.",
                                           "temperature": 0, "max_tokens": 400})
    next(s)
    assert s.cancel() is True
    r = s.finish()
    assert r.stop == "cancelled" and r.metrics.gen_tokens < 400
    assert lc.stats()["requests_inflight"] == 0
