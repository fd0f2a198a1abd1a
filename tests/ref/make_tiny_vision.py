"""Write a tiny random-weight mmproj (SigLIP + Idefics3 projector) and the
float64 reference outputs the engine's vision test (tests/test_vision.c)
compares against.

    python3 make_tiny_vision.py OUT_DIR

Files (all under OUT_DIR):
  tiny-mmproj-{F32,F16,Q8_0}.gguf   image 64, patch 8 (8x8 grid, 64 patches),
                                    n_embd 64, 4 heads, n_ff 128, 2 layers,
                                    scale_factor 2 (16 tokens), projection to
                                    64 (the tiny LMs' n_embd), mean/std not
                                    0.5 so normalisation is exercised
  vision-image.ppm                  a 45x29 seeded random RGB image (P6)
  vision-pixels.f64                 RefVision.preprocess of it (3*64*64 doubles)
  tiny-mmproj-X.out.f64             RefVision.encode of those pixels (16*64)
  vision-image2.ppm / tiny-mmproj-F32.out2.f64   a second image (the
                                    prefix-cache test needs two different ones)
  tiny-lm-F32.gguf                  a tiny llama LM (make_tiny.py, n_embd 64, F32)
                                    whose vocabulary adds "<image>" (id 260, a
                                    control token) after make_tiny's 260
  vision-prompt.i32                 [image position, n, n prompt ids]: "Hi " +
                                    16 image tokens + " and what is in it?"
                                    (38 ids: two full KV blocks hold image rows)
  vision-lm-logits{,2}.f64          RefModel logits (n x n_vocab) of that prompt
                                    with the placeholders' input embeddings
                                    replaced by the reference image rows of
                                    image 1 (image 2)
  tiny-mmproj-bad-*.gguf            hostile files: a wrong shape, a missing
                                    tensor, a patch grid not divisible by the
                                    scale factor, another projector type, a
                                    missing key (patch_size), a negative eps;
  tiny-mmproj-width32.gguf          a valid encoder projecting to 32 (the LM
                                    has 64: the engine must refuse the pair)
    python3 make_tiny_vision.py --smolvlm256 FILE
writes one random-weight F16 mmproj with SmolVLM-256M's geometry (image
512, patch 16, n_embd 768, 12 heads, n_ff 3072, 12 layers, scale factor 4,
projection to 576) for bench/bench_vision.c.

Matrices are stored in the variant's type (the patch kernel in F16 for
Q8_0); norms, biases and the position embedding in F32. Seeded: the files are the same on every run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ref_vision import RefVision  # noqa: E402
from ref_model import RefModel  # noqa: E402
import make_tiny  # noqa: E402
from make_tiny import TinySpec, write_tensors_and_close, write_tiny  # noqa: E402

IMG_W, IMG_H = 45, 29
IMAGE_TOKEN = "<image>"


@dataclass
class VisionSpec:
    wtype: str = "F32"
    image_size: int = 64
    patch: int = 8
    n_embd: int = 64
    n_head: int = 4
    n_ff: int = 128
    n_layer: int = 2
    scale: int = 2
    n_out: int = 64
    eps: float = 1e-6
    mean: tuple = (0.48, 0.45, 0.40)
    std: tuple = (0.26, 0.26, 0.27)
    projector: str = "idefics3"
    seed: int = 77
    drop: set = field(default_factory=set)
    drop_keys: set = field(default_factory=set)       # metadata keys to leave out
    shape_override: dict = field(default_factory=dict)


def write_mmproj(path, spec: VisionSpec) -> Path:
    rng = np.random.default_rng(spec.seed)
    E, F, P = spec.n_embd, spec.n_ff, spec.patch
    G = spec.image_size // P
    tensors = {}   # name -> (array in numpy order, type)

    def mat(name, shape, scale=0.1, tname=None):
        shape = spec.shape_override.get(name, shape)
        tensors[name] = ((rng.standard_normal(shape) * scale).astype(np.float32), tname or spec.wtype)

    def vec(name, n, base=0.0, scale=0.1):
        tensors[name] = ((base + scale * rng.standard_normal(n)).astype(np.float32), "F32")

    # the 4-D conv kernel stays F16 in the quantized variant (as llama.cpp's
    # converter leaves it; a quantized 4-D tensor has no byte shape here)
    mat("v.patch_embd.weight", (E, 3, P, P), 0.05, "F16" if spec.wtype.startswith("Q") else None)
    vec("v.patch_embd.bias", E)
    mat("v.position_embd.weight", (G * G, E), 0.5, "F32")
    for i in range(spec.n_layer):
        p = f"v.blk.{i}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            mat(p + n + ".weight", (E, E), 0.15)
            vec(p + n + ".bias", E)
        mat(p + "ffn_up.weight", (F, E), 0.15)
        vec(p + "ffn_up.bias", F)
        mat(p + "ffn_down.weight", (E, F), 0.1)
        vec(p + "ffn_down.bias", E)
        for n in ("ln1", "ln2"):
            vec(p + n + ".weight", E, 1.0)
            vec(p + n + ".bias", E)
    vec("v.post_ln.weight", E, 1.0)
    vec("v.post_ln.bias", E)
    mat("mm.model.fc.weight", (spec.n_out, E * spec.scale ** 2), 0.1)
    for n in spec.drop:
        tensors.pop(n, None)

    w = gguf.GGUFWriter(str(path), "clip")
    if spec.drop_keys:                    # leave keys out by filtering the writer's adds
        add_u32, add_f32 = w.add_uint32, w.add_float32
        w.add_uint32 = lambda k, v: None if k in spec.drop_keys else add_u32(k, v)
        w.add_float32 = lambda k, v: None if k in spec.drop_keys else add_f32(k, v)
    w.add_name("tiny-mmproj")
    w.add_string("clip.projector_type", spec.projector)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_text_encoder", False)
    w.add_uint32("clip.vision.image_size", spec.image_size)
    w.add_uint32("clip.vision.patch_size", spec.patch)
    w.add_uint32("clip.vision.embedding_length", E)
    w.add_uint32("clip.vision.feed_forward_length", F)
    w.add_uint32("clip.vision.block_count", spec.n_layer)
    w.add_uint32("clip.vision.attention.head_count", spec.n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", spec.eps)
    w.add_uint32("clip.vision.projection_dim", spec.n_out)
    w.add_uint32("clip.vision.projector.scale_factor", spec.scale)
    w.add_array("clip.vision.image_mean", [float(x) for x in spec.mean])
    w.add_array("clip.vision.image_std", [float(x) for x in spec.std])
    write_tensors_and_close(w, tensors)
    return Path(path)


def write_ppm(path, img: np.ndarray):
    h, w, _ = img.shape
    with open(path, "wb") as f:
        f.write(f"P6\n{w} {h}\n255\n".encode())
        f.write(np.ascontiguousarray(img, dtype=np.uint8).tobytes())


def sample_image(seed):
    """A smooth gradient plus noise, so the resize has structure to get wrong."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:IMG_H, 0:IMG_W]
    base = np.stack([xx * 255.0 / IMG_W, yy * 255.0 / IMG_H, (xx + yy) * 127.0 / (IMG_W + IMG_H)], -1)
    img = base + rng.normal(0, 40, base.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def main(out_dir: Path):
    out_dir.mkdir(parents=True, exist_ok=True)
    img, img2 = sample_image(5), sample_image(6)
    write_ppm(out_dir / "vision-image.ppm", img)
    write_ppm(out_dir / "vision-image2.ppm", img2)
    pixels = pixels2 = None
    for t in ("F32", "F16", "Q8_0"):
        p = write_mmproj(out_dir / f"tiny-mmproj-{t}.gguf", VisionSpec(wtype=t))
        ref = RefVision(p)
        if pixels is None:
            pixels = ref.preprocess(img)
            pixels2 = ref.preprocess(img2)
            pixels.astype("<f8").tofile(out_dir / "vision-pixels.f64")
        ref.encode(pixels).astype("<f8").tofile(out_dir / f"tiny-mmproj-{t}.out.f64")
        if t == "F32":
            ref.encode(pixels2).astype("<f8").tofile(out_dir / f"tiny-mmproj-{t}.out2.f64")
    base_vocab = make_tiny.vocab
    make_tiny.vocab = lambda: (base_vocab()[0] + [IMAGE_TOKEN], base_vocab()[1] + [3])
    try:
        lm = RefModel(write_tiny(out_dir / "tiny-lm-F32.gguf", TinySpec(arch="llama", wtype="F32", seed=300)))
    finally:
        make_tiny.vocab = base_vocab
    image_id = lm.tokens.index(IMAGE_TOKEN)
    ref = RefVision(out_dir / "tiny-mmproj-F32.gguf")
    assert lm.n_embd == ref.n_out
    text_a = list(b"Hi ")                  # byte tokens: id = byte (no merges apply)
    text_b = list(b" and what is in it?")
    img_pos = len(text_a)
    prompt = text_a + [image_id] * ref.n_tokens + text_b
    np.array([img_pos, len(prompt)] + prompt, dtype="<i4").tofile(out_dir / "vision-prompt.i32")
    for suffix, px in (("", pixels), ("2", pixels2)):
        rows = ref.encode(px)
        embd = {img_pos + r: rows[r] for r in range(ref.n_tokens)}
        lm.forward(prompt, embd_rows=embd).astype("<f8").tofile(out_dir / f"vision-lm-logits{suffix}.f64")
    write_mmproj(out_dir / "tiny-mmproj-bad-shape.gguf",
                 VisionSpec(shape_override={"v.blk.1.attn_q.weight": (64, 32)}))
    write_mmproj(out_dir / "tiny-mmproj-bad-missing.gguf", VisionSpec(drop={"v.blk.0.ffn_down.weight"}))
    write_mmproj(out_dir / "tiny-mmproj-bad-grid.gguf", VisionSpec(scale=3))
    write_mmproj(out_dir / "tiny-mmproj-bad-projector.gguf", VisionSpec(projector="mlp"))
    write_mmproj(out_dir / "tiny-mmproj-bad-key.gguf", VisionSpec(drop_keys={"clip.vision.patch_size"}))
    write_mmproj(out_dir / "tiny-mmproj-bad-eps.gguf", VisionSpec(eps=-1.0))
    write_mmproj(out_dir / "tiny-mmproj-width32.gguf", VisionSpec(n_out=32))   # not the LM's n_embd
    (out_dir / "stamp").write_text("ok\n")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--smolvlm256":
        write_mmproj(sys.argv[2], VisionSpec(wtype="F16", image_size=512, patch=16, n_embd=768, n_head=12,
                                             n_ff=3072, n_layer=12, scale=4, n_out=576))
        sys.exit(0)
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
    if len(sys.argv) > 2:              # the build system's stamp file
        Path(sys.argv[2]).write_text("ok\n")
