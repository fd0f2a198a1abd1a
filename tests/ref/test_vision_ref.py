"""Reference-alone checks of ref_vision.py (no engine needed): the pieces the
engine's vision test (tests/test_vision.c) relies on, checked against
second, differently written formulations."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_tiny_vision import VisionSpec, write_mmproj, sample_image  # noqa: E402
from ref_vision import RefVision  # noqa: E402


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    p = write_mmproj(tmp_path_factory.mktemp("vision") / "tiny-mmproj-F32.gguf", VisionSpec())
    return RefVision(p)


def test_pixel_shuffle_is_the_documented_index_map(ref):
    """Idefics3's view/permute sequence == token i*(G/s)+j, feature (b*s+a)*E+e
    from patch (i*s+b, j*s+a) (the map engine/vision.h documents)."""
    G, s, E = ref.grid, ref.scale, 5
    x = np.random.default_rng(1).standard_normal((G * G, E))
    y = ref.pixel_shuffle(x)
    g2 = G // s
    for i in range(g2):
        for j in range(g2):
            for b in range(s):
                for a in range(s):
                    np.testing.assert_array_equal(
                        y[i * g2 + j, (b * s + a) * E:(b * s + a + 1) * E], x[(i * s + b) * G + j * s + a])


def test_patch_embedding_is_a_stride_p_convolution(ref):
    px = np.random.default_rng(2).standard_normal((3, ref.image_size, ref.image_size))
    x = ref.patch_embed(px)
    P, G = ref.patch, ref.grid
    for n in (0, 5, G * G - 1):
        py, pxi = divmod(n, G)
        win = px[:, py * P:(py + 1) * P, pxi * P:(pxi + 1) * P]
        conv = np.einsum("ecyx,cyx->e", ref.w_patch, win) + ref.b_patch + ref.pos[n]
        np.testing.assert_allclose(x[n], conv, rtol=1e-12, atol=1e-12)


def test_preprocess_constant_and_identity(ref):
    S = ref.image_size
    flat = np.full((13, 31, 3), 200, dtype=np.uint8)
    out = ref.preprocess(flat)
    np.testing.assert_allclose(out, ((200 / 255.0 - ref.mean) / ref.std)[:, None, None] * np.ones((3, S, S)))
    img = np.random.default_rng(3).integers(0, 256, (S, S, 3), dtype=np.uint8)
    same = ref.preprocess(img) * ref.std[:, None, None] + ref.mean[:, None, None]
    np.testing.assert_allclose(same, img.transpose(2, 0, 1) / 255.0, atol=1e-12)


def test_two_images_give_different_embeddings(ref):
    e1 = ref.encode(ref.preprocess(sample_image(5)))
    e2 = ref.encode(ref.preprocess(sample_image(6)))
    assert e1.shape == (ref.n_tokens, ref.n_out)
    assert np.linalg.norm(e1 - e2) > 0.1 * np.linalg.norm(e1)
