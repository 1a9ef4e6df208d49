"""Image quality: PSNR and SSIM of reconstructions against the truth, and the Fréchet distance
between two sets of image features.

PSNR and SSIM take images channels-last ``[..., H, W, C]`` (NHWC, as
``jaxlib_ext.core.images`` loads them) with values in ``[0, data_range]``; the reconstruction
``x`` is clipped to that range first, the leading axes of ``ref`` broadcast against those of
``x`` (one truth for several samples: ``ref[:, None]``), and one number per image comes back
(``[...]``). Both are pure ``jax.numpy`` and jit-able.

* :func:`psnr`: ``10 log10(data_range^2 / MSE)``, the mean over pixels and channels.
* :func:`ssim`: Wang, Bovik, Sheikh and Simoncelli, "Image quality assessment: from error
  visibility to structural similarity", IEEE TIP 13(4), 2004, eq. (13): local means, variances
  and covariance under an 11x11 Gaussian window (sigma 1.5) over the *valid* window positions
  only (no padding), constants ``C1 = (0.01 L)^2``, ``C2 = (0.03 L)^2``, averaged over window
  positions and channels (the mean SSIM of the paper's eq. (17)). This is the reference
  definition that ``skimage.metrics.structural_similarity(..., gaussian_weights=True,
  sigma=1.5, use_sample_covariance=False)`` follows, except that skimage crops its padded
  border instead of never padding.

The Fréchet distance is distributional: it compares two *sets* of images through features of
them (``[N, F]`` rows, e.g. the penultimate layer of a classifier:
:func:`jaxlib_ext.models.digit_classifier.features`), not one image against its truth.

* :func:`frechet_distance`: the Fréchet (2-Wasserstein) distance between the Gaussians fitted to
  two feature sets (the FID of Heusel, Ramsauer, Unterthiner, Nessler and Hochreiter, "GANs
  trained by a two time-scale update rule converge to a local Nash equilibrium", arXiv
  1706.08500, on whatever features are given),
  ``||mu_a - mu_b||^2 + tr(C_a + C_b - 2 (C_a^{1/2} C_b C_a^{1/2})^{1/2})``. The symmetric
  square roots come from symmetric eigendecompositions (``eigh``) with the small negative
  eigenvalues that rounding leaves on positive semi-definite matrices clipped to 0,
  ``C^{1/2} = V diag(sqrt(max(w, 0))) V^T``. Since ``C_a^{1/2} C_b C_a^{1/2} = P P^T`` with
  ``P = C_a^{1/2} C_b^{1/2}``, the last trace is the sum of the singular values of ``P`` (its
  nuclear norm), which is taken from an SVD of ``P`` rather than as square roots of the
  eigenvalues of ``P P^T``: those square roots turn the rounding error ``eps ||P||^2`` of
  every near-zero eigenvalue into ``sqrt(eps) ||P||``, which over the many near-null directions
  of rank-deficient feature covariances (ReLU units that never fire) dominates a float32
  result. The result is clipped to ``>= 0``. It works in the inputs' floating
  dtype, at least float32 (float64 inputs with ``jax_enable_x64`` stay float64), with matrix
  products at full precision. :func:`gaussian_statistics` gives the fitted mean and unbiased
  covariance, and :func:`frechet_distance_from_statistics` the distance from them (for a
  reference set's statistics computed once).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "frechet_distance",
    "frechet_distance_from_statistics",
    "gaussian_statistics",
    "psnr",
    "ssim",
]


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


# --------------------------------------------------------------------------- Fréchet distance


def _float_dtype(*arrays) -> jnp.dtype:
    return jnp.promote_types(jnp.result_type(*arrays), jnp.float32)


def _check_features(features, name: str) -> jax.Array:
    features = jnp.asarray(features)
    if features.ndim != 2:
        raise ValueError(f"{name}: expected features [N, F], got shape {features.shape}")
    if features.shape[0] < 2:
        raise ValueError(f"{name}: expected at least 2 rows to fit a covariance, got "
                         f"{features.shape[0]}")
    if features.shape[1] < 1:
        raise ValueError(f"{name}: expected at least 1 feature column, got shape "
                         f"{features.shape}")
    return features


def _dot(a, b):
    return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)


def gaussian_statistics(features) -> tuple[jax.Array, jax.Array]:
    """Mean and unbiased covariance of feature rows, the Gaussian fitted to them.

    Args:
      features: ``[N, F]``, one row per sample, ``N >= 2``.

    Returns:
      ``(mean [F], cov [F, F])``, ``cov = (f - mean)^T (f - mean) / (N - 1)``, in the inputs'
      floating dtype (at least float32).

    Raises:
      ValueError: if ``features`` is not ``[N, F]`` with ``N >= 2``.
    """
    f = _check_features(features, "features")
    f = f.astype(_float_dtype(f))
    mean = jnp.mean(f, axis=0)
    d = f - mean
    return mean, _dot(d.T, d) / (f.shape[0] - 1)


def _check_statistics(mean, cov, name: str) -> tuple[jax.Array, jax.Array]:
    mean, cov = jnp.asarray(mean), jnp.asarray(cov)
    if mean.ndim != 1 or mean.shape[0] < 1:
        raise ValueError(f"mean_{name}: expected a mean [F], got shape {mean.shape}")
    f = mean.shape[0]
    if cov.shape != (f, f):
        raise ValueError(f"cov_{name}: expected a covariance [{f}, {f}] (mean_{name} has "
                         f"{f} features), got shape {cov.shape}")
    return mean, cov


def _sqrt_psd(c: jax.Array) -> jax.Array:
    """The symmetric square root of a symmetric positive semi-definite matrix (eigenvalues
    below 0, from rounding, clipped)."""
    w, v = jnp.linalg.eigh(0.5 * (c + c.T))
    return _dot(v * jnp.sqrt(jnp.maximum(w, 0.0)), v.T)


def frechet_distance_from_statistics(mean_a, cov_a, mean_b, cov_b) -> jax.Array:
    """The Fréchet distance between ``N(mean_a, cov_a)`` and ``N(mean_b, cov_b)``.

    ``||mean_a - mean_b||^2 + tr(cov_a + cov_b - 2 (cov_a^{1/2} cov_b cov_a^{1/2})^{1/2})``,
    computed as the module docstring says (symmetric square roots by ``eigh``, the last trace
    as the nuclear norm of ``cov_a^{1/2} cov_b^{1/2}``); jit-able.

    Args:
      mean_a: ``[F]``, the first Gaussian's mean.
      cov_a: ``[F, F]``, its covariance (symmetric positive semi-definite).
      mean_b: ``[F]``, the second Gaussian's mean.
      cov_b: ``[F, F]``, its covariance.

    Returns:
      The distance, a scalar ``>= 0`` in the inputs' floating dtype (at least float32).

    Raises:
      ValueError: if a mean is not ``[F]``, a covariance not ``[F, F]``, or the two ``F``
        differ.
    """
    mean_a, cov_a = _check_statistics(mean_a, cov_a, "a")
    mean_b, cov_b = _check_statistics(mean_b, cov_b, "b")
    if mean_b.shape != mean_a.shape:
        raise ValueError(f"mean_b: expected {mean_a.shape[0]} features as mean_a, got "
                         f"{mean_b.shape[0]}")
    dtype = _float_dtype(mean_a, cov_a, mean_b, cov_b)
    mean_a, cov_a, mean_b, cov_b = (x.astype(dtype) for x in (mean_a, cov_a, mean_b, cov_b))
    # tr((C_a^1/2 C_b C_a^1/2)^1/2) = ||C_a^1/2 C_b^1/2||_*, the sum of singular values
    cross = jnp.sum(jnp.linalg.svd(_dot(_sqrt_psd(cov_a), _sqrt_psd(cov_b)), compute_uv=False))
    diff = mean_a - mean_b
    d = jnp.sum(diff * diff) + jnp.trace(cov_a) + jnp.trace(cov_b) - 2.0 * cross
    return jnp.maximum(d, 0.0)


def frechet_distance(features_a, features_b) -> jax.Array:
    """The Fréchet distance between the Gaussians fitted to two feature sets.

    Each set's mean and unbiased covariance (:func:`gaussian_statistics`) define a Gaussian;
    the result is :func:`frechet_distance_from_statistics` of the two: 0 for identical sets,
    symmetric in its arguments, and a shift ``s`` of every row of one set adds ``||s||^2``.
    With the penultimate features of an image classifier this is the FID of Heusel et al.
    (arXiv 1706.08500). jit-able.

    Args:
      features_a: ``[N, F]`` features of the first set, ``N >= 2``.
      features_b: ``[M, F]`` features of the second set, ``M >= 2``, the same ``F``.

    Returns:
      The distance, a scalar ``>= 0`` in the inputs' floating dtype (at least float32).

    Raises:
      ValueError: if a set is not ``[rows, F]`` with at least 2 rows, or the two ``F`` differ.

    References:
      Heusel, Ramsauer, Unterthiner, Nessler, Hochreiter, GANs Trained by a Two Time-Scale
      Update Rule Converge to a Local Nash Equilibrium, arXiv 1706.08500.

      Dowson, Landau, The Fréchet distance between multivariate normal distributions, Journal
      of Multivariate Analysis 12(3), 1982.
    """
    a = _check_features(features_a, "features_a")
    b = _check_features(features_b, "features_b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"features_b: expected {a.shape[1]} features per row as features_a, "
                         f"got shape {b.shape}")
    dtype = _float_dtype(a, b)
    mean_a, cov_a = gaussian_statistics(a.astype(dtype))
    mean_b, cov_b = gaussian_statistics(b.astype(dtype))
    return frechet_distance_from_statistics(mean_a, cov_a, mean_b, cov_b)
