#!/usr/bin/env python3
"""Screen plugin latency at 1920x1080 and 2560x1440, stage by stage, against
a plain memcpy of the frame measured in the same run.

For each size: starts Xvfb at that size, shows a generated game-like frame
(HUD numbers, quest text, a dialogue box; Pillow + DejaVu) full screen with
build/tests/screen-show, runs build/bench/bench_screen (capture with MIT-SHM
and with plain GetImage, PNG encode/decode, Tesseract OCR, layout), then
starts `rlai serve` on the default model with DISPLAY set and calls
screen.analyze (whole screen, OCR mode, 32 greedy tokens) three times,
reading the plugin's own timings (acquire, OCR, answer) and the end-to-end
call time. Prints a Markdown table.

    .venv/bin/python bench/bench_screen.py [--build build] [--iters 10]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))


def frame_image(w, h):
    from PIL import Image, ImageDraw, ImageFont
    font = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    s = h / 1080
    img = Image.new("RGB", (w, h), (30, 36, 30))
    d = ImageDraw.Draw(img)
    for y in range(0, h, 6):       # some texture (a flat frame compresses and reads unrealistically fast)
        d.line((0, y, w, y), fill=(30 + y % 20, 36 + (y * 3) % 25, 30))
    big, mid = ImageFont.truetype(font, int(34 * s)), ImageFont.truetype(font, int(26 * s))
    d.text((int(30 * s), int(20 * s)), "HP 412/980   MP 75/300", font=big, fill=(255, 255, 255))
    d.text((int(w - 520 * s), int(20 * s)), "QUEST: Defend the east gate", font=mid, fill=(250, 220, 120))
    d.text((int(w - 520 * s), int(56 * s)), "Enemies left: 7", font=mid, fill=(250, 220, 120))
    d.rectangle((int(200 * s), int(h - 260 * s), int(w - 700 * s), int(h - 60 * s)), fill=(10, 10, 10))
    for i, line in enumerate(("Captain: The archers are on the wall,", "flank them from the stairs on the left.",
                              "Hurry, the gate will not hold much longer.")):
        d.text((int(230 * s), int(h - 240 * s + i * 50 * s)), line, font=mid, fill=(235, 235, 235))
    d.text((int(w - 380 * s), int(h - 90 * s)), "AMMO 24 / 120", font=big, fill=(255, 255, 255))
    return img


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def run_size(build, w, h, iters, tmp):
    from test_screen import Server, Window, Xvfb, result
    import test_screen
    test_screen.RLAI = str(build / "host" / "rlai")
    test_screen.PLUGINS = build / "plugins"
    test_screen.SHOW = build / "tests" / "screen-show"
    img = frame_image(w, h)
    path = Path(tmp) / f"frame_{w}x{h}.png"
    img.save(path)
    x = Xvfb(w, h)
    win = Window(x.display, path, "bench frame", (0, 0))
    try:
        out = subprocess.run([str(build / "bench" / "bench_screen"), str(iters)], env=dict(os.environ, DISPLAY=x.display),
                             capture_output=True, text=True, timeout=900, check=True)
        rows = {}
        for line in out.stdout.splitlines():
            j = json.loads(line)
            rows[j["stage"]] = j
        srv = Server(Path(tmp) / f"srv{w}", x.display)
        try:
            acq, ocr, ans, total = [], [], [], []
            for _ in range(3):
                t0 = time.perf_counter()
                r = result(srv.call("screen.analyze", {"question": "What should I do in this fight?",
                                                       "max_tokens": 32, "temperature": 0}))
                total.append((time.perf_counter() - t0) * 1e3)
                t = r["timings_ms"]
                acq.append(t["acquire"])
                ocr.append(t["ocr"])
                ans.append(t["answer"])
        finally:
            srv.stop()
        rows["plugin_acquire"] = {"ms": median(acq)}
        rows["plugin_ocr"] = {"ms": median(ocr)}
        rows["plugin_answer"] = {"ms": median(ans), "gen_tokens": r["gen_tokens"], "prompt_tokens": r["prompt_tokens"]}
        rows["plugin_total"] = {"ms": median(total)}
        return rows
    finally:
        win.stop()
        x.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    build = Path(a.build).resolve()
    if not shutil.which("Xvfb"):
        sys.exit("bench_screen: Xvfb not installed (scripts/setup.sh)")
    os.environ.setdefault("RLAI_MODELS_DIR", str(ROOT / "models"))
    sizes = [(1920, 1080), (2560, 1440)]
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w, h in sizes:
            res[(w, h)] = run_size(build, w, h, a.iters, tmp)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"screen plugin latency, median ms ({time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores)\n")
    names = [("memcpy_baseline", "baseline: memcpy of one 32-bit frame"),
             ("capture_shm", "capture, xcb + MIT-SHM (to RGB)"),
             ("capture_getimage", "capture, plain GetImage (to RGB)"),
             ("png_encode", "PNG encode (zlib 6; screen.capture)"),
             ("png_decode", "PNG decode (file/image source)"),
             ("ocr_init", "Tesseract init (once per pooled instance)"),
             ("ocr", "OCR, whole frame (Tesseract, 1 thread)"),
             ("layout", "layout description"),
             ("plugin_acquire", "screen.analyze: capture (in plugin)"),
             ("plugin_ocr", "screen.analyze: OCR (in plugin)"),
             ("plugin_answer", "screen.analyze: answer, 32 tokens (SmolLM2-135M Q4_1)"),
             ("plugin_total", "screen.analyze: whole call (client side)")]
    print("| stage | " + " | ".join(f"{w}x{h}" for w, h in sizes) + " | " +
          " | ".join(f"x baseline {w}x{h}" for w, h in sizes) + " |")
    print("|---|" + "---:|" * (2 * len(sizes)))
    for key, label in names:
        ms = [res[s][key]["ms"] for s in sizes]
        base = [res[s]["memcpy_baseline"]["ms"] for s in sizes]
        ratio = [f"{m / b:.1f}x" if key != "memcpy_baseline" else "1x" for m, b in zip(ms, base)]
        print(f"| {label} | " + " | ".join(f"{m:.2f}" for m in ms) + " | " + " | ".join(ratio) + " |")
    for s in sizes:
        r = res[s]
        print(f"\n{s[0]}x{s[1]}: PNG {r['png_bytes']['bytes']} bytes, OCR lines {r['ocr_lines']['lines']}, "
              f"prompt {r['plugin_answer']['prompt_tokens']} tokens, {r['plugin_answer']['gen_tokens']} generated")


if __name__ == "__main__":
    main()
