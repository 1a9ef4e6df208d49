"""Full-reference image quality: PSNR and SSIM of reconstructions against the truth.

Both take images channels-last ``[..., H, W, C]`` (NHWC, as ``jaxlib_ext.core.images`` loads them)
with values in ``[0, data_range]``; the reconstruction ``x`` is clipped to that range first,
the leading axes of ``ref`` broadcast against those of ``x`` (one truth for several samples:
``ref[:, None]``), and one number per image comes back (``[...]``). Both are pure
``jax.numpy`` and jit-able.

* :func:`psnr`: ``10 log10(data_range^2 / MSE)``, the mean over pixels and channels.
* :func:`ssim`: Wang, Bovik, Sheikh and Simoncelli, "Image quality assessment: from error
  visibility to structural similarity", IEEE TIP 13(4), 2004, eq. (13): local means, variances
  and covariance under an 11x11 Gaussian window (sigma 1.5) over the *valid* window positions
  only (no padding), constants ``C1 = (0.01 L)^2``, ``C2 = (0.03 L)^2``, averaged over window
  positions and channels (the mean SSIM of the paper's eq. (17)). This is the reference
  definition that ``skimage.metrics.structural_similarity(..., gaussian_weights=True,
  sigma=1.5, use_sample_covariance=False)`` follows, except that skimage crops its padded
  border instead of never padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["psnr", "ssim"]


def _check(x, ref, data_range, min_size=1):
    x, ref = jnp.asarray(x), jnp.asarray(ref)
    if x.ndim < 3:
        raise ValueError(f"x: expected images [..., H, W, C], got shape {x.shape}")
    if ref.shape[-3:] != x.shape[-3:]:
        raise ValueError(f"ref: expected images of x's shape {x.shape[-3:]}, got {ref.shape}")
    try:
        shape = jnp.broadcast_shapes(x.shape, ref.shape)
    except ValueError as e:
        raise ValueError(f"ref: leading axes {ref.shape[:-3]} do not broadcast against x's "
                         f"{x.shape[:-3]}") from e
    if not (isinstance(data_range, int | float) and np.isfinite(data_range) and data_range > 0):
        raise ValueError(f"data_range: expected a finite number > 0, got {data_range!r}")
    if min(x.shape[-3:-1]) < min_size:
        raise ValueError(f"x: images of {x.shape[-3]}x{x.shape[-2]} are smaller than the "
                         f"{min_size}x{min_size} window")
    dtype = jnp.promote_types(jnp.result_type(x, ref), jnp.float32)
    x = jnp.broadcast_to(jnp.clip(x.astype(dtype), 0.0, data_range), shape)
    return x, jnp.broadcast_to(ref.astype(dtype), shape)


def psnr(x, ref, *, data_range: float = 1.0):
    """Peak signal-to-noise ratio in dB of ``x`` against ``ref``, one value per image.

    Identical images give ``10 log10(data_range^2 / 1e-12)`` rather than infinity.

    Args:
      x: ``[..., H, W, C]`` images, clipped to ``[0, data_range]``.
      ref: reference images of the same ``(H, W, C)``; leading axes broadcast against ``x``'s.
      data_range: peak value, a finite number ``> 0``.

    Returns:
      The PSNR, ``[...]``.

    Raises:
      ValueError: on mismatched shapes or a bad ``data_range``.
    """
    x, ref = _check(x, ref, data_range)
    mse = jnp.mean((x - ref) ** 2, axis=(-3, -2, -1))
    return 10.0 * jnp.log10(data_range ** 2 / jnp.maximum(mse, 1e-12))


def _gaussian_window(size: int, sigma: float) -> jax.Array:
    g = np.exp(-0.5 * ((np.arange(size) - (size - 1) / 2) / sigma) ** 2)
    g = g / g.sum()
    return jnp.asarray(np.outer(g, g), jnp.float32)


def ssim(x, ref, *, data_range: float = 1.0, window: int = 11, sigma: float = 1.5):
    """Mean structural similarity of ``x`` against ``ref``, one value per image.

    Wang et al. 2004, eq. 13 and 17 (module docstring); in ``[-1, 1]`` and 1 exactly when
    ``x == ref``.

    Args:
      x: ``[..., H, W, C]`` images, clipped to ``[0, data_range]``.
      ref: reference images of the same ``(H, W, C)``; leading axes broadcast against ``x``'s.
      data_range: peak value, a finite number ``> 0``.
      window: side of the Gaussian window, odd, at most the image side.
      sigma: width of the Gaussian window, a finite number ``> 0``.

    Returns:
      The mean SSIM, ``[...]``.

    Raises:
      ValueError: on mismatched shapes, a bad ``data_range``, ``window`` or ``sigma``.

    References:
      Wang, Bovik, Sheikh, Simoncelli, Image quality assessment: from error visibility to
      structural similarity, IEEE TIP 2004.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1 or window % 2 == 0:
        raise ValueError(f"window: expected an odd positive int, got {window!r}")
    if not (isinstance(sigma, int | float) and np.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma: expected a finite number > 0, got {sigma!r}")
    x, ref = _check(x, ref, data_range, min_size=window)
    kernel = _gaussian_window(window, sigma).astype(x.dtype)

    def local_mean(a):  # [..., H, W, C] -> [..., H - w + 1, W - w + 1, C], valid positions
        h, w, c = a.shape[-3:]
        planes = jnp.moveaxis(a, -1, -3).reshape(-1, h, w)
        out = jax.vmap(lambda p: jax.scipy.signal.convolve2d(p, kernel, mode="valid"))(planes)
        return jnp.moveaxis(out.reshape(*a.shape[:-3], c, *out.shape[-2:]), -3, -1)

    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mx, my = local_mean(x), local_mean(ref)
    vxx = local_mean(x * x) - mx ** 2
    vyy = local_mean(ref * ref) - my ** 2
    vxy = local_mean(x * ref) - mx * my
    s = ((2 * mx * my + c1) * (2 * vxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (vxx + vyy + c2))
    return jnp.mean(s, axis=(-3, -2, -1))
