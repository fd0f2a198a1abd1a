"""Write tiny synthetic llama/qwen2 GGUF models for the reference tests.

    python3 make_tiny.py OUT_DIR            # writes every standard tiny model

Each model: 2 layers, n_embd 64, 4 heads (head_dim 16), 2 KV heads (GQA),
n_ff 128, context 128, rope base 10000, eps 1e-5, seeded random weights
(normal * 0.1; norms 1 + normal * 0.1, F32).  All matrices and the token
embedding are stored in the chosen type.  The tokenizer is a minimal GPT-2
byte-level BPE: the 256 byte tokens (type 1, in byte order), three merged
tokens ("Ġt", "he", "Ġthe", with their merges) and "<|endoftext|>" (type 3,
bos = eos).

Hostile variants (bad shape, missing tensor, unsupported type) are made with
the ``shape_override`` / ``drop`` / ``type_override`` fields of TinySpec.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import gguf
import gguf.quants

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ref_model import gpt2_byte_chars  # noqa: E402

T = gguf.GGMLQuantizationType
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "BF16": 32}
MERGES = ["Ġ t", "h e", "Ġt he"]
MERGED_TOKENS = ["Ġt", "he", "Ġthe"]
EOT = "<|endoftext|>"


@dataclass
class TinySpec:
    arch: str = "llama"            # "llama" (RoPE NORMAL) or "qwen2" (NEOX + q/k/v biases)
    wtype: str = "Q8_0"            # type of every matrix and of token_embd
    tied: bool = True              # no output.weight -> token_embd is the LM head
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_layer: int = 2
    n_ctx: int = 128
    rope_base: float = 10000.0
    eps: float = 1e-5
    seed: int = 1234
    drop: set = field(default_factory=set)               # tensor names to leave out
    shape_override: dict = field(default_factory=dict)   # name -> numpy shape (rows, cols)
    type_override: dict = field(default_factory=dict)    # name -> type name (e.g. "Q4_K")

    @property
    def name(self):
        return f"tiny-{self.arch}-{self.wtype}-{'tied' if self.tied else 'untied'}"


def vocab():
    toks = gpt2_byte_chars() + MERGED_TOKENS + [EOT]
    types = [1] * (256 + len(MERGED_TOKENS)) + [3]
    return toks, types


def _encode(w: np.ndarray, tname: str):
    """Return (array, raw_dtype) for GGUFWriter.add_tensor; w has shape (ne1, ne0)
    (or more dimensions, outermost first: quantized, the rows are ne1 x ...)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if tname == "F32":
        return w, None
    if tname == "F16":
        return w.astype(np.float16), None
    qt = T[tname]
    if tname in ("Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K") or tname.startswith("IQ"):
        # bytes only matter for their size: an engine must refuse the type
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        assert w.shape[1] % bs == 0, "ne0 must be a multiple of the block size"
        raw = np.zeros((w.shape[0], w.shape[1] // bs * ts), dtype=np.uint8)
        return raw, qt
    return gguf.quants.quantize(w.reshape(w.shape[0], -1), qt), qt


def write_tensors_and_close(w: gguf.GGUFWriter, tensors: dict):
    """Adds tensors (name -> (float32 array in numpy order, type name)),
    each stored in its type, then writes the file and closes the writer."""
    for name, (arr, tname) in tensors.items():
        data, raw = _encode(arr, tname)
        if raw is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tensors(spec: TinySpec):
    """Float32 master weights: dict name -> (numpy array (ne1, ne0), type name)."""
    rng = np.random.default_rng(spec.seed)
    E, F = spec.n_embd, spec.n_ff
    D = E // spec.n_head
    qd, kvd = spec.n_head * D, spec.n_head_kv * D
    n_vocab = len(vocab()[0])
    out = {}

    def mat(name, shape, scale=0.1):
        shape = spec.shape_override.get(name, shape)
        out[name] = ((rng.standard_normal(shape) * scale).astype(np.float32),
                     spec.type_override.get(name, spec.wtype))

    def norm(name, n):
        out[name] = ((1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32), "F32")

    mat("token_embd.weight", (n_vocab, E), 0.5)
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", E)
        mat(p + "attn_q.weight", (qd, E))
        mat(p + "attn_k.weight", (kvd, E))
        mat(p + "attn_v.weight", (kvd, E))
        if spec.arch == "qwen2":
            for b, n in (("attn_q.bias", qd), ("attn_k.bias", kvd), ("attn_v.bias", kvd)):
                out[p + b] = ((0.1 * rng.standard_normal(n)).astype(np.float32), "F32")
        mat(p + "attn_output.weight", (E, qd))
        norm(p + "ffn_norm.weight", E)
        mat(p + "ffn_gate.weight", (F, E))
        mat(p + "ffn_up.weight", (F, E))
        mat(p + "ffn_down.weight", (E, F))
    norm("output_norm.weight", E)
    if not spec.tied:
        mat("output.weight", (n_vocab, E), 0.5)
    for name in spec.drop:
        out.pop(name, None)
    return out


def write_tiny(path, spec: TinySpec) -> Path:
    path = Path(path)
    a = spec.arch
    w = gguf.GGUFWriter(str(path), a)
    w.add_name(spec.name)
    w.add_uint32(f"{a}.context_length", spec.n_ctx)
    w.add_uint32(f"{a}.embedding_length", spec.n_embd)
    w.add_uint32(f"{a}.block_count", spec.n_layer)
    w.add_uint32(f"{a}.feed_forward_length", spec.n_ff)
    w.add_uint32(f"{a}.attention.head_count", spec.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", spec.n_head_kv)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", spec.eps)
    w.add_uint32(f"{a}.rope.dimension_count", spec.n_embd // spec.n_head)
    w.add_float32(f"{a}.rope.freq_base", spec.rope_base)
    toks, types = vocab()
    w.add_uint32(f"{a}.vocab_size", len(toks))
    w.add_uint32("general.file_type", FILE_TYPE.get(spec.wtype, 0))
    if spec.wtype.startswith("Q") or any(t.startswith(("Q", "IQ")) for t in spec.type_override.values()):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    eot = toks.index(EOT)
    w.add_bos_token_id(eot)
    w.add_eos_token_id(eot)
    w.add_add_bos_token(False)
    write_tensors_and_close(w, tensors(spec))
    return path


def standard_specs():
    """Every weight type x both rope modes; tied/untied alternate."""
    specs = []
    for i, t in enumerate(TYPES):
        specs.append(TinySpec(arch="llama", wtype=t, tied=(i % 2 == 0), seed=100 + i))
        specs.append(TinySpec(arch="qwen2", wtype=t, tied=(i % 2 == 1), seed=200 + i))
    return specs


if __name__ == "__main__":
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    for s in standard_specs():
        p = write_tiny(out_dir / f"{s.name}.gguf", s)
        print(p)
