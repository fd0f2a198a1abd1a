"""Integration tests: plugins inside a real `rlai serve` (the test plugins of
tests/plugins/, built as real shared modules): refusals are logged with the
file and the versions and the engine keeps serving; `commands` lists the
registry; `call` streams, returns results, fails cleanly, is cancelled by
cancel, disconnect and shutdown; `rlai plugins` and `rlai call` work from
the command line. Paths from meson: RLAI_BIN, RLAI_MODELS_DIR,
RLAI_TEST_PLUGINS."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import urllib.error
import urllib.request

from test_daemon import Engine, ZmqClient, PipeClient, RLAI, MODEL, free_port

TEST_PLUGINS = os.environ.get("RLAI_TEST_PLUGINS")

pytestmark = [
    pytest.mark.skipif(not RLAI, reason="RLAI_BIN not set (run through meson test)"),
    pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched (scripts/setup.sh)"),
    pytest.mark.skipif(not TEST_PLUGINS, reason="RLAI_TEST_PLUGINS not set (run through meson test)"),
]


def result_data(frames):
    return [f["data"] for f in frames if f["type"] == "result"]


def text_of(frames):
    return "".join(f["text"] for f in frames if f["type"] == "token")


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plugins")
    marker = tmp / "fini-marker"
    conf = tmp / "serve.json"
    conf.write_text(json.dumps({"plugins": {"workers": 3,
                                            "config": {"good": {"greeting": "from-config",
                                                                "fini_marker": str(marker)}}}}))
    e = Engine(tmp, extra=("--config", str(conf), "--plugins", TEST_PLUGINS, "--http", ""))
    e.marker = marker
    yield e
    e.stop()


def test_refused_plugins_are_logged_and_the_engine_serves(tmp_path):
    e = Engine(tmp_path, extra=("--plugins", TEST_PLUGINS, "--http", ""))
    try:
        c = ZmqClient(e.zmq_ipc)
        c.request("hello", 1)
        assert c.collect(1)[-1]["type"] == "done"
        c.request("generate", 2, prompt="Hello", max_tokens=4)
        assert c.collect(2)[-1]["type"] == "done"
        c.close()
    finally:
        assert e.stop() == 0
    log = e.stderr
    # every refusal names the file and why; versions where the ABI differs
    assert "libnewabi.so: refused: built for plugin ABI 1.5, this host has 1.4" in log
    assert "libothermajor.so: refused: built for plugin ABI 2.0, this host has 1.4" in log
    assert "libinitfail.so: plugin 'initfail' 1.0.0: init failed" in log and "the lore pack is missing" in log
    assert "libdup.so: registration refused: command 'dup.same' is already registered" in log
    assert "libnosym.so: not an RTX-LocalAI plugin" in log
    assert "badjson/manifest.json: not valid JSON" in log
    assert 'badfields/manifest.json: "version" must be a string' in log
    assert "a plugin named 'good' is already loaded" in log
    assert '"isolation": "process" is not implemented in this build' in log
    # a params_schema the host cannot enforce refuses its plugin, naming the command and the keyword
    assert ("libbadschema.so: registration refused: command 'badschema.bad': params_schema: name: "
            'keyword "pattern" is not supported') in log
    assert "4 plugins loaded" in log and "(20 commands)" in log


def test_commands_lists_the_registry_with_schemas(eng):
    c = ZmqClient(eng.zmq_ipc)
    c.request("commands", 1)
    frames = c.collect(1)
    assert frames[-1]["type"] == "done"
    data = result_data(frames)[0]
    names = [cmd["name"] for cmd in data["commands"]]
    assert names == sorted(names)
    assert names == ["good.echo", "good.fail", "good.generate", "good.info", "good.late", "good.parrot", "good.pin",
                     "good.slow", "good.stream", "oldabi.generate", "stuck.badjson", "stuck.badtext", "stuck.ping", "stuck.short",
                     "stuck.sleep", "stuck.spin", "stuck.status", "typed.fail", "typed.open", "typed.set"]
    gen = next(cmd for cmd in data["commands"] if cmd["name"] == "good.generate")
    assert gen["parameters"]["required"] == ["prompt"]
    assert gen["parameters"]["properties"]["prompt"]["type"] == "string"
    assert gen["streams"] is True and gen["plugin"] == "good"
    assert data["plugins"][0]["name"] == "good" and data["plugins"][0]["version"] == "1.2.3"
    c.close()


def test_call_replies_streams_and_fails_cleanly(eng):
    c = ZmqClient(eng.zmq_ipc)
    c.request("call", 1, command="good.echo", params=json.dumps({"x": 7, "s": "\u00e9t\u00e9"}))
    frames = c.collect(1)
    assert [f["type"] for f in frames] == ["result", "done"]
    assert frames[0]["data"]["params"] == {"x": 7, "s": "\u00e9t\u00e9"}
    assert frames[0]["data"]["host"].startswith("rtx-localai")

    c.request("call", 2, command="good.stream", params='{"pieces": 4}')
    frames = c.collect(2)
    assert [f["type"] for f in frames] == ["token"] * 4 + ["result", "result", "done"]
    assert text_of(frames) == "piece0 piece1 piece2 piece3 "
    assert result_data(frames) == [{"pieces": 4}, ["second result"]]

    c.request("call", 3, command="good.info")   # no params: {}
    info = result_data(c.collect(3))[0]
    assert info["config"]["greeting"] == "from-config"   # daemon config overrides the manifest
    assert info["model"]["n_layer"] == 30 and info["model_info_rc"] == 0

    cases = [
        ("good.nope", "{}", "NOT_FOUND", "unknown command 'good.nope'"),
        ("good.echo", "{not json", "BAD_REQUEST", "must be a JSON object"),
        ("good.echo", "[1]", "BAD_REQUEST", "must be a JSON object"),
        ("good.fail", "{}", "BAD_REQUEST", "good.fail was asked to fail"),
        ("good.stream", '{"pieces": 5000}', "BAD_REQUEST", "pieces must be in [0, 1000]"),
        ("good.fail", '{"how": "return"}', "NOT_FOUND", "not found"),
    ]
    for i, (cmd, params, name, needle) in enumerate(cases, start=10):
        c.request("call", i, command=cmd, params=params)
        frames = c.collect(i)
        assert len(frames) == 1 and frames[0]["type"] == "error", (cmd, frames)
        assert frames[0]["name"] == name and needle in frames[0]["msg"], (cmd, frames[0])
    # still serving
    c.request("call", 30, command="good.echo", params="{}")
    assert c.collect(30)[-1]["type"] == "done"
    c.close()


def test_plugin_engine_job_streams_with_metrics_beside_a_generate(eng):
    c = ZmqClient(eng.zmq_ipc)
    c.request("call", 1, command="good.generate", params=json.dumps({"prompt": "Name a fruit.", "max_tokens": 12}))
    c.request("generate", 2, prompt="The sky is", max_tokens=8)
    f1, f2 = [], []
    end = time.time() + 120
    while (not f1 or f1[-1]["type"] not in ("done", "error") or
           not f2 or f2[-1]["type"] not in ("done", "error")) and time.time() < end:
        f = c.recv()
        (f1 if f["id"] == 1 else f2).append(f)
    assert f1[-1]["type"] == "done" and f2[-1]["type"] == "done"
    res = result_data(f1)[0]
    assert res["text"] == text_of(f1) and res["gen_tokens"] >= 1
    m = f1[-1]["metrics"]
    assert m["prompt_tokens"] == res["prompt_tokens"] > 10
    assert f1[-1]["stop"] in ("eog", "max_tokens")
    c.close()


def test_params_schema_is_enforced_with_the_rule_named(eng):
    """The host checks params against the command's schema before the
    handler runs: BAD_REQUEST naming the parameter and the rule."""
    c = ZmqClient(eng.zmq_ipc)
    cases = [
        ("typed.set", {"name": "a", "temperature": 2.5}, "'temperature' must be <= 2"),
        ("typed.set", {"temperature": 1}, "'name' is required"),
        ("typed.set", {"name": "a", "count": 1.5}, "'count' must be an integer"),
        ("typed.set", {"name": "abcdefghij"}, "'name' must be at most 8 characters long"),
        ("typed.set", {"name": "a", "mode": "x"}, "'mode' must be one of \"fast\", \"slow\""),
        ("typed.set", {"name": "a", "colour": 1}, "'colour' is not accepted (additionalProperties is false"),
        ("typed.open", {"model": {"n_layer": 0}}, "'model.n_layer' must be >= 1"),
    ]
    for i, (cmd, params, needle) in enumerate(cases, start=1):
        c.request("call", i, command=cmd, params=json.dumps(params))
        f = c.collect(i)
        assert len(f) == 1 and f[0]["type"] == "error" and f[0]["name"] == "BAD_REQUEST", f
        assert needle in f[0]["msg"] and cmd in f[0]["msg"], f[0]
    c.request("call", 50, command="typed.set", params=json.dumps({"name": "ok", "temperature": 2, "flag": None}))
    assert result_data(c.collect(50)) == [{"params": {"name": "ok", "temperature": 2, "flag": None}}]
    c.close()


def test_handler_error_codes_reach_every_client(tmp_path):
    """A handler failing with an rlai error code: the protocol error name on
    ZeroMQ and the pipe, the HTTP status on POST /v1/plugins/{command};
    schema refusals are 400 over HTTP."""
    port = free_port()
    e = Engine(tmp_path, extra=("--plugins", TEST_PLUGINS, "--http", f"127.0.0.1:{port}", "--no-auth"))

    def post(cmd, body):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/plugins/{cmd}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    try:
        cases = [(-9, "NOT_FOUND", 404, "not_found"), (-12, "TOO_LARGE", 413, None),
                 (-15, "BUSY", 429, "rate_limit_exceeded"), (-5, "BAD_REQUEST", 400, None),
                 (-10, "NOT_IMPLEMENTED", 501, None), (-6, "CONTEXT_FULL", 400, "context_length_exceeded"),
                 (-3, "BAD_REQUEST", 400, None), (-4, "NOT_IMPLEMENTED", 501, None), (-13, "TIMEOUT", 504, "timeout"),
                 (-2, "ENGINE", 500, None)]
        z, p = ZmqClient(e.zmq_ipc), PipeClient(e.sock_path)
        for i, (code, name, status, http_code) in enumerate(cases, start=1):
            for cl in (z, p):
                cl.request("call", i, command="typed.fail", params=json.dumps({"code": code}))
                f = cl.collect(i)[-1]
                assert f["type"] == "error" and f["name"] == name, (code, f)
                assert f["msg"] == f"typed.fail failed with code {code} as asked", f
            st, body = post("typed.fail", {"code": code})
            assert st == status, (code, st, body)
            assert body["error"]["message"] == f"typed.fail failed with code {code} as asked"
            if http_code:
                assert body["error"]["code"] == http_code, body
        st, body = post("typed.set", {"name": "a", "temperature": 3})
        assert st == 400 and "'temperature' must be <= 2" in body["error"]["message"], body
        st, body = post("typed.set", {"name": "a"})
        assert st == 200 and body["results"] == [{"params": {"name": "a"}}], body
        z.close()
        p.close()
    finally:
        assert e.stop() == 0


def test_cancel_and_disconnect_end_calls(eng):
    c = ZmqClient(eng.zmq_ipc)
    c.request("call", 1, command="good.slow")
    time.sleep(0.3)
    c.request("cancel", 2, target=1)
    frames = {}
    end = time.time() + 30
    while len(frames) < 2 and time.time() < end:
        f = c.recv()
        if f["type"] in ("done", "error"):
            frames[f["id"]] = f
    assert frames[1]["type"] == "done" and frames[1]["stop"] == "cancelled"
    assert frames[2]["type"] == "done"
    # a client that disconnects mid-call: the call ends, the engine serves
    p = PipeClient(eng.sock_path)
    p.request("call", 5, command="good.slow")
    time.sleep(0.3)
    p.close()
    time.sleep(0.5)
    c.request("call", 3, command="good.echo", params="{}")
    assert c.collect(3)[-1]["type"] == "done"
    # the per-client in-flight limit counts calls too
    for i in range(10, 10 + 8):
        c.request("call", i, command="good.slow")
    c.request("call", 30, command="good.echo")
    over = c.collect(30)
    assert over[-1]["type"] == "error" and over[-1]["name"] == "BUSY"
    for i in range(10, 10 + 8):
        c.request("cancel", 100 + i, target=i)
    ended = set()
    end = time.time() + 60
    while len(ended) < 16 and time.time() < end:
        f = c.recv()
        if f["type"] in ("done", "error"):
            ended.add(f["id"])
    assert len(ended) == 16
    c.close()


def test_cli_plugins_and_call(eng):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(eng.dir))
    out = subprocess.run([RLAI, "plugins"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "good 1.2.3" in out.stdout and "good.generate  [streams]" in out.stdout
    assert "prompt:string (required)" in out.stdout
    out = subprocess.run([RLAI, "plugins", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert len(json.loads(out.stdout)["commands"]) == 20
    out = subprocess.run([RLAI, "call", "good.stream", '{"pieces": 2}'], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["piece0 piece1 ", '{"pieces":2}', '["second result"]']
    out = subprocess.run([RLAI, "call", "good.nope"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "unknown command 'good.nope'" in out.stderr
    out = subprocess.run([RLAI, "call", "good.echo", "[1]"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "must be a JSON object" in out.stderr
    out = subprocess.run([RLAI, "call", "good.generate", '{"prompt": "Hi", "max_tokens": 4}'], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "prompt" in out.stderr and "tok/s" in out.stderr


def test_no_plugins_and_absent_engine(tmp_path):
    e = Engine(tmp_path, extra=("--no-plugins", "--http", ""))
    try:
        c = ZmqClient(e.zmq_ipc)
        c.request("commands", 1)
        data = result_data(c.collect(1))[0]
        assert data["commands"] == [] and data["plugins"] == []
        c.request("call", 2, command="good.echo")
        f = c.collect(2)[-1]
        assert f["type"] == "error" and f["name"] == "NOT_FOUND" and "plugins are disabled" in f["msg"]
        c.close()
    finally:
        e.stop()
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path / "nobody"))
    t0 = time.time()
    out = subprocess.run([RLAI, "call", "good.echo"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and time.time() - t0 < 10
    assert "rlai:" in out.stderr


def test_shutdown_ends_running_calls_and_runs_fini(tmp_path):
    marker = tmp_path / "fini"
    conf = tmp_path / "serve.json"
    conf.write_text(json.dumps({"plugins": {"dir": TEST_PLUGINS,
                                            "config": {"good": {"fini_marker": str(marker)}}}}))
    e = Engine(tmp_path, extra=("--config", str(conf), "--http", ""))
    c = ZmqClient(e.zmq_ipc)
    c.request("call", 1, command="good.slow")
    time.sleep(0.3)
    e.proc.send_signal(signal.SIGTERM)
    f = c.collect(1, timeout=30)[-1]
    assert f["type"] == "error" and f["name"] == "SHUTDOWN"
    assert e.stop() == 0
    assert marker.read_text() == "fini\n"
    c.close()


def test_plugin_template_builds_out_of_tree_and_runs(tmp_path):
    """samples/plugin-template, following its README to the letter: install
    only the headers and rlai-plugin.pc (meson's devel tag) into a staging
    folder (--destdir), point PKG_CONFIG_PATH at <stage><prefix>/<libdir>/pkgconfig,
    build the template with its Makefile, load it into a real engine, call
    it. The staged .pc must not prefix system paths (cJSON's) with the
    stage, and nothing installed may carry the staging path."""
    build_root = os.environ.get("RLAI_BUILD_ROOT")
    source_root = os.environ.get("RLAI_SOURCE_ROOT")
    if not build_root or not source_root:
        pytest.skip("RLAI_BUILD_ROOT / RLAI_SOURCE_ROOT not set (run through meson test)")
    r = subprocess.run(["meson", "introspect", build_root, "--buildoptions"], capture_output=True, text=True,
                       timeout=60)
    opts = {o["name"]: o["value"] for o in json.loads(r.stdout)}
    prefix, libdir = opts["prefix"], opts["libdir"]
    stage = tmp_path / "stage"
    r = subprocess.run(["meson", "install", "-C", build_root, "--no-rebuild", "--destdir", str(stage),
                        "--tags", "devel"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    pcdir = Path(str(stage) + prefix) / libdir / "pkgconfig"       # the README's path
    pc = pcdir / "rlai-plugin.pc"
    assert pc.exists(), list(stage.rglob("*.pc"))
    assert str(stage) not in pc.read_text()                       # relocatable, no staging path inside
    assert (Path(str(stage) + prefix) / opts["includedir"] / "rlai" / "plugin.h").exists()
    env = dict(os.environ, PKG_CONFIG_PATH=str(pcdir))
    env.pop("PKG_CONFIG_SYSROOT_DIR", None)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "rlai-plugin"], env=env, capture_output=True,
                           text=True, timeout=30)
    assert flags.returncode == 0, flags.stderr
    cjson = subprocess.run(["pkg-config", "--cflags", "--libs", "libcjson"], capture_output=True, text=True,
                           timeout=30).stdout.split()
    got = flags.stdout.split()
    inc = [f for f in got if f.startswith("-I") and str(stage) in f]
    assert len(inc) == 1 and Path(inc[0][2:]).resolve() == (Path(str(stage) + prefix) / opts["includedir"]).resolve()
    # the system's cJSON flags exactly as the system gives them (not under the stage)
    assert [f for f in got if f not in inc] == [f for f in cjson if f not in inc], (got, cjson)
    out = tmp_path / "plugins-build"
    r = subprocess.run(["make", "-C", str(Path(source_root) / "samples" / "plugin-template"), f"BUILD={out}"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert str(stage) in r.stdout   # the staged headers were used
    # a whole staged install: paths baked into binaries name the prefix, never the stage
    full = tmp_path / "full"
    r = subprocess.run(["meson", "install", "-C", build_root, "--no-rebuild", "--destdir", str(full)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    staged = [f for f in full.rglob("*") if f.is_file() and not f.is_symlink()]
    assert staged
    assert not [f for f in staged if str(full).encode() in f.read_bytes()]
    rlai_bin = Path(str(full) + prefix) / opts["bindir"] / "rlai"
    assert (prefix + "/" + libdir + "/rlai/plugins").encode() in rlai_bin.read_bytes()
    e = Engine(tmp_path, extra=("--plugins", str(out), "--http", ""))
    try:
        c = ZmqClient(e.zmq_ipc)
        c.request("call", 1, command="hello.greet", params='{"name": "Ada"}')
        assert result_data(c.collect(1)) == [{"greeting": "Hello, Ada!"}]
        c.request("call", 2, command="hello.greet", params="{}")
        f = c.collect(2)[-1]
        assert f["type"] == "error" and "name" in f["msg"]
        c.request("call", 3, command="hello.story", params='{"topic": "a lighthouse", "words": 10}')
        frames = c.collect(3, timeout=120)
        assert frames[-1]["type"] == "done"
        assert len(text_of(frames)) > 0 and result_data(frames)[0]["tokens"] > 0
        # words out of range: refused by the host from the template's schema (BAD_REQUEST, not TOO_LARGE)
        c.request("call", 4, command="hello.story", params='{"topic": "a lighthouse", "words": 500}')
        f = c.collect(4)[-1]
        assert f["type"] == "error" and f["name"] == "BAD_REQUEST" and "'words' must be <= 400" in f["msg"], f
        c.close()
    finally:
        assert e.stop() == 0
    assert "loaded plugin hello 1.0.0 (2 commands)" in e.stderr


def test_plugin_engine_job_with_response_format(eng):
    """An engine job of a plugin may ask for JSON (rlai_gen_request.response_format)."""
    c = ZmqClient(eng.zmq_ipc)
    schema = {"type": "object", "properties": {"fruit": {"type": "string", "maxLength": 20}},
              "required": ["fruit"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "f", "schema": schema}}
    c.request("call", 1, command="good.generate",
              params=json.dumps({"prompt": "Name a fruit.", "max_tokens": 40, "response_format": rf}))
    frames = c.collect(1)
    assert frames[-1]["type"] == "done", frames[-1]
    res = result_data(frames)[0]
    obj = json.loads(res["text"])
    assert list(obj) == ["fruit"] and isinstance(obj["fruit"], str)
    assert res["stop"] == "eog"
    bad = {"type": "json_schema", "json_schema": {"name": "f", "schema": {"type": "integer", "not": {"const": 2}}}}
    c.request("call", 2, command="good.generate",
              params=json.dumps({"prompt": "Hi", "max_tokens": 4, "response_format": bad}))
    frames = c.collect(2)
    assert frames[-1]["type"] == "error"
    c.close()


def test_a_plugin_chat_model_is_served_over_http(tmp_path):
    """register_chat_model (ABI 1.2): the good plugin offers good/parrot; the
    HTTP front lists it in /v1/models and answers chat completions for it
    (blocking, streamed, and by id through "character") by calling its
    command; an unknown chat model is 404 model_not_found. No plugin is
    named in the host's code."""
    port = free_port()
    e = Engine(tmp_path, extra=("--plugins", TEST_PLUGINS, "--http", f"127.0.0.1:{port}", "--no-auth"))

    def req(path, body=None):
        r = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                   data=json.dumps(body).encode() if body is not None else None,
                                   method="POST" if body is not None else "GET",
                                   headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(r, timeout=60) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    try:
        st, body = req("/v1/models")
        assert st == 200, body
        models = {m["id"]: m for m in json.loads(body)["data"]}
        assert models["good/parrot"]["owned_by"] == "good"
        assert models["good/parrot"]["description"] == "A parrot (test chat model)"
        assert "good/bad" not in models and "other/parrot" not in models
        msgs = [{"role": "system", "content": "ignored"}, {"role": "user", "content": "first"},
                {"role": "assistant", "content": "x"}, {"role": "user", "content": "polly wants"}]
        st, body = req("/v1/chat/completions", {"model": "good/parrot", "messages": msgs})
        assert st == 200, body
        j = json.loads(body)
        assert j["model"] == "good/parrot"
        assert j["choices"][0]["message"]["content"] == "Squawk: polly wants"
        assert j["choices"][0]["finish_reason"] == "stop"
        st, body = req("/v1/chat/completions", {"model": MODEL.stem, "messages": msgs, "stream": True,
                                                "character": "parrot"})
        assert st == 200, body
        text = ""
        for line in body.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in json.loads(line[6:]).get("choices", []):
                    text += ch["delta"].get("content") or ""
        assert text == "Squawk: polly wants"
        st, body = req("/v1/chat/completions", {"model": "good/owl", "messages": msgs})
        assert st == 404 and json.loads(body)["error"]["code"] == "model_not_found", body
    finally:
        assert e.stop() == 0
