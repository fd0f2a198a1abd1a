"""Independent float64 NumPy reference of the SigLIP + Idefics3 vision encoder.

Written from the published model descriptions (SigLIP's vision transformer:
conv patch embedding + learned position embedding, pre-norm LayerNorm
blocks, non-causal multi-head attention, gelu_pytorch_tanh MLP, post
LayerNorm; Idefics3's connector: pixel shuffle + bias-free linear) and the
GGUF names llama.cpp's mmproj files use, not from the engine's C code.
Weights come from gguf.GGUFReader + gguf.quants.dequantize.

Preprocessing is the engine's documented one (engine/vision.h): bilinear
resize to image_size x image_size with half-pixel centres and edge clamp,
/255, (v - mean) / std, planar CHW.
"""

from __future__ import annotations

import math

import numpy as np
import gguf

from ref_model import dequant_tensor, _field, ModelError


class RefVision:
    def __init__(self, path):
        r = gguf.GGUFReader(str(path))
        ptype = _field(r, "clip.projector_type") or _field(r, "clip.vision.projector_type")
        if ptype != "idefics3":
            raise ModelError(f"projector type {ptype!r} is not idefics3")

        def req(key):
            v = _field(r, "clip.vision." + key)
            if v is None:
                raise ModelError(f"missing key clip.vision.{key}")
            return v

        self.image_size = int(req("image_size"))
        self.patch = int(req("patch_size"))
        self.n_embd = int(req("embedding_length"))
        self.n_ff = int(req("feed_forward_length"))
        self.n_layer = int(req("block_count"))
        self.n_head = int(req("attention.head_count"))
        self.eps = float(req("attention.layer_norm_epsilon"))
        self.scale = int(req("projector.scale_factor"))
        self.mean = np.array(_field(r, "clip.vision.image_mean", [0.5] * 3), dtype=np.float64)
        self.std = np.array(_field(r, "clip.vision.image_std", [0.5] * 3), dtype=np.float64)
        self.grid = self.image_size // self.patch
        self.n_patches = self.grid * self.grid
        self.n_tokens = (self.grid // self.scale) ** 2

        t = {x.name: x for x in r.tensors}

        def get(name, optional=False):
            if name not in t:
                if optional:
                    return None
                raise ModelError(f"missing tensor {name}")
            return dequant_tensor(t[name]).astype(np.float64)

        E, P = self.n_embd, self.patch
        self.w_patch = get("v.patch_embd.weight")            # (E, 3, P, P)
        assert self.w_patch.shape == (E, 3, P, P), self.w_patch.shape
        self.b_patch = get("v.patch_embd.bias", optional=True)
        self.pos = get("v.position_embd.weight")              # (N, E)
        self.post_w = get("v.post_ln.weight", optional=True)
        self.post_b = get("v.post_ln.bias", optional=True)
        self.fc = get("mm.model.fc.weight")                   # (n_out, E*s*s)
        self.n_out = self.fc.shape[0]
        self.layers = []
        for i in range(self.n_layer):
            p = f"v.blk.{i}."
            L = {}
            for n in ("attn_q", "attn_k", "attn_v", "attn_out", "ffn_up", "ffn_down"):
                L[n] = get(p + n + ".weight")
                L[n + "_b"] = get(p + n + ".bias", optional=True)
            for n in ("ln1", "ln2"):
                L[n] = (get(p + n + ".weight"), get(p + n + ".bias"))
            self.layers.append(L)

    # ----------------------------------------------------------- pieces
    def preprocess(self, img: np.ndarray) -> np.ndarray:
        """img: (H, W, 3) uint8 -> (3, S, S) float64, normalised."""
        h, w = img.shape[:2]
        S = self.image_size

        def taps(n_in):
            x = (np.arange(S, dtype=np.float64) + 0.5) * n_in / S - 0.5
            x = np.maximum(x, 0.0)
            i0 = np.minimum(np.floor(x).astype(np.int64), n_in - 1)
            i1 = np.minimum(i0 + 1, n_in - 1)
            f = np.minimum(x - i0, 1.0)
            return i0, i1, f

        y0, y1, fy = taps(h)
        x0, x1, fx = taps(w)
        a = img.astype(np.float64)
        top = a[y0][:, x0] * (1 - fx)[None, :, None] + a[y0][:, x1] * fx[None, :, None]
        bot = a[y1][:, x0] * (1 - fx)[None, :, None] + a[y1][:, x1] * fx[None, :, None]
        out = top * (1 - fy)[:, None, None] + bot * fy[:, None, None]      # (S, S, 3)
        out = (out / 255.0 - self.mean) / self.std
        return np.ascontiguousarray(out.transpose(2, 0, 1))

    def _ln(self, x, wb):
        w, b = wb
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * w + b

    @staticmethod
    def _lin(x, w, b):
        y = x @ w.T
        return y if b is None else y + b

    @staticmethod
    def gelu_tanh(x):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    def patch_embed(self, pixels):
        """Stride-P convolution as a matrix product over flattened patches."""
        E, P, G = self.n_embd, self.patch, self.grid
        patches = pixels.reshape(3, G, P, G, P).transpose(1, 3, 0, 2, 4).reshape(G * G, 3 * P * P)
        x = patches @ self.w_patch.reshape(E, -1).T
        if self.b_patch is not None:
            x = x + self.b_patch
        return x + self.pos

    def pixel_shuffle(self, x):
        """Idefics3's connector reshape, step by step as its description gives it
        (view (h, w, d) -> (h, w/s, d*s) -> permute -> (w/s, h/s, d*s*s) -> permute)."""
        seq, d = x.shape
        s = self.scale
        h = w = int(round(math.sqrt(seq)))
        x = x.reshape(h, w, d)
        x = x.reshape(h, w // s, d * s)
        x = x.transpose(1, 0, 2)
        x = x.reshape(w // s, h // s, d * s * s)
        x = x.transpose(1, 0, 2)
        return x.reshape(seq // (s * s), d * s * s)

    def vit(self, pixels):
        """(3, S, S) -> the post-LN patch states (N, E)."""
        H = self.n_head
        D = self.n_embd // H
        x = self.patch_embed(pixels)
        N = x.shape[0]
        for L in self.layers:
            h = self._ln(x, L["ln1"])
            q = self._lin(h, L["attn_q"], L["attn_q_b"]).reshape(N, H, D)
            k = self._lin(h, L["attn_k"], L["attn_k_b"]).reshape(N, H, D)
            v = self._lin(h, L["attn_v"], L["attn_v_b"]).reshape(N, H, D)
            sc = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
            sc = sc - sc.max(axis=-1, keepdims=True)
            p = np.exp(sc)
            p /= p.sum(axis=-1, keepdims=True)
            att = np.einsum("hqk,khd->qhd", p, v).reshape(N, H * D)
            x = x + self._lin(att, L["attn_out"], L["attn_out_b"])
            h = self._ln(x, L["ln2"])
            u = self.gelu_tanh(self._lin(h, L["ffn_up"], L["ffn_up_b"]))
            x = x + self._lin(u, L["ffn_down"], L["ffn_down_b"])
        if self.post_w is not None:
            x = self._ln(x, (self.post_w, self.post_b))
        return x

    def encode(self, pixels):
        """(3, S, S) float -> (n_tokens, n_out) float64 embeddings for the LM."""
        return self.pixel_shuffle(self.vit(np.asarray(pixels, dtype=np.float64))) @ self.fc.T
