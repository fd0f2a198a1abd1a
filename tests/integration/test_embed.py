"""The C embed API as an outside program gets it: install the build into a
staging folder (meson install --destdir), build samples/embed/embed.c with
`pkg-config --cflags --libs rlai` from the staged rlai.pc, run it against
the staged librlai and compare its greedy text with `rlai run --local`.
librlai exports exactly the functions declared in the installed headers.
Paths from meson: RLAI_BIN, RLAI_MODELS_DIR, RLAI_BUILD_ROOT,
RLAI_SOURCE_ROOT."""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from test_daemon import RLAI, MODEL

pytestmark = [
    pytest.mark.skipif(not RLAI, reason="RLAI_BIN not set (run through meson test)"),
    pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched (scripts/setup.sh)"),
]

PUBLIC = ["engine", "error", "grammar", "gguf", "vocab", "clock"]


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    build_root = os.environ.get("RLAI_BUILD_ROOT")
    source_root = os.environ.get("RLAI_SOURCE_ROOT")
    if not build_root or not source_root:
        pytest.skip("RLAI_BUILD_ROOT / RLAI_SOURCE_ROOT not set (run through meson test)")
    r = subprocess.run(["meson", "introspect", build_root, "--buildoptions"], capture_output=True, text=True,
                       timeout=60)
    opts = {o["name"]: o["value"] for o in json.loads(r.stdout)}
    stage = tmp_path_factory.mktemp("embed") / "stage"
    r = subprocess.run(["meson", "install", "-C", build_root, "--no-rebuild", "--destdir", str(stage)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    root = Path(str(stage) + opts["prefix"])
    # the sample is built as the tree was: same compiler, same sanitizers
    # (a sanitized librlai needs its runtime in the program)
    targets = json.loads(subprocess.run(["meson", "introspect", build_root, "--targets"], capture_output=True,
                                        text=True, timeout=60).stdout)
    cc = next((ts["compiler"] for t in targets for ts in t.get("target_sources", [])
               if ts.get("language") == "c" and ts.get("compiler")), ["cc"])
    san = opts.get("b_sanitize", "none")
    if isinstance(san, list):
        san = ",".join(san)
    cflags = [f"-fsanitize={san}"] if san and san != "none" else []
    return root, root / opts["libdir"], root / opts["includedir"], Path(source_root), cc + cflags


def test_an_outside_program_embeds_the_engine_with_pkg_config(staged, tmp_path):
    root, libdir, incdir, src, cc = staged
    pcdir = libdir / "pkgconfig"
    assert (pcdir / "rlai.pc").exists() and (incdir / "rlai" / "engine.h").exists()
    assert not (incdir / "rlai" / "client.h").exists()   # no installed library implements it
    env = dict(os.environ, PKG_CONFIG_PATH=str(pcdir))
    env.pop("PKG_CONFIG_SYSROOT_DIR", None)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "rlai"], env=env, capture_output=True, text=True,
                           timeout=30)
    assert flags.returncode == 0, flags.stderr
    exe = tmp_path / "embed"
    r = subprocess.run([*cc, "-std=c17", "-Wall", "-Wextra", "-Werror", str(src / "samples" / "embed" / "embed.c"),
                        *flags.stdout.split(), "-o", str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    prompt = "Name a colour."
    run_env = dict(os.environ, LD_LIBRARY_PATH=str(libdir))
    r = subprocess.run([str(exe), str(MODEL), prompt, "12"], env=run_env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "generated 12 tokens" in r.stderr or re.search(r"generated \d+ tokens", r.stderr), r.stderr
    # the staged library is the one loaded, and its greedy text is the engine's
    ldd = subprocess.run(["ldd", str(exe)], env=run_env, capture_output=True, text=True, timeout=30).stdout
    assert str(libdir) in ldd, ldd
    ref = subprocess.run([RLAI, "run", "--local", "--temp", "0", "-n", "12", prompt], capture_output=True,
                         text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    assert r.stdout.strip() and r.stdout.strip() == ref.stdout.strip()
    bad = subprocess.run([str(exe), str(tmp_path / "missing.gguf"), prompt], env=run_env, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "cannot open" in bad.stderr


def test_librlai_exports_exactly_the_public_headers(staged):
    root, libdir, incdir, src, cc = staged
    declared = set()
    for h in PUBLIC:
        text = re.sub(r"/\*.*?\*/", "", (incdir / "rlai" / f"{h}.h").read_text(), flags=re.S)
        declared |= set(re.findall(r"\b(rlai_[a-z0-9_]+)\s*\(", text))
    nm = subprocess.run(["nm", "-D", "--defined-only", str(libdir / "librlai.so.0")], capture_output=True,
                        text=True, timeout=30)
    assert nm.returncode == 0, nm.stderr
    names = {line.split()[-1].split("@")[0] for line in nm.stdout.splitlines()}   # strip @@RLAI_0
    exported = {n for n in names if n.startswith("rlai_")}
    others = names - exported - {"RLAI_0"}
    assert exported == declared, (sorted(exported - declared), sorted(declared - exported))
    assert not others, sorted(others)
