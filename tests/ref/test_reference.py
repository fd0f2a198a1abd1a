"""Engine (rlai-logits) vs the independent NumPy reference (ref_model.py).

Tolerances and their justification: tests/ref/README.md.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import gguf
import gguf.quants

from conftest import report
from make_tiny import TinySpec, standard_specs, write_tiny, vocab, EOT
from ref_model import RefModel, rel_l2
from ref_tokenizer import SimpleBPE

# ------------------------------------------------------------------ limits
PRECISE_TOL = 1e-3      # per-position relative L2, --precise vs float64 reference
ISA_TOL = 1e-4          # --isa scalar vs auto, --precise
ISA_FAST_TOL = 1e-3     # --isa scalar vs auto, fast mode (rounding-boundary flips)
FAST_REAL_MAX = 0.25    # real model, fast mode: worst position
FAST_REAL_MEAN = 0.08   # real model, fast mode: mean over positions of a prompt
FAST_REAL_TOP1 = 0.75   # real model, fast mode: top-1 agreement per prompt
FAST_TINY_MAX = 0.05    # tiny models, fast mode: worst position
TIE = 0.02              # logit margin under which two greedy choices are a tie
FAST_GREEDY_MATCH = 0.75  # fast greedy, teacher-forced: share of steps = ref argmax
FAST_GREEDY_GAP = 1.0   # fast greedy: max logit deficit of the engine's choice
N_GREEDY = 32


def chat(text):
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


PROMPTS = {
    "chat_france": chat("What is the capital of France?"),
    "chat_sea": chat("Write one sentence about the sea."),
    "raw_story": "Once upon a time, there was a little robot who lived in a quiet village. Every morning",
    "raw_code": "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
}


def teacher_forced(ref, prompt, seq):
    """Reference logits predicting each token of seq after prompt + seq[:i]."""
    L = ref.forward(list(prompt) + list(seq[:-1]))
    return L[len(prompt) - 1:]


def check_greedy_exact(ref, prompt, eng_seq, ref_seq, label):
    """Engine greedy must equal reference greedy; the only excuse is a tie
    (reference top-2 margin < TIE) at the first divergence, after which the
    engine's own continuation is checked step by step under the reference."""
    if eng_seq == ref_seq:
        return
    L = teacher_forced(ref, prompt, eng_seq)
    gaps = L.max(axis=1) - L[np.arange(len(eng_seq)), eng_seq]
    first = next(i for i in range(len(eng_seq)) if eng_seq[i] != ref_seq[i])
    report(f"{label}: greedy diverges at step {first}, reference deficits {np.round(gaps, 4).tolist()}")
    assert gaps.max() < TIE, (
        f"{label}: greedy differs from reference at step {first}: engine {eng_seq} "
        f"ref {ref_seq}; engine choice is {gaps.max():.4f} logits below the reference's best")


# ======================================================= reference alone
def test_dequant_matches_published_formulas():
    """gguf.quants.dequantize (used by the reference) agrees with the block
    formulas of the GGUF spec, written out here independently."""
    rng = np.random.default_rng(7)
    nb = 8

    def f16(v):
        return np.float16(v).tobytes()

    def halves(qs):  # low nibbles = elements 0..15, high nibbles = 16..31
        return np.concatenate([qs & 0xF, qs >> 4]).astype(np.int32)

    def hbits(qh):
        w = int.from_bytes(qh.tobytes(), "little")
        return np.array([(w >> j) & 1 for j in range(32)], dtype=np.int32)

    cases = {}
    for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        raw, want = bytearray(), []
        for _ in range(nb):
            d = np.float16(rng.uniform(0.01, 0.2))
            m = np.float16(rng.uniform(-1, 1))
            qs = rng.integers(0, 256, 16, dtype=np.uint8)
            qh = rng.integers(0, 256, 4, dtype=np.uint8)
            q8 = rng.integers(-128, 128, 32, dtype=np.int8)
            D, M = float(d), float(m)
            if t == "Q4_0":
                raw += f16(d) + qs.tobytes()
                want.append((halves(qs) - 8) * D)
            elif t == "Q4_1":
                raw += f16(d) + f16(m) + qs.tobytes()
                want.append(halves(qs) * D + M)
            elif t == "Q5_0":
                raw += f16(d) + qh.tobytes() + qs.tobytes()
                want.append(((halves(qs) | (hbits(qh) << 4)) - 16) * D)
            elif t == "Q5_1":
                raw += f16(d) + f16(m) + qh.tobytes() + qs.tobytes()
                want.append((halves(qs) | (hbits(qh) << 4)) * D + M)
            else:
                raw += f16(d) + q8.tobytes()
                want.append(q8.astype(np.int32) * D)
        cases[t] = (np.frombuffer(bytes(raw), dtype=np.uint8).reshape(1, -1), np.concatenate(want))
    bits = rng.integers(0, 0x7F00, 64, dtype=np.uint16)          # finite bf16 values
    cases["BF16"] = (bits.view(np.uint8).reshape(1, -1),
                     (bits.astype(np.uint32) << 16).view(np.float32))
    for t, (raw, want) in cases.items():
        got = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[t]).reshape(-1)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=t)


def test_ref_cache_matches_batch(real_ref):
    """Incremental (KV cache) evaluation equals one batched evaluation."""
    ids = SimpleBPE.from_model(real_ref).encode(PROMPTS["raw_story"])
    full = real_ref.forward(ids)
    c = real_ref.new_cache()
    parts = [real_ref.forward(ids[:7], c), real_ref.forward(ids[7:8], c), real_ref.forward(ids[8:], c)]
    assert np.max(rel_l2(np.concatenate(parts), full)) < 1e-10


def test_ref_answers_paris(real_ref):
    """Sanity of the reference itself on the real model."""
    tok = SimpleBPE.from_model(real_ref)
    ids = tok.encode(PROMPTS["chat_france"])
    assert ids[0] == real_ref.tokens.index("<|im_start|>")
    out, _ = real_ref.greedy(ids, 12)
    text = real_ref.decode(out)
    report(f"reference greedy for chat_france: {text!r}")
    assert "Paris" in text


# ============================================================= real model
_cases: dict = {}


def real_case(engine, ref, model_path, name):
    """Prompt ids (from the engine's tokenizer) and reference results, cached."""
    if name not in _cases:
        ids = engine.tokenize(model_path, PROMPTS[name])
        assert 10 <= len(ids) <= 40, f"{name}: {len(ids)} tokens"
        ref_seq, _ = ref.greedy(ids, N_GREEDY)
        _cases[name] = {"ids": ids, "logits": ref.forward(ids), "greedy": ref_seq}
    return _cases[name]


@pytest.mark.parametrize("name", PROMPTS)
def test_real_tokenize_matches_simple_bpe(engine, real_ref, real_model_path, name):
    """The engine's ids for the ASCII test prompts equal an independent BPE's."""
    ids = engine.tokenize(real_model_path, PROMPTS[name])
    assert ids == SimpleBPE.from_model(real_ref).encode(PROMPTS[name])


@pytest.mark.parametrize("name", PROMPTS)
def test_real_precise(engine, real_ref, real_model_path, work_dir, name):
    c = real_case(engine, real_ref, real_model_path, name)
    got = engine.logits(real_model_path, c["ids"], work_dir, real_ref.n_vocab, precise=True)
    err = rel_l2(got, c["logits"])
    report(f"real {name} precise: {len(c['ids'])} tok, rel L2 max {err.max():.2e} mean {err.mean():.2e}")
    assert err.max() < PRECISE_TOL, f"per-position rel L2 {np.round(err, 6).tolist()}"

    seq = engine.greedy(real_model_path, c["ids"], N_GREEDY, precise=True)
    report(f"real {name} precise greedy == reference: {seq == c['greedy']}  {real_ref.decode(seq)!r}")
    check_greedy_exact(real_ref, c["ids"], seq, c["greedy"], f"real {name} precise")


@pytest.mark.parametrize("name", PROMPTS)
def test_real_fast(engine, real_ref, real_model_path, work_dir, name):
    c = real_case(engine, real_ref, real_model_path, name)
    ref = c["logits"]
    got = engine.logits(real_model_path, c["ids"], work_dir, real_ref.n_vocab, precise=False)
    err = rel_l2(got, ref)
    top1 = float(np.mean(got.argmax(1) == ref.argmax(1)))
    report(f"real {name} fast: rel L2 max {err.max():.3e} mean {err.mean():.3e} top-1 agree {top1:.2f}")
    assert err.max() < FAST_REAL_MAX, f"per-position rel L2 {np.round(err, 4).tolist()}"
    assert err.mean() < FAST_REAL_MEAN
    assert top1 >= FAST_REAL_TOP1

    seq = engine.greedy(real_model_path, c["ids"], N_GREEDY, precise=False)
    L = teacher_forced(real_ref, c["ids"], seq)
    gaps = L.max(axis=1) - L[np.arange(N_GREEDY), seq]
    match = float(np.mean(gaps == 0))
    prefix = next((i for i in range(N_GREEDY) if seq[i] != c["greedy"][i]), N_GREEDY)
    report(f"real {name} fast greedy: equal to reference {seq == c['greedy']} (common prefix {prefix}), "
           f"teacher-forced argmax agreement {match:.2f}, max deficit {gaps.max():.3f}")
    assert match >= FAST_GREEDY_MATCH
    assert gaps.max() < FAST_GREEDY_GAP


def ref_embedding(ref, ids, pooling):
    h = ref.forward(ids, hidden=True)
    v = h.mean(axis=0) if pooling == "mean" else h[-1]
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_real_embedding(engine, real_ref, real_model_path, work_dir, pooling):
    """rlai_engine_embed (precise): the pooled, L2-normalised final-norm hidden
    state equals the float64 reference's; fast mode within a looser bound."""
    c = real_case(engine, real_ref, real_model_path, "raw_story")
    ref = ref_embedding(real_ref, c["ids"], pooling)
    got = engine.embed(real_model_path, c["ids"], work_dir, real_ref.n_embd, pooling, precise=True)
    err = np.linalg.norm(got - ref)
    fast = engine.embed(real_model_path, c["ids"], work_dir, real_ref.n_embd, pooling, precise=False)
    ferr = np.linalg.norm(fast - ref)
    report(f"real embedding {pooling}: precise L2 diff {err:.2e}, fast {ferr:.2e}, "
           f"norm {np.linalg.norm(got):.6f}")
    assert abs(np.linalg.norm(got) - 1) < 1e-5
    assert err < 1e-3, err
    assert ferr < 0.1, ferr


# ============================================================ tiny models
TINY = standard_specs()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {s.name: write_tiny(d / f"{s.name}.gguf", s) for s in TINY}


def tiny_ids(spec, n=12):
    rng = np.random.default_rng(spec.seed)
    return rng.integers(0, len(vocab()[0]), n).tolist()


@pytest.mark.parametrize("spec", TINY, ids=[s.name for s in TINY])
def test_tiny(engine, tiny_models, work_dir, spec):
    path = tiny_models[spec.name]
    ref_model = RefModel(path)
    assert ref_model.tied == spec.tied
    ids = tiny_ids(spec)
    ref = ref_model.forward(ids)
    nv = ref_model.n_vocab

    precise = engine.logits(path, ids, work_dir, nv, precise=True)
    e_p = rel_l2(precise, ref)
    fast = engine.logits(path, ids, work_dir, nv, precise=False)
    e_f = rel_l2(fast, ref)
    scal_p = engine.logits(path, ids, work_dir, nv, precise=True, isa="scalar")
    e_sp = rel_l2(scal_p, precise)
    scal_f = engine.logits(path, ids, work_dir, nv, precise=False, isa="scalar")
    e_sf = rel_l2(scal_f, fast)
    report(f"{spec.name}: precise {e_p.max():.1e}  fast {e_f.max():.1e}  "
           f"scalar-vs-auto precise {e_sp.max():.1e} fast {e_sf.max():.1e}")
    assert e_p.max() < PRECISE_TOL, f"precise per-position {np.round(e_p, 6).tolist()}"
    assert e_f.max() < FAST_TINY_MAX, f"fast per-position {np.round(e_f, 5).tolist()}"
    assert e_sp.max() < ISA_TOL
    assert e_sf.max() < ISA_FAST_TOL

    seq = engine.greedy(path, ids, 8, precise=True)
    ref_seq, _ = ref_model.greedy(ids, 8)
    check_greedy_exact(ref_model, ids, seq, ref_seq, f"{spec.name} precise")


def test_tiny_tokenize(engine, tiny_models):
    path = tiny_models[TINY[0].name]
    toks = vocab()[0]
    assert engine.tokenize(path, " the the") == [toks.index("Ġthe")] * 2
    assert engine.tokenize(path, "a" + EOT) == [toks.index("a"), toks.index(EOT)]


# ========================================================= hostile models
SANITIZER_MARKS = ("Sanitizer", "runtime error:")


def expect_refusal(engine, path, work_dir, needles):
    p = engine.run(path, "--precise", "--tokens", "1 2 3", "--out", work_dir / "hostile.bin", check=False)
    err = p.stderr
    assert p.returncode > 0, f"rc {p.returncode} (negative = killed by a signal)\n{err[-2000:]}"
    assert not any(m in err for m in SANITIZER_MARKS), err[-4000:]
    assert any(n.lower() in err.lower() for n in needles), \
        f"stderr does not name the problem (wanted one of {needles}):\n{err[-2000:]}"
    return err


def hostile(tmp_path, **kw):
    spec = TinySpec(**kw)
    return write_tiny(tmp_path / "hostile.gguf", spec)


def test_hostile_bad_shape(engine, tmp_path, work_dir):
    s = TinySpec()
    qd = s.n_head * (s.n_embd // s.n_head)
    path = hostile(tmp_path, shape_override={"blk.0.attn_q.weight": (qd + 32, s.n_embd)})
    expect_refusal(engine, path, work_dir, ["blk.0.attn_q.weight"])


def test_hostile_missing_tensor(engine, tmp_path, work_dir):
    path = hostile(tmp_path, drop={"blk.1.ffn_up.weight"})
    expect_refusal(engine, path, work_dir, ["blk.1.ffn_up.weight"])


def test_hostile_unsupported_type(engine, tmp_path, work_dir):
    # Q4_K needs ne0 % 256 == 0: n_ff 256 makes ffn_down's ne0 256.
    path = hostile(tmp_path, n_ff=256, type_override={"blk.0.ffn_down.weight": "Q4_K"})
    expect_refusal(engine, path, work_dir, ["blk.0.ffn_down.weight"])


def _patch_type(path, tensor, new_type):
    """Overwrite the ggml type id in the tensor-info record of `tensor`."""
    data = bytearray(path.read_bytes())
    name = tensor.encode()
    i = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, i)[0]
    struct.pack_into("<I", data, i + 4 + 8 * n_dims, new_type)
    path.write_bytes(bytes(data))


def test_hostile_unknown_type_id(engine, tmp_path, work_dir):
    path = hostile(tmp_path)
    _patch_type(path, "blk.0.attn_k.weight", 99)
    expect_refusal(engine, path, work_dir, ["blk.0.attn_k.weight"])


@pytest.mark.parametrize("where", ["header", "kv", "tensor_info", "data", "last_byte"])
def test_hostile_truncated(engine, tmp_path, work_dir, where):
    path = hostile(tmp_path)
    data = path.read_bytes()
    r = gguf.GGUFReader(path)
    first_info = data.index(b"token_embd.weight") - 8
    data_start = r.data_offset
    data_end = max(int(t.data_offset) + int(t.n_bytes) for t in r.tensors)  # before padding
    cut = {"header": 12, "kv": first_info // 2, "tensor_info": first_info + 20,
           "data": (data_start + data_end) // 2, "last_byte": data_end - 1}[where]
    path.write_bytes(data[:cut])
    names = [t.name for t in r.tensors]
    expect_refusal(engine, path, work_dir, ["truncat"] + names)
