"""Independent NumPy reference of the llama-family forward pass (llama, qwen2).

Written from the published model description (GGUF layout, RMSNorm, RoPE
NORMAL/NEOX, GQA causal attention, SwiGLU FFN, tied embeddings), not from the
engine's C code.  Weights are read with gguf.GGUFReader and dequantized with
gguf.quants.dequantize; all arithmetic is float64.

Optional ``act_q8=True`` emulates 8-bit activation quantization (blocks of 32,
d = amax/127, round-to-nearest) on the input of every weight matmul.  It is
only used to *predict* how far an engine's fast mode may drift; the tests
always compare the engine against the exact float64 path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import gguf
import gguf.quants

ROPE_NORMAL = 0   # rotate adjacent pairs (x[2i], x[2i+1])
ROPE_NEOX = 2     # rotate (x[i], x[i + n_rot/2])

ARCH_ROPE = {"llama": ROPE_NORMAL, "qwen2": ROPE_NEOX}


class ModelError(Exception):
    pass


def _field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def dequant_tensor(t) -> np.ndarray:
    """Dequantize a ReaderTensor to float32 with numpy shape (ne1, ne0)."""
    qtype = gguf.GGMLQuantizationType(int(t.tensor_type))
    data = np.asarray(t.data)
    out = gguf.quants.dequantize(data, qtype)
    ne = [int(n) for n in t.shape]            # ggml order, ne[0] fastest
    return np.asarray(out, dtype=np.float32).reshape(tuple(reversed(ne)))


@dataclass
class KVCache:
    k: list = field(default_factory=list)   # per layer: (S, n_head_kv, head_dim)
    v: list = field(default_factory=list)
    n: int = 0


class RefModel:
    def __init__(self, path, act_q8: bool = False):
        self.path = str(path)
        self.act_q8 = act_q8
        r = gguf.GGUFReader(self.path)
        self.arch = _field(r, "general.architecture")
        if self.arch not in ARCH_ROPE:
            raise ModelError(f"unsupported architecture {self.arch!r}")
        a = self.arch

        def req(key):
            v = _field(r, f"{a}.{key}")
            if v is None:
                raise ModelError(f"missing key {a}.{key}")
            return v

        self.n_embd = int(req("embedding_length"))
        self.n_layer = int(req("block_count"))
        self.n_ff = int(req("feed_forward_length"))
        self.n_head = int(req("attention.head_count"))
        self.n_head_kv = int(_field(r, f"{a}.attention.head_count_kv", self.n_head))
        self.eps = float(req("attention.layer_norm_rms_epsilon"))
        self.n_ctx = int(req("context_length"))
        self.head_dim = int(_field(r, f"{a}.attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(_field(r, f"{a}.rope.dimension_count", self.head_dim))
        self.rope_base = float(_field(r, f"{a}.rope.freq_base", 10000.0))
        self.rope_mode = ARCH_ROPE[a]
        if self.n_head % self.n_head_kv:
            raise ModelError("n_head not a multiple of n_head_kv")

        # tokenizer (only for decoding / the sanity tokenizer)
        self.tokens = _field(r, "tokenizer.ggml.tokens", [])
        self.token_types = _field(r, "tokenizer.ggml.token_type", [])
        self.merges = _field(r, "tokenizer.ggml.merges", [])
        self.bos_id = _field(r, "tokenizer.ggml.bos_token_id")
        self.eos_id = _field(r, "tokenizer.ggml.eos_token_id")
        self.pre = _field(r, "tokenizer.ggml.pre", "default")

        tensors = {t.name: t for t in r.tensors}

        def load(name, shape, optional=False):
            t = tensors.get(name)
            if t is None:
                if optional:
                    return None
                raise ModelError(f"missing tensor {name}")
            w = dequant_tensor(t)
            if tuple(w.shape) != tuple(shape):
                raise ModelError(f"tensor {name}: shape {w.shape}, expected {shape}")
            return w.astype(np.float64)

        E, D = self.n_embd, self.head_dim
        q_dim, kv_dim = self.n_head * D, self.n_head_kv * D
        emb = tensors.get("token_embd.weight")
        if emb is None:
            raise ModelError("missing tensor token_embd.weight")
        self.n_vocab = int(emb.shape[1])
        self.tok_embd = load("token_embd.weight", (self.n_vocab, E))
        self.out_norm = load("output_norm.weight", (E,))
        out = load("output.weight", (self.n_vocab, E), optional=True)
        self.tied = out is None
        self.output = self.tok_embd if out is None else out

        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            L = {
                "attn_norm": load(p + "attn_norm.weight", (E,)),
                "wq": load(p + "attn_q.weight", (q_dim, E)),
                "wk": load(p + "attn_k.weight", (kv_dim, E)),
                "wv": load(p + "attn_v.weight", (kv_dim, E)),
                "wo": load(p + "attn_output.weight", (E, q_dim)),
                "ffn_norm": load(p + "ffn_norm.weight", (E,)),
                "w_gate": load(p + "ffn_gate.weight", (self.n_ff, E)),
                "w_up": load(p + "ffn_up.weight", (self.n_ff, E)),
                "w_down": load(p + "ffn_down.weight", (E, self.n_ff)),
                "bq": load(p + "attn_q.bias", (q_dim,), optional=True),
                "bk": load(p + "attn_k.bias", (kv_dim,), optional=True),
                "bv": load(p + "attn_v.bias", (kv_dim,), optional=True),
            }
            self.layers.append(L)

        # RoPE inverse frequencies: theta_i = pos * base^(-2i/n_rot)
        half = self.n_rot // 2
        self.inv_freq = self.rope_base ** (-2.0 * np.arange(half, dtype=np.float64) / self.n_rot)

    # ---------------------------------------------------------------- pieces
    def _rmsnorm(self, x, w):
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.eps) * w

    @staticmethod
    def _q8(x):
        """Round each block of 32 activations to int8 with scale amax/127."""
        shp = x.shape
        if shp[-1] % 32:
            return x
        b = x.reshape(-1, 32).astype(np.float32)
        d = np.abs(b).max(axis=1, keepdims=True) / 127.0
        d = d.astype(np.float16).astype(np.float32)   # scale stored as f16
        inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0)
        q = np.clip(np.round(b * inv), -127, 127)
        return (q * d).astype(np.float64).reshape(shp)

    def _mm(self, x, w):
        if self.act_q8:
            x = self._q8(x)
        return x @ w.T

    def _rope(self, x, pos):
        """x: (T, H, D); pos: (T,) absolute positions."""
        half = self.n_rot // 2
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]   # (T, half)
        c = np.cos(ang)[:, None, :]
        s = np.sin(ang)[:, None, :]
        y = x.copy()
        if self.rope_mode == ROPE_NORMAL:
            x0 = x[..., 0:self.n_rot:2]
            x1 = x[..., 1:self.n_rot:2]
            y[..., 0:self.n_rot:2] = x0 * c - x1 * s
            y[..., 1:self.n_rot:2] = x0 * s + x1 * c
        else:
            x0 = x[..., :half]
            x1 = x[..., half:self.n_rot]
            y[..., :half] = x0 * c - x1 * s
            y[..., half:self.n_rot] = x0 * s + x1 * c
        return y

    # --------------------------------------------------------------- forward
    def new_cache(self) -> KVCache:
        return KVCache(k=[None] * self.n_layer, v=[None] * self.n_layer, n=0)

    def forward(self, tokens, cache: KVCache | None = None, last_only=False, hidden=False,
                embd_rows=None):
        """Evaluate tokens (appended after what the cache holds).

        Returns logits (T, n_vocab) float64, or (n_vocab,) for last_only;
        with hidden=True the final-norm hidden states (T, n_embd) instead.
        embd_rows: optional {index in tokens: (n_embd,) vector} whose rows
        replace those tokens' input embeddings (a VLM's image rows)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        if T == 0:
            raise ValueError("no tokens")
        if tokens.min() < 0 or tokens.max() >= self.n_vocab:
            raise ValueError("token id out of range")
        if cache is None:
            cache = self.new_cache()
        start = cache.n
        pos = np.arange(start, start + T)
        H, Hkv, D = self.n_head, self.n_head_kv, self.head_dim
        group = H // Hkv
        scale = 1.0 / math.sqrt(D)

        x = self.tok_embd[tokens].copy()                      # (T, E)
        for i, row in (embd_rows or {}).items():
            x[i] = np.asarray(row, dtype=np.float64)
        for li, L in enumerate(self.layers):
            h = self._rmsnorm(x, L["attn_norm"])
            q = self._mm(h, L["wq"])
            k = self._mm(h, L["wk"])
            v = self._mm(h, L["wv"])
            if L["bq"] is not None:
                q = q + L["bq"]
            if L["bk"] is not None:
                k = k + L["bk"]
            if L["bv"] is not None:
                v = v + L["bv"]
            q = self._rope(q.reshape(T, H, D), pos)
            k = self._rope(k.reshape(T, Hkv, D), pos)
            v = v.reshape(T, Hkv, D)
            if cache.k[li] is None:
                cache.k[li], cache.v[li] = k, v
            else:
                cache.k[li] = np.concatenate([cache.k[li], k], axis=0)
                cache.v[li] = np.concatenate([cache.v[li], v], axis=0)
            K, V = cache.k[li], cache.v[li]                   # (S, Hkv, D)
            S = K.shape[0]
            # GQA: query head h uses kv head h // group
            Kh = np.repeat(K, group, axis=1)                  # (S, H, D)
            Vh = np.repeat(V, group, axis=1)
            sc = np.einsum("thd,shd->hts", q, Kh) * scale     # (H, T, S)
            kpos = np.arange(S)
            mask = kpos[None, :] > pos[:, None]               # (T, S) future keys
            sc = np.where(mask[None], -np.inf, sc)
            sc = sc - sc.max(axis=-1, keepdims=True)
            p = np.exp(sc)
            p /= p.sum(axis=-1, keepdims=True)
            att = np.einsum("hts,shd->thd", p, Vh).reshape(T, H * D)
            x = x + self._mm(att, L["wo"])

            h = self._rmsnorm(x, L["ffn_norm"])
            g = self._mm(h, L["w_gate"])
            u = self._mm(h, L["w_up"])
            act = g / (1.0 + np.exp(-g)) * u                  # SiLU(g) * u
            x = x + self._mm(act, L["w_down"])
        cache.n += T

        if last_only:
            x = x[-1:]
        x = self._rmsnorm(x, self.out_norm)
        if hidden:
            return x[0] if last_only else x
        logits = self._mm(x, self.output)
        return logits[0] if last_only else logits

    def greedy(self, prompt, n):
        """Greedy continuation of n tokens (no stop on EOS). Returns (ids, step_logits)."""
        cache = self.new_cache()
        logits = self.forward(prompt, cache, last_only=True)
        out, steps = [], []
        for i in range(n):
            tok = int(np.argmax(logits))
            out.append(tok)
            steps.append(logits)
            if i + 1 < n:
                logits = self.forward([tok], cache, last_only=True)
        return out, steps

    # ------------------------------------------------------------- decoding
    def decode(self, ids):
        inv = {c: b for b, c in enumerate(gpt2_byte_chars())}
        data = bytearray()
        for i in ids:
            s = self.tokens[i]
            if self.token_types and self.token_types[i] == 3:   # control token
                data += s.encode()
                continue
            for ch in s:
                if ch in inv:
                    data.append(inv[ch])
                else:
                    data += ch.encode()
        return data.decode("utf-8", errors="replace")


def gpt2_byte_chars():
    """The GPT-2 byte-to-unicode map as a list indexed by byte value."""
    direct = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    chars, nxt = [], 0x100
    for b in range(256):
        if b in direct:
            chars.append(chr(b))
        else:
            chars.append(chr(nxt))
            nxt += 1
    return chars


def rel_l2(a, b):
    """Per-row relative L2 error ||a-b|| / ||b||  (b = reference)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)
