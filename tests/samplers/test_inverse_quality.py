"""PSNR and SSIM against direct float64 transcriptions of their definitions."""

import jax
import numpy as np
import pytest

from jaxlib_ext.samplers.inverse.quality import psnr, ssim


def _ssim_by_windows(x, y, size=11, sigma=1.5, data_range=1.0):
    """Wang et al. 2004 eq. (13) window by window, in float64, one grey image [H, W]."""
    g = np.exp(-0.5 * ((np.arange(size) - (size - 1) / 2) / sigma) ** 2)
    w = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    out = []
    for i in range(x.shape[0] - size + 1):
        for j in range(x.shape[1] - size + 1):
            a, b = x[i:i + size, j:j + size], y[i:i + size, j:j + size]
            ma, mb = (w * a).sum(), (w * b).sum()
            va, vb = (w * (a - ma) ** 2).sum(), (w * (b - mb) ** 2).sum()
            cab = (w * (a - ma) * (b - mb)).sum()
            out.append((2 * ma * mb + c1) * (2 * cab + c2)
                       / ((ma ** 2 + mb ** 2 + c1) * (va + vb + c2)))
    return np.mean(out)


@pytest.fixture
def pair():
    rng = np.random.default_rng(0)
    ref = rng.uniform(size=(3, 16, 14, 1))
    x = np.clip(ref + 0.2 * rng.normal(size=ref.shape), 0, 1)
    return x.astype(np.float32), ref.astype(np.float32)


def test_psnr_of_a_constant_offset():
    ref = np.full((2, 8, 8, 1), 0.25, np.float32)
    np.testing.assert_allclose(psnr(ref + 0.1, ref), [20.0, 20.0], rtol=1e-5)
    np.testing.assert_allclose(psnr(255 * (ref + 0.1), 255 * ref, data_range=255.0), 20.0,
                               rtol=1e-5)


def test_psnr_clips_the_reconstruction():
    ref = np.zeros((1, 4, 4, 1), np.float32)
    np.testing.assert_allclose(psnr(ref - 5.0, ref), 120.0, rtol=1e-6)  # clipped to 0: exact


def test_ssim_matches_its_definition(pair):
    x, ref = pair
    got = np.asarray(ssim(x, ref))
    want = [_ssim_by_windows(a[..., 0].astype(np.float64), b[..., 0].astype(np.float64))
            for a, b in zip(x, ref, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert got.shape == (3,)


def test_ssim_is_one_on_the_truth_and_symmetric(pair):
    x, ref = pair
    np.testing.assert_allclose(ssim(ref, ref), 1.0, atol=1e-6)
    np.testing.assert_allclose(ssim(x, ref), ssim(ref, x), atol=1e-6)
    assert np.all(np.asarray(ssim(x, ref)) < 0.9)


def test_ssim_scales_with_the_data_range_and_averages_channels(pair):
    x, ref = pair
    np.testing.assert_allclose(ssim(255 * x, 255 * ref, data_range=255.0), ssim(x, ref),
                               rtol=1e-4)
    two = ssim(np.concatenate([x, ref], -1), np.concatenate([ref, ref], -1))
    np.testing.assert_allclose(two, (np.asarray(ssim(x, ref)) + 1) / 2, rtol=1e-5)


def test_jit_and_leading_axes(pair):
    x, ref = pair
    batched = jax.jit(ssim)(x.reshape(1, 3, 16, 14, 1), ref.reshape(1, 3, 16, 14, 1))
    np.testing.assert_allclose(batched[0], ssim(x, ref), rtol=1e-6)
    assert jax.jit(psnr)(x, ref).shape == (3,)
    samples = np.stack([x, ref], axis=1)  # two samples per truth
    np.testing.assert_allclose(ssim(samples, ref[:, None]),
                               np.stack([ssim(x, ref), ssim(ref, ref)], 1), rtol=1e-6)
    np.testing.assert_allclose(psnr(samples, ref[:, None])[:, 0], psnr(x, ref), rtol=1e-6)


@pytest.mark.parametrize("call, match", [
    (lambda x: psnr(x, x[:2]), "ref"),
    (lambda x: psnr(x, x[..., :8, :]), "ref"),
    (lambda x: psnr(x[0, :, :, 0], x[0, :, :, 0]), "x"),
    (lambda x: psnr(x, x, data_range=0.0), "data_range"),
    (lambda x: ssim(x, x, window=4), "window"),
    (lambda x: ssim(x, x, sigma=-1.0), "sigma"),
    (lambda x: ssim(x[:, :8, :8], x[:, :8, :8]), "window"),
])
def test_bad_input(pair, call, match):
    with pytest.raises(ValueError, match=match):
        call(pair[0])
