"""The screen plugin against a real `rlai serve` (default model) and a real
X server (Xvfb): a window showing a generated HUD image (known text and
numbers, drawn with Pillow) is listed, captured and read, over ZeroMQ and
HTTP. screen.capture's PNG must equal the drawn pixels; OCR must find the
text; the analysis prompt must contain it; bad input gets clear errors while
the server keeps serving. Without an mmproj loaded, the vision path refuses with NOT_IMPLEMENTED.

Skips only when Xvfb, Pillow or the plugin are not installed/built
(scripts/setup.sh installs them; CI has them). Paths from meson: RLAI_BIN,
RLAI_MODELS_DIR, RLAI_PLUGINS, RLAI_BUILD_ROOT."""
import base64
import io
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import zmq

from tiny_lore import plugins_with_tiny_lore
from wire import free_port, wire_request

PIL = pytest.importorskip("PIL", reason="Pillow not installed (scripts/setup.sh)")
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

RLAI = os.environ.get("RLAI_BIN")
MODELS = Path(os.environ.get("RLAI_MODELS_DIR", "models"))
MODEL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
PLUGINS = Path(os.environ.get("RLAI_PLUGINS") or (Path(RLAI).resolve().parent.parent / "plugins" if RLAI else "."))
BUILD = Path(os.environ.get("RLAI_BUILD_ROOT") or (Path(RLAI).resolve().parent.parent if RLAI else "."))
SHOW = BUILD / "tests" / "screen-show"
XVFB = shutil.which("Xvfb")
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
TITLE = "RLAI Test HUD"
WIN_POS = (40, 30)

pytestmark = [
    pytest.mark.skipif(not RLAI, reason="RLAI_BIN not set (run through meson test)"),
    pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched (scripts/setup.sh)"),
    pytest.mark.skipif(not (PLUGINS / "screen" / "manifest.json").exists(),
                       reason="screen plugin not built (tesseract/xcb/png/jpeg missing)"),
    pytest.mark.skipif(not XVFB, reason="Xvfb not installed (apt-get install xvfb; scripts/setup.sh does)"),
]


def hud_image(w=800, h=500):
    """A game-like frame with known text where the sample profile looks."""
    img = Image.new("RGB", (w, h), (24, 28, 40))
    d = ImageDraw.Draw(img)
    # textured background so the pixel comparison is not trivial
    for y in range(0, h, 4):
        for x in range(0, w, 16):
            d.point((x + (y // 4) % 16, y), fill=(40 + (x * 7 + y) % 30, 44, 60))
    big = ImageFont.truetype(FONT, 30)
    mid = ImageFont.truetype(FONT, 24)
    d.rectangle((10, 8, 250, 52), fill=(90, 10, 10))
    d.text((20, 12), "HP 87/100", font=big, fill=(255, 255, 255))
    d.text((545, 12), "QUEST", font=mid, fill=(250, 220, 120))
    d.text((545, 44), "Cross the river", font=mid, fill=(250, 220, 120))
    d.rectangle((80, 352, 520, 470), fill=(10, 10, 10))
    d.text((92, 364), "The bridge is guarded", font=mid, fill=(235, 235, 235))
    d.text((92, 398), "by three archers.", font=mid, fill=(235, 235, 235))
    d.text((600, 452), "AMMO 24", font=big, fill=(255, 255, 255))
    return img


def png_bytes(img):
    b = io.BytesIO()
    img.save(b, "PNG")
    return b.getvalue()


class Xvfb:
    def __init__(self, w=1024, h=768):
        r, wfd = os.pipe()
        self.proc = subprocess.Popen([XVFB, "-displayfd", str(wfd), "-screen", "0", f"{w}x{h}x24", "-nolisten",
                                      "tcp"], pass_fds=(wfd,), stderr=subprocess.DEVNULL)
        os.close(wfd)
        num = b""
        end = time.time() + 30
        while not num.endswith(b"\n") and time.time() < end:
            chunk = os.read(r, 16)
            if not chunk:
                break
            num += chunk
        os.close(r)
        if not num.strip():
            self.proc.kill()
            raise RuntimeError("Xvfb did not start")
        self.display = ":" + num.decode().strip()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


class Window:
    def __init__(self, display, path, title, pos):
        env = dict(os.environ, DISPLAY=display)
        self.proc = subprocess.Popen([str(SHOW), str(path), title, str(pos[0]), str(pos[1])], env=env,
                                     stdout=subprocess.PIPE)
        line = self.proc.stdout.readline()
        assert line.strip() == b"ready", line

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


class Server:
    def __init__(self, tmp, display, model=None, extra=()):
        self.dir = Path(tmp) / "rt"
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, XDG_RUNTIME_DIR=str(self.dir))
        env.pop("RLAI_PLUGIN_DIR", None)
        env.pop("DISPLAY", None)
        if display:
            env["DISPLAY"] = display
        self.log = open(Path(tmp) / "serve.log", "w+b")
        self.proc = subprocess.Popen([RLAI, "serve", "-m", str(model or MODEL), "-t", "2", "-c", "2048", "--http",
                                      f"127.0.0.1:{self.port}", "--no-auth", "--no-default-plugins", "--plugins",
                                      str(plugins_with_tiny_lore(PLUGINS, Path(tmp) / "plugins")), *extra],
                                     env=env, stderr=self.log, stdout=subprocess.DEVNULL)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.next_id = 1
        sock_file = self.dir / "rlai" / "engine.zmq"
        deadline = time.time() + 300
        while time.time() < deadline and not sock_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError("engine exited: " + self.read_log())
            time.sleep(0.2)
        self.sock.connect(f"ipc://{sock_file}")
        assert self.request("hello", timeout=120)[-1]["type"] == "done"

    def read_log(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def request(self, type_, timeout=300, **fields):
        id_ = self.next_id
        self.next_id += 1
        return wire_request(self.sock, id_, type_, timeout, **fields)

    def call(self, command, params):
        frames = self.request("call", command=command, params=json.dumps(params))
        ends = [f for f in frames if f["type"] in ("done", "error")]
        assert len(ends) == 1 and frames[-1] is ends[0]
        return frames

    def http(self, command, body, timeout=300):
        req = urllib.request.Request(f"{self.base}/v1/plugins/{command}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self):
        self.sock.close()
        self.ctx.term()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def result(frames):
    assert frames[-1]["type"] == "done", frames[-1]
    res = [f["data"] for f in frames if f["type"] == "result"]
    assert len(res) == 1, frames
    return res[0]


def error_of(frames):
    assert frames[-1]["type"] == "error", frames[-1]
    assert len(frames) == 1, "no token/result frames before an error"
    return frames[-1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("screen")
    img = hud_image()
    path = tmp / "hud.png"
    img.save(path)
    x = Xvfb()
    win = Window(x.display, path, TITLE, WIN_POS)
    srv = Server(tmp, x.display)
    yield {"tmp": tmp, "img": img, "path": path, "display": x.display, "server": srv}
    rc = srv.stop()
    win.stop()
    x.stop()
    assert rc == 0, srv.read_log()


def decode_png_b64(r):
    assert r["format"] == "png" and r["encoding"] == "base64"
    raw = base64.b64decode(r["data"])
    assert len(raw) == r["bytes"]
    return Image.open(io.BytesIO(raw)).convert("RGB")


def all_text(r):
    return " ".join([line["text"] for line in r["ocr"]["lines"]] +
                    [reg["text"] for reg in r["ocr"]["regions"].values()])


def test_registry_and_sources(env):
    s = env["server"]
    cmds = {c["name"]: c for c in s.request("commands")[0]["data"]["commands"]}
    assert {"screen.analyze", "screen.capture", "screen.sources"} <= set(cmds)
    assert cmds["screen.analyze"]["parameters"]["required"] == ["question"]
    r = result(s.call("screen.sources", {}))
    assert r["screen"] == {"width": 1024, "height": 768, "depth": 24} and r["shm"] is True
    wins = [w for w in r["windows"] if w["title"] == TITLE]
    assert len(wins) == 1
    w = wins[0]
    assert (w["x"], w["y"], w["width"], w["height"]) == (*WIN_POS, 800, 500)


def test_capture_window_matches_drawn_pixels(env):
    s = env["server"]
    r = result(s.call("screen.capture", {"window": "test hud"}))   # a unique part, any case
    assert r["source"]["kind"] == "window" and r["source"]["title"] == TITLE and r["source"]["shm"] is True
    got = decode_png_b64(r)
    assert got.size == (800, 500)
    assert got.tobytes() == env["img"].tobytes(), "captured pixels differ from the drawn image"
    # the whole screen: the window sits at its position
    r = result(s.call("screen.capture", {}))
    full = decode_png_b64(r)
    assert full.size == (1024, 768) and r["source"]["kind"] == "screen"
    box = (WIN_POS[0], WIN_POS[1], WIN_POS[0] + 800, WIN_POS[1] + 500)
    assert full.crop(box).tobytes() == env["img"].tobytes()
    # a region of the window
    r = result(s.call("screen.capture", {"window": TITLE, "region": [0, 0, 0.5, 0.5]}))
    assert decode_png_b64(r).tobytes() == env["img"].crop((0, 0, 400, 250)).tobytes()


def test_capture_save_to_writes_only_when_asked(env):
    s = env["server"]
    out = env["tmp"] / "shot.png"
    r = result(s.call("screen.capture", {"window": TITLE, "save_to": str(out)}))
    assert r["path"] == str(out) and "data" not in r
    assert Image.open(out).convert("RGB").tobytes() == env["img"].tobytes()
    e = error_of(s.call("screen.capture", {"window": TITLE, "save_to": str(out)}))   # never overwrites
    assert e["name"] == "BAD_REQUEST" and "exists" in e["msg"].lower()


def test_analyze_dry_run_reads_the_window(env):
    s = env["server"]
    q = "What should I do in this fight?"
    r = result(s.call("screen.analyze", {"question": q, "window": TITLE, "dry_run": True}))
    assert r["mode"] == "ocr" and r["answer"] is None and r["profile"] is None
    text = all_text(r)
    for want in ("87/100", "AMMO", "24", "QUEST", "river", "bridge", "archers"):
        assert want in text, (want, text)
        assert want in r["prompt"], (want, r["prompt"])
    assert r["prompt"].endswith("Question: " + q)
    assert r["description"] in r["prompt"]
    wheres = {line["where"] for line in r["ocr"]["lines"] if "AMMO" in line["text"]}
    assert wheres == {"bottom-right"}, r["ocr"]["lines"]
    t = r["timings_ms"]
    assert t["acquire"] > 0 and t["ocr"] > 0 and t["answer"] == 0


def test_analyze_with_profile_regions(env):
    s = env["server"]
    r = result(s.call("screen.analyze", {"question": "How is my health?", "window": TITLE,
                                         "profile": "sample_rpg", "dry_run": True}))
    regs = r["ocr"]["regions"]
    assert r["profile"] == "sample_rpg" and set(regs) >= {"health", "ammo", "quest", "dialogue"}
    assert 87 in regs["health"]["numbers"] and 100 in regs["health"]["numbers"], regs["health"]
    assert 24 in regs["ammo"]["numbers"], regs["ammo"]
    assert "river" in regs["quest"]["text"] and "archers" in regs["dialogue"]["text"]
    assert "Health (health): \"HP 87/100\"; numbers: 87, 100" in r["prompt"], r["prompt"]
    assert r["system_prompt"].startswith("You are a tactical assistant for an action RPG")
    # an inline profile object works the same way
    prof = {"name": "inline", "other_text": False,
            "regions": [{"name": "hp", "label": "Hit points", "rect": [0, 0, 0.34, 0.12], "kind": "numbers"}]}
    r = result(s.call("screen.analyze", {"question": "hp?", "window": TITLE, "profile": prof, "dry_run": True}))
    assert r["ocr"]["lines"] == [] and "Hit points (hp)" in r["prompt"] and "archers" not in r["prompt"]


def test_analyze_answers_streamed_over_wire(env):
    s = env["server"]
    frames = s.call("screen.analyze", {"question": "What should I do?", "window": TITLE,
                                       "max_tokens": 24, "temperature": 0})
    r = result(frames)
    streamed = "".join(f.get("text", "") for f in frames if f["type"] == "token")
    assert r["answer"] and streamed == r["answer"]
    assert r["gen_tokens"] > 0 and frames[-1]["metrics"]["prompt_tokens"] == r["prompt_tokens"]
    assert r["timings_ms"]["answer"] > 0


def test_http_image_and_file_sources(env):
    s = env["server"]
    b64 = base64.b64encode(png_bytes(env["img"])).decode()
    st, j = s.http("screen.analyze", {"question": "What does the quest say?", "image": b64, "dry_run": True})
    assert st == 200, j
    r = j["results"][0]
    assert r["source"]["kind"] == "image" and r["source"]["format"] == "png"
    assert "river" in r["prompt"] and "87/100" in r["prompt"]
    # JPEG file
    jpg = env["tmp"] / "hud.jpg"
    env["img"].save(jpg, "JPEG", quality=92)
    st, j = s.http("screen.analyze", {"question": "ammo?", "file": str(jpg), "dry_run": True})
    assert st == 200 and j["results"][0]["source"]["format"] == "jpeg" and "AMMO" in j["results"][0]["prompt"]
    # an answer over HTTP: the text is the answer
    st, j = s.http("screen.analyze", {"question": "What should I do?", "image": b64, "max_tokens": 16,
                                      "temperature": 0})
    assert st == 200 and j["text"] == j["results"][0]["answer"] and j["text"]
    # capture over HTTP returns the same PNG pixels
    st, j = s.http("screen.capture", {"window": TITLE})
    assert st == 200 and decode_png_b64(j["results"][0]).tobytes() == env["img"].tobytes()


def test_bad_input_gets_clear_errors(env):
    s = env["server"]
    good = png_bytes(env["img"])
    cases = [
        ({"question": "x", "window": "No Such Window"}, "NOT_FOUND", "no window titled"),
        ({"question": "x", "display": ":4242"}, "ENGINE", "cannot connect to X display"),
        ({"question": "x", "display": "example.com:0"}, "BAD_REQUEST", "local X display"),
        ({"question": "x", "image": "not base64!"}, "BAD_REQUEST", "base64"),
        ({"question": "x", "image": base64.b64encode(b"GIF89a" + bytes(100)).decode()}, "BAD_REQUEST",
         "not a PNG or JPEG"),
        ({"question": "x", "image": base64.b64encode(good[: len(good) // 2]).decode()}, "BAD_REQUEST", "PNG"),
        ({"question": "x", "file": "/nonexistent/shot.png"}, "NOT_FOUND", "cannot open"),
        ({"question": "x", "file": "relative.png"}, "BAD_REQUEST", "absolute"),
        ({"question": "x", "file": "/a.png", "window": TITLE}, "BAD_REQUEST", "at most one source"),
        ({"question": ""}, "BAD_REQUEST", "question"),
        ({"question": "x" * 2001}, "BAD_REQUEST", "2000"),   # the host enforces maxLength first
        ({"question": "x", "mode": "psychic"}, "BAD_REQUEST", "mode"),
        ({"question": "x", "mode": "vision"}, "NOT_IMPLEMENTED", "vision encoder"),
        ({"question": "x", "profile": "nope"}, "NOT_FOUND", "sample_rpg"),
        ({"question": "x", "profile": {"name": "p", "regions": [{"name": "a", "rect": [0.9, 0, 0.5, 0.1]}]}},
         "BAD_REQUEST", "inside the screen"),
        ({"question": "x", "colour": 1}, "BAD_REQUEST", "'colour' is not accepted"),
    ]
    for params, name, msg in cases:
        e = error_of(s.call("screen.analyze", params))
        assert e["name"] == name and msg in e["msg"], (params, e)
    # a huge image (dimension limit) is refused from its header
    huge = Image.new("RGB", (9000, 8), (0, 0, 0))
    e = error_of(s.call("screen.analyze", {"question": "x", "image": base64.b64encode(png_bytes(huge)).decode()}))
    assert e["name"] == "TOO_LARGE" and "9000x8" in e["msg"], e
    e = error_of(s.call("screen.capture", {"window": TITLE, "region": [0, 0, 2, 1]}))
    assert e["name"] == "BAD_REQUEST" and "region" in e["msg"]
    st, j = s.http("screen.analyze", {"question": "x", "mode": "vision"})
    assert st == 501 and "--mmproj" in j["error"]["message"]
    # and the server still serves
    r = result(s.call("screen.analyze", {"question": "hp?", "window": TITLE, "dry_run": True}))
    assert "87/100" in r["prompt"]


def test_no_display(tmp_path):
    """An engine without DISPLAY: captures say so; files still work."""
    img = hud_image(400, 200)
    path = tmp_path / "small.png"
    img.save(path)
    srv = Server(tmp_path, None)
    try:
        e = error_of(srv.call("screen.capture", {}))
        assert e["name"] == "BAD_REQUEST" and "DISPLAY is not set" in e["msg"], e
        r = result(srv.call("screen.analyze", {"question": "x", "file": str(path), "dry_run": True}))
        assert r["source"]["width"] == 400
    finally:
        assert srv.stop() == 0


def test_gassist_manifest_lists_screen_analyze(env):
    """The generated G-Assist manifest gains the screen commands."""
    s = env["server"]
    out = env["tmp"] / "gassist-manifest.json"
    r = subprocess.run([RLAI, "gassist", "manifest", "--endpoint", f"unix://{s.dir}/rlai/engine.sock", "-o", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    fns = {f["name"]: f for f in json.loads(out.read_text())["functions"]}
    assert {"screen_analyze", "screen_capture", "screen_sources"} <= set(fns)
    params = fns["screen_analyze"]["parameters"]
    assert "question" in params["properties"] and "question" in params["required"]
    assert "screen" in fns["screen_analyze"]["tags"]


def test_vision_mode_with_a_tiny_vlm(tmp_path):
    """rlai serve --mmproj with the tiny random-weight LM + mmproj of
    tests/ref/make_tiny_vision.py (meson target vision-data): model_info has
    the encoder, auto picks vision, the image's 16 rows replace <image>, and
    the same image twice reuses the prefix cache."""
    data = Path(os.environ["RLAI_BUILD_ROOT"]) / "tests" / "vision-data"
    lm, mm = data / "tiny-lm-F32.gguf", data / "tiny-mmproj-F32.gguf"
    assert lm.is_file() and mm.is_file(), "meson target vision-data not built"
    img = hud_image(120, 80)
    path = tmp_path / "frame.png"
    img.save(path)
    srv = Server(tmp_path, None, model=lm, extra=("--mmproj", str(mm)))
    try:
        params = {"question": "hp?", "file": str(path), "max_tokens": 4, "temperature": 0}
        r1 = result(srv.call("screen.analyze", params))
        assert r1["mode"] == "vision" and r1["image_tokens"] == 16 and "<image>" in r1["prompt"], r1
        r2 = result(srv.call("screen.analyze", dict(params, mode="vision")))
        assert r2["prompt_tokens"] == r1["prompt_tokens"] and r2["answer"] == r1["answer"]
        # OCR is still there on request
        r3 = result(srv.call("screen.analyze", dict(params, mode="ocr", dry_run=True)))
        assert r3["mode"] == "ocr"
    finally:
        srv.stop()
