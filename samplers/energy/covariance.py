"""Diagonal covariances in the pixel or the Fourier basis, and random anisotropic ones.

A linear inverse problem whose operator is diagonal in a basis becomes anisotropic denoising in
that basis (arXiv 2605.15487, sec. 3): ``y = x + Sigma^{1/2} eps`` with

* ``basis="pixel"``: ``Sigma = diag(s)``, ``s`` one variance per entry of the image (inpainting);
* ``basis="fourier"``: ``Sigma = F^* diag(s) F`` with ``F`` the orthonormal 2-D DFT over the two
  spatial axes of an image ``[..., H, W, C]`` (blur, deblurring): ``s[k]`` is the variance of the
  Fourier coefficient ``k``. For ``Sigma`` to map real images to real images, ``s`` must be
  Hermitian-symmetric (``s[k] = s[-k]``); every spectrum built here is.

:class:`Covariance` holds the variances ``diag`` (same shape as the image, a leading batch axis
allowed) and the static ``basis``. ``cov.apply(v, power)`` is ``Sigma^power v``; ``to_basis`` /
``from_basis`` are the coordinates in which ``Sigma`` is diagonal (``F v`` is complex for the
Fourier basis). :func:`random_covariance` draws the training covariances of both types.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

__all__ = ["BASES", "Covariance", "check_covariance", "random_covariance", "radial_frequency2"]

BASES = ("pixel", "fourier")
_AXES = (-3, -2)  # spatial axes of [..., H, W, C]


@dataclasses.dataclass(frozen=True)
class Covariance:
    """``Sigma``, diagonal in ``basis``, with variances ``diag`` (positive, shape of the image).

    A pytree: ``diag`` is a leaf, ``basis`` static. ``basis="fourier"`` needs images
    ``[..., H, W, C]`` (at least 3 axes).

    Attributes:
      diag: the variances in the basis, the images' shape (a leading batch axis allowed).
      basis: ``"pixel"`` or ``"fourier"``.
    """

    diag: jax.Array
    basis: str = "pixel"

    def to_basis(self, v):
        """Coordinates of ``v`` in the basis that diagonalises ``Sigma``.

        Args:
          v: an image batch of ``diag``'s shape.

        Returns:
          ``F v`` (complex for the Fourier basis).
        """
        if self.basis == "pixel":
            return v
        return jnp.fft.fft2(v, axes=_AXES, norm="ortho")

    def from_basis(self, c):
        """The inverse of :meth:`to_basis`.

        Args:
          c: coordinates in the basis.

        Returns:
          ``F^* c`` (its real part for the Fourier basis).
        """
        if self.basis == "pixel":
            return c
        return jnp.real(jnp.fft.ifft2(c, axes=_AXES, norm="ortho"))

    def apply_diag(self, v, d):
        """Any operator diagonal in the basis applied to ``v``.

        Args:
          v: an image batch of ``diag``'s shape.
          d: the diagonal, ``diag``'s shape (or broadcastable to it).

        Returns:
          ``F^* diag(d) F v`` (``d * v`` in the pixel basis).
        """
        if self.basis == "pixel":
            return d * v
        return self.from_basis(d * self.to_basis(v))

    def apply(self, v, power: float = 1.0):
        """``Sigma^power v``.

        Args:
          v: an image batch of ``diag``'s shape.
          power: the power of ``Sigma`` (``0.5``: its square root, ``-1``: its inverse).

        Returns:
          ``Sigma^power v``, ``v``'s shape.
        """
        return self.apply_diag(v, self.diag if power == 1.0 else self.diag ** power)

    def quad(self, v, d):
        """The quadratic form of a diagonal operator, per sample.

        Args:
          v: a batch ``[B, ...]``.
          d: the diagonal, ``v``'s shape (or broadcastable to it).

        Returns:
          ``<v, F^* diag(d) F v> = sum_k d_k |(F v)_k|^2`` ``[B]``.
        """
        c = self.to_basis(v)
        return jnp.sum(d * jnp.abs(c) ** 2, axis=tuple(range(1, v.ndim)))

    def symmetrize(self, d):
        """The projection of a per-coefficient array onto the spectra ``Sigma`` may have.

        A gradient with respect to ``diag`` (e.g. ``dU / d diag(Sigma)`` of a network that reads
        the spectrum) need not be Hermitian-symmetric in the Fourier basis; a covariance
        updated along it would stop mapping real images to real images. The projection averages
        each coefficient with its mirror, ``(d[k] + d[-k]) / 2`` over the two spatial axes
        (the identity in the pixel basis).

        Args:
          d: an array of ``diag``'s shape.

        Returns:
          ``d``'s Hermitian-symmetric part, ``d``'s shape.
        """
        if self.basis == "pixel":
            return d
        mirror = jnp.roll(jnp.flip(d, axis=_AXES), 1, axis=_AXES)  # index k -> -k mod (H, W)
        return 0.5 * (d + mirror)

    def replace(self, diag):
        """The covariance with variances ``diag`` in the same basis.

        Args:
          diag: the new variances.

        Returns:
          A :class:`Covariance`.
        """
        return Covariance(diag, self.basis)


jax.tree_util.register_dataclass(Covariance, data_fields=["diag"], meta_fields=["basis"])


def check_covariance(cov, shape, name: str = "cov") -> None:
    """Check that ``cov`` is a covariance of images of ``shape``.

    Concrete variances must be positive and finite (checked only outside tracing).

    Args:
      cov: the value to check.
      shape: the images' shape ``[B, ...]``.
      name: the argument's name in the errors.

    Raises:
      TypeError: ``cov`` is not a :class:`Covariance`.
      ValueError: a wrong basis or shape, or non-positive or non-finite variances.
    """
    if not isinstance(cov, Covariance):
        raise TypeError(f"{name}: expected a Covariance, got {type(cov).__name__}")
    if cov.basis not in BASES:
        raise ValueError(f"{name}.basis: expected one of {BASES}, got {cov.basis!r}")
    if tuple(cov.diag.shape) != tuple(shape):
        raise ValueError(f"{name}.diag: expected shape {tuple(shape)} (the images'), "
                         f"got {tuple(cov.diag.shape)}")
    if cov.basis == "fourier" and len(shape) < 3:
        raise ValueError(f"{name}: basis='fourier' needs images [..., H, W, C], got shape "
                         f"{tuple(shape)}")
    d = jnp.asarray(cov.diag)
    try:
        bad = not bool(jnp.all(jnp.isfinite(d) & (d > 0)))
    except jax.errors.ConcretizationTypeError:  # traced: checked where it is concrete
        bad = False
    if bad:
        raise ValueError(f"{name}.diag: expected positive, finite variances, got min "
                         f"{float(jnp.min(d)):.3g}")


def radial_frequency2(height: int, width: int) -> jax.Array:
    """The squared frequency of the 2-D DFT grid.

    Args:
      height: ``H``.
      width: ``W``.

    Returns:
      ``|f|^2`` ``[H, W]`` in cycles per pixel (Hermitian-symmetric).
    """
    fy = jnp.fft.fftfreq(height)
    fx = jnp.fft.fftfreq(width)
    return fy[:, None] ** 2 + fx[None, :] ** 2


def _log_uniform(key, shape, lo, hi):
    return jnp.exp(jax.random.uniform(key, shape, minval=jnp.log(lo), maxval=jnp.log(hi)))


def random_covariance(key, shape, *, sigma_min: float = 1e-3, sigma_max: float = 20.0,
                      basis: str = "mixed", isotropic_prob: float = 0.2) -> Covariance:
    """Random anisotropic training covariances for a batch of images ``shape = [B, ...]``.

    Two noise levels ``sigma_lo <= sigma_hi`` are drawn log-uniformly in
    ``[sigma_min, sigma_max]`` per sample (arXiv 2605.15487: log-uniform noise levels, random
    anisotropic covariances), and with probability ``isotropic_prob`` the covariance is
    ``sigma_hi^2 I``. Otherwise:

    * pixel type: variance ``sigma_hi^2`` inside a random mask and ``sigma_lo^2`` outside; the
      mask is a random box (side 1/8 to 7/8 of the image) or, half the time, i.i.d. pixels kept
      with a random rate. For vectors ``[B, d]`` each entry gets its own log-uniform level.
      These cover inpainting (missing pixels: large variance; observed: the noise level).
    * Fourier type: ``s(f) = min(sigma_lo^2 exp(c |f|^2), sigma_hi^2)`` with ``c`` uniform in
      ``[0, 4 pi^2 w^2]`` for blur widths ``w`` up to ``H / 8`` px: the shape of
      ``sigma_n^2 / |h(f)|^2`` for a Gaussian blur ``h``, capped (deblurring).

    A mixed batch must be a single basis for :class:`Covariance`, so ``basis="mixed"`` draws
    the type once per call from ``key`` (one batch, one type; a concrete key only, so not under
    ``jit``: training draws the type outside its compiled step instead).

    Args:
      key: a PRNG key.
      shape: ``[B, ...]``, vectors ``[B, d]`` or images ``[B, H, W, C]``.
      sigma_min: the smallest noise level, > 0.
      sigma_max: the largest noise level, > ``sigma_min``.
      basis: ``"pixel"``, ``"fourier"`` (all samples of one type) or ``"mixed"``.
      isotropic_prob: the probability of ``sigma_hi^2 I`` per sample.

    Returns:
      A :class:`Covariance` of ``shape`` (float32).

    References:
      arXiv 2605.15487 (the training covariances).
    """
    if basis not in (*BASES, "mixed"):
        raise ValueError(f"basis: expected 'pixel', 'fourier' or 'mixed', got {basis!r}")
    if not 0 < sigma_min < sigma_max:
        raise ValueError(f"sigma_min, sigma_max: expected 0 < min < max, got {sigma_min}, "
                         f"{sigma_max}")
    shape = tuple(shape)
    kb, k1, k2, k3, k4, k5, k6 = jax.random.split(key, 7)
    if basis == "mixed":
        if len(shape) < 4:
            basis = "pixel"
        else:
            basis = "fourier" if bool(jax.random.bernoulli(kb)) else "pixel"
    b = shape[0]
    bshape = (b,) + (1,) * (len(shape) - 1)
    s1 = _log_uniform(k1, bshape, sigma_min, sigma_max)
    s2 = _log_uniform(k2, bshape, sigma_min, sigma_max)
    lo, hi = jnp.minimum(s1, s2) ** 2, jnp.maximum(s1, s2) ** 2
    iso = jax.random.bernoulli(k3, isotropic_prob, bshape)
    if len(shape) == 2:  # vectors: independent per-entry levels
        d = _log_uniform(k4, shape, sigma_min, sigma_max) ** 2
        return Covariance(jnp.where(iso, hi, d).astype(jnp.float32), "pixel")
    h, w = shape[1], shape[2]
    if basis == "pixel":
        # random box
        side = jax.random.uniform(k4, (b, 2), minval=0.125, maxval=0.875) * jnp.array([h, w])
        corner = jax.random.uniform(k5, (b, 2)) * (jnp.array([h, w]) - side)
        yy = jnp.arange(h)[None, :, None]
        xx = jnp.arange(w)[None, None, :]
        box = ((yy >= corner[:, 0, None, None]) & (yy < (corner[:, 0] + side[:, 0])[:, None, None])
               & (xx >= corner[:, 1, None, None])
               & (xx < (corner[:, 1] + side[:, 1])[:, None, None]))
        ka, kr, kp = jax.random.split(k6, 3)
        rate = jax.random.uniform(kr, (b, 1, 1), minval=0.1, maxval=0.9)
        pix = jax.random.bernoulli(kp, rate, (b, h, w))
        use_box = jax.random.bernoulli(ka, 0.5, (b, 1, 1))
        mask = jnp.where(use_box, box, pix)
        mask = jnp.broadcast_to(mask[..., None], shape)
        d = jnp.where(mask, hi, lo)
    else:
        f2 = radial_frequency2(h, w)[None, :, :, None]
        width = jax.random.uniform(k4, bshape, maxval=h / 8.0)
        c = 4.0 * jnp.pi ** 2 * width ** 2
        d = jnp.minimum(lo * jnp.exp(jnp.minimum(c * f2, 80.0)), hi)
        d = jnp.broadcast_to(d, shape)
    return Covariance(jnp.where(iso, hi, d).astype(jnp.float32), basis)
