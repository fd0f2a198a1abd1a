"""`rlai fit`: the fit plugin loaded in-process (paths come from meson:
RLAI_BIN, RLAI_MODELS_DIR, RLAI_TESTDATA). Figures are the hand-computed
ones of tests/test_fit.c for the default model on an RTX 4060."""
import json
import os
import subprocess
from pathlib import Path

import pytest

RLAI = os.environ.get("RLAI_BIN")
MODELS = Path(os.environ.get("RLAI_MODELS_DIR", "models"))
TESTDATA = Path(os.environ.get("RLAI_TESTDATA", Path(__file__).resolve().parents[1] / "data"))
MODEL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = pytest.mark.skipif(not RLAI, reason="RLAI_BIN not set (run through meson test)")
needs_model = pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched")


def run(*args, timeout=120):
    env = dict(os.environ)
    env.pop("RLAI_PLUGIN_DIR", None)  # use the build tree's plugins next to the binary
    return subprocess.run([RLAI, "fit", *args], capture_output=True, timeout=timeout, env=env)


@needs_model
def test_table_with_verdict():
    r = run(str(MODEL), "--gpu", "RTX 4060")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert "RTX 4060: 8 GiB, 272 GB/s" in out
    assert "verdict        FITS" in out
    # weights by type: q4_1 210 tensors 106,168,320 params, 5 bits/weight
    assert any(l.split()[:3] == ["q4_1", "210", "106,168,320"] and l.split()[-1] == "5.000"
               for l in out.splitlines()), out
    # KV: 2*30*3*64*2*1024 = 23,592,960 B = 22.50 MiB per 1k; 180.00 MiB at 8192
    assert "22.50 MiB per 1k tokens; 180.00 MiB at 8192 tokens" in out
    # decode: 0.7*272e9 / 285,320,448 = 667.3 tok/s
    assert "667.3 tok/s at 8192 tokens" in out


@needs_model
def test_json_parses_and_matches():
    r = run(str(MODEL), "--gpu", "nvidia geforce rtx 4060", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["gpu"]["name"] == "RTX 4060"
    assert d["weights"]["bytes"] == 96576768
    assert d["kv"]["bytes_per_1k_tokens"] == 23592960
    assert d["verdict"]["fits"] is True
    assert d["verdict"]["headroom_bytes"] == 6801375590
    assert d["verdict"]["need_bytes"] == 96576768 + 188743680 + (1 << 30)


@needs_model
def test_does_not_fit_on_a_tiny_custom_card():
    # need 1,359,062,272 B; 1 GiB * 95% = 1,020,054,732 B: short.
    r = run(str(MODEL), "--vram-gb", "1", "--bandwidth-gbs", "100", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"]["fits"] is False
    assert d["verdict"]["headroom_bytes"] == 1020054732 - 1359062272
    r = run(str(MODEL), "--vram-gb", "1", "--bandwidth-gbs", "100")
    assert "DOES NOT FIT" in r.stdout.decode()


def test_parameter_counts_and_q8_kv():
    counts = '{"params_b":8.03,"n_layer":32,"n_head_kv":8,"head_dim":128,"bits_per_weight":4.5}'
    r = run("--params", counts, "--gpu", "RTX 4090", "--kv-type", "q8_0", "--context", "4096", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["weights"]["bytes"] == 4516875000          # 8.03e9 * 4.5 / 8
    assert d["kv"]["bytes_per_1k_tokens"] == 71303168   # 2*32*(1024/32*34)*1024
    assert d["kv"]["bytes_at_context"] == 69632 * 4096


@needs_model
def test_unknown_gpu_lists_known_names():
    r = run(str(MODEL), "--gpu", "RTX 9999")
    assert r.returncode == 1
    err = r.stderr.decode()
    assert "unknown GPU 'RTX 9999'" in err and "RTX 4090" in err and "H200" in err


def test_list_gpus():
    r = run("--list-gpus", "--json")
    assert r.returncode == 0, r.stderr
    gpus = {g["name"]: g for g in json.loads(r.stdout)["gpus"]}
    assert gpus["RTX 5090"]["vram_gb"] == 32 and gpus["RTX 5090"]["bandwidth_gbs"] == 1792
    assert gpus["DGX Spark"]["unified"] is True
    assert len(gpus) == 22


def test_vocab_only_file_and_missing_file(tmp_path):
    r = run(str(TESTDATA / "tokenizer" / "ggml-vocab-gpt-2.gguf"), "--gpu", "RTX 4060")
    assert r.returncode == 1
    assert b"no tensors" in r.stderr
    r = run(str(tmp_path / "nope.gguf"), "--gpu", "RTX 4060")
    assert r.returncode == 1
    assert b"nope.gguf" in r.stderr


def test_usage_errors():
    assert run().returncode == 2
    assert run("--params", "[1]", "--gpu", "RTX 4060").returncode == 2
    assert run("x.gguf", "--gpu", "RTX 4060", "--context", "-5").returncode == 2


def test_params_schema_is_enforced_by_the_host():
    """fit.check's params_schema describes what the handler accepts and the
    host refuses the rest before the plugin runs, naming the rule."""
    counts = {"params_b": 8.03, "n_layer": 32.5, "n_head_kv": 8, "head_dim": 128, "bits_per_weight": 4.5}
    r = run("--params", json.dumps(counts), "--gpu", "RTX 4060")
    assert r.returncode == 1 and b"invalid params for fit.check: 'model.n_layer' must be an integer" in r.stderr
    counts["n_layer"] = 32
    r = run("--params", json.dumps(counts), "--gpu", "RTX 4060", "--context", str((1 << 24) + 1))
    assert r.returncode == 1 and b"'context' must be <= 16777216" in r.stderr, r.stderr
    r = run("--params", json.dumps(counts), "--gpu", "RTX 4060", "--context", str(1 << 24))
    assert r.returncode == 0, r.stderr
