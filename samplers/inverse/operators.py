"""Linear operators ``y = A x + noise`` for inverse problems, with adjoints: the image
degradations and operators given by their two maps.

Images are channels-last, ``x [..., H, W, C]`` with any leading batch axes; every degradation
acts on the last three axes, the same way on each channel, and works under
``jit``/``vmap``/``grad``. An operator is a :class:`LinearOperator`, a frozen pytree (its array
is a leaf, everything else static), so it can be passed straight into jitted functions.

Operators that are diagonal in a known orthonormal basis say so, for samplers that build
anisotropic covariances from them (arXiv 2605.15487, Sec. 3: pixel-diagonal covariances for
inpainting, Fourier-diagonal ones for deblurring):

* ``basis="pixel"``: ``A x = d * x`` with ``d = op.diagonal`` of shape ``[H, W, C]`` (inpainting;
  the output keeps the input's shape, missing pixels set to 0).
* ``basis="fourier"``: ``A x = F^H (d * F x)`` where ``F = fourier_transform`` is the orthonormal
  2-D DFT over ``(H, W)`` and ``d = op.diagonal`` is the complex transfer function ``[H, W]``
  (circular convolution: periodic boundary). The adjoint multiplies by ``conj(d)``.
* ``basis="none"``: no diagonal (``diagonal`` is ``None``): downsampling by ``f x f`` block
  averaging, ``[H, W, C] -> [H/f, W/f, C]``, whose adjoint spreads each value over its block
  divided by ``f^2`` (so ``A A^T = I / f^2``); or an operator given by its maps ``x -> A x``
  and ``y -> A^T y`` (:func:`linear_operator`: a dense matrix, a decoder's measurement, any
  shapes), which the latent solvers of :mod:`jaxlib_ext.samplers.mclc` apply to one
  unbatched array at a time.

``op.gram_diagonal()`` is the diagonal of ``A^T A`` in the operator's basis (``d^2`` or ``|d|^2``).
Constructors: :func:`inpainting` (any mask), :func:`box_inpainting`, :func:`random_inpainting`,
:func:`gaussian_blur`, :func:`motion_blur`, :func:`downsampling`, :func:`linear_operator` and
:func:`as_linear_operator`; noise: :func:`measure`; the dot-product test of an adjoint:
:func:`check_adjoint`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "BASES",
    "LinearOperator",
    "as_linear_operator",
    "box_inpainting",
    "check_adjoint",
    "downsampling",
    "fourier_transform",
    "gaussian_blur",
    "inpainting",
    "inverse_fourier_transform",
    "linear_operator",
    "measure",
    "motion_blur",
    "random_inpainting",
]

BASES = ("pixel", "fourier", "none")


def fourier_transform(x: jax.Array) -> jax.Array:
    """Orthonormal 2-D DFT of ``x [..., H, W, C]`` over ``(H, W)`` (complex, same shape).

    Args:
      x: ``[..., H, W, C]`` images.

    Returns:
      The complex ``[..., H, W, C]`` transform.
    """
    return jnp.fft.fft2(x, axes=(-3, -2), norm="ortho")


def inverse_fourier_transform(u: jax.Array) -> jax.Array:
    """Inverse of :func:`fourier_transform` (complex; take ``.real`` for a real image).

    Args:
      u: ``[..., H, W, C]`` spectra.

    Returns:
      The complex ``[..., H, W, C]`` inverse transform.
    """
    return jnp.fft.ifft2(u, axes=(-3, -2), norm="ortho")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LinearOperator:
    """A linear map ``[..., *shape_in] -> [..., *shape_out]`` with its adjoint.

    Attributes:
      diagonal: the operator's diagonal in ``basis``: ``[H, W, C]`` real for ``"pixel"``,
        ``[H, W]`` complex (the DFT of the convolution kernel) for ``"fourier"``, ``None`` for
        ``"none"``. The only pytree leaf.
      shape_in: the trailing shape of the inputs (``(H, W, C)`` of the images a degradation
        takes), or ``None``: not checked.
      shape_out: the trailing shape of the outputs (``(H', W', C)`` of a degradation's
        measurements), or ``None``: not checked.
      basis: ``"pixel"``, ``"fourier"`` or ``"none"`` (see the module docstring).
      name: what the operator is (``"box_inpainting"``, ``"gaussian_blur"``, ...).
      factor: the block size of downsampling (1 otherwise).
      forward_fn: ``x -> A x`` of an operator given by its maps (:func:`linear_operator`),
        ``None`` otherwise.
      adjoint_fn: ``y -> A^T y`` of such an operator, ``None`` otherwise.
    """

    diagonal: jax.Array | None
    shape_in: tuple[int, ...] | None = dataclasses.field(metadata={"static": True})
    shape_out: tuple[int, ...] | None = dataclasses.field(metadata={"static": True})
    basis: str = dataclasses.field(metadata={"static": True})
    name: str = dataclasses.field(metadata={"static": True})
    factor: int = dataclasses.field(default=1, metadata={"static": True})
    forward_fn: Callable | None = dataclasses.field(default=None, metadata={"static": True})
    adjoint_fn: Callable | None = dataclasses.field(default=None, metadata={"static": True})

    def _check(self, x, shape: tuple[int, ...] | None, arg: str):
        if shape is None:
            return x
        x = jnp.asarray(x)
        n = len(shape)
        if x.ndim < n or tuple(x.shape[x.ndim - n:]) != tuple(shape):
            raise ValueError(
                f"{arg}: expected shape [..., {', '.join(map(str, shape))}] for {self.name}, "
                f"got {tuple(x.shape)}"
            )
        return x

    def apply(self, x: jax.Array) -> jax.Array:
        """``A x`` for ``x [..., *shape_in]``; returns ``[..., *shape_out]``."""
        x = self._check(x, self.shape_in, "x")
        if self.forward_fn is not None:
            return self.forward_fn(x)
        if self.basis == "pixel":
            return self.diagonal * x
        if self.basis == "fourier":
            return _fourier_multiply(x, self.diagonal)
        f = self.factor
        *lead, h, w, c = x.shape
        return x.reshape(*lead, h // f, f, w // f, f, c).mean(axis=(-4, -2))

    def adjoint(self, y: jax.Array) -> jax.Array:
        """``A^T y`` for ``y [..., *shape_out]``; returns ``[..., *shape_in]``."""
        y = self._check(y, self.shape_out, "y")
        if self.adjoint_fn is not None:
            return self.adjoint_fn(y)
        if self.basis == "pixel":
            return self.diagonal * y
        if self.basis == "fourier":
            return _fourier_multiply(y, jnp.conj(self.diagonal))
        f = self.factor
        up = jnp.repeat(jnp.repeat(y, f, axis=-3), f, axis=-2)
        return up / (f * f)

    __call__ = apply

    def gram_diagonal(self) -> jax.Array | None:
        """Diagonal of ``A^T A`` in ``basis`` (``[H, W, C]`` or ``[H, W]``), ``None`` if none."""
        if self.basis == "pixel":
            return self.diagonal**2
        if self.basis == "fourier":
            return jnp.abs(self.diagonal) ** 2
        return None


def _fourier_multiply(x: jax.Array, transfer: jax.Array) -> jax.Array:
    u = fourier_transform(x)
    out = inverse_fourier_transform(u * transfer[..., None]).real
    return out.astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else out


# --------------------------------------------------------------------------- argument checks


def _image_shape(shape) -> tuple[int, int, int]:
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError as e:
        raise ValueError(f"shape: expected (H, W, C), got {shape!r}") from e
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"shape: expected (H, W, C) of positive ints, got {shape!r}")
    return shape


def _positive(value, arg: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{arg}: expected a positive number, got {value!r}") from e
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{arg}: expected a positive number, got {value!r}")
    return v


def _trailing_shape(shape, arg: str) -> tuple[int, ...] | None:
    if shape is None:
        return None
    try:
        out = tuple(int(s) for s in shape)
    except TypeError as e:
        raise ValueError(f"{arg}: expected a tuple of positive ints or None, got {shape!r}") from e
    if not out or min(out) < 1:
        raise ValueError(f"{arg}: expected a tuple of positive ints or None, got {shape!r}")
    return out


# --------------------------------------------------------------------------- operators by maps


def linear_operator(forward: Callable, adjoint: Callable, *, shape_in=None, shape_out=None,
                    name: str = "linear_operator") -> LinearOperator:
    """The :class:`LinearOperator` of the maps ``x -> A x`` and ``y -> A^T y``.

    Its ``basis`` is ``"none"`` (no known diagonal). ``apply`` and ``adjoint`` call the maps on
    the arrays as given, so they take what the maps take (one unbatched array, for the latent
    solvers); :func:`check_adjoint` tests that they are adjoint.

    Args:
      forward: ``x -> A x``.
      adjoint: ``y -> A^T y``.
      shape_in: the trailing shape ``apply`` checks its input against, or ``None``.
      shape_out: the trailing shape ``adjoint`` checks its input against, or ``None``.
      name: what the operator is.

    Returns:
      The :class:`LinearOperator`.

    Raises:
      TypeError: ``forward`` or ``adjoint`` is not callable.
      ValueError: a shape is not a tuple of positive ints.
    """
    for arg, fn in (("forward", forward), ("adjoint", adjoint)):
        if not callable(fn):
            raise TypeError(f"{arg}: expected a callable, got {type(fn).__name__}")
    return LinearOperator(None, _trailing_shape(shape_in, "shape_in"),
                          _trailing_shape(shape_out, "shape_out"), "none", str(name),
                          forward_fn=forward, adjoint_fn=adjoint)


def as_linear_operator(operator: Any) -> LinearOperator:
    """A :class:`LinearOperator` from one, from a ``(forward, adjoint)`` pair of callables, or
    from any object with callable ``forward`` (or ``apply``) and ``adjoint`` attributes.

    Args:
      operator: the operator in one of those forms.

    Returns:
      ``operator`` itself if it is a :class:`LinearOperator`, else the
      :func:`linear_operator` of its maps.

    Raises:
      TypeError: ``operator`` is none of those.
    """
    if isinstance(operator, LinearOperator):
        return operator
    if isinstance(operator, tuple) and len(operator) == 2 and all(map(callable, operator)):
        return linear_operator(*operator)
    fwd = getattr(operator, "forward", None) or getattr(operator, "apply", None)
    adj = getattr(operator, "adjoint", None)
    if callable(fwd) and callable(adj):
        return linear_operator(fwd, adj, name=type(operator).__name__)
    raise TypeError(
        "operator: expected a LinearOperator, a (forward, adjoint) pair of callables or an "
        f"object with forward and adjoint methods, got {type(operator).__name__}")


def check_adjoint(operator, x_shape, *, dtype=jnp.float32, rtol: float = 1e-4,
                  seed: int = 0) -> None:
    """Raise ``ValueError`` unless ``<A x, u> = <x, A^T u>`` on two random pairs ``(x, u)``.

    The mismatch is measured relative to ``||A x|| ||u|| + ||x|| ||A^T u||`` (float32 round-off
    is far below the default ``rtol``). Also checks that ``A^T`` maps back to ``x_shape``.
    Skipped (returns) when the operator's outputs are traced, e.g. built inside ``jit`` from
    traced arrays.

    Args:
      operator: anything :func:`as_linear_operator` accepts.
      x_shape: the shape of the forward map's input.
      dtype: the dtype of the random vectors.
      rtol: the relative tolerance of the dot-product test.
      seed: the NumPy seed of the random vectors.

    Raises:
      ValueError: the adjoint maps to another shape, or fails the dot-product test.
    """
    op = as_linear_operator(operator)
    x_shape = tuple(x_shape)
    y_struct = jax.eval_shape(op.apply, jax.ShapeDtypeStruct(x_shape, dtype))
    back = jax.eval_shape(op.adjoint, jax.ShapeDtypeStruct(y_struct.shape, dtype))
    if tuple(back.shape) != x_shape:
        raise ValueError(f"operator: adjoint maps measurements of shape {y_struct.shape} to "
                         f"shape {tuple(back.shape)}, expected the forward's input shape "
                         f"{x_shape}")
    rng = np.random.default_rng(seed)
    for _ in range(2):
        x = jnp.asarray(rng.standard_normal(x_shape), dtype)
        u = jnp.asarray(rng.standard_normal(y_struct.shape), dtype)
        ax, atu = op.apply(x), op.adjoint(u)
        if isinstance(ax, jax.core.Tracer) or isinstance(atu, jax.core.Tracer):
            return
        ax, atu = np.asarray(ax, np.float64), np.asarray(atu, np.float64)
        xn, un = np.asarray(x, np.float64), np.asarray(u, np.float64)
        lhs, rhs = float(np.sum(ax * un)), float(np.sum(xn * atu))
        scale = np.linalg.norm(ax) * np.linalg.norm(un) + np.linalg.norm(xn) * np.linalg.norm(atu)
        if not np.isfinite(lhs - rhs) or abs(lhs - rhs) > rtol * max(scale, 1e-30):
            raise ValueError(
                "operator: the adjoint is inconsistent with the forward map: "
                f"<A x, u> = {lhs:.6g} but <x, A^T u> = {rhs:.6g} on random x, u "
                f"(relative mismatch {abs(lhs - rhs) / max(scale, 1e-30):.3g} > {rtol:g})")


# --------------------------------------------------------------------------- inpainting


def inpainting(mask, shape=None, *, name: str = "inpainting") -> LinearOperator:
    """Pixel-diagonal operator ``A x = mask * x`` (1 = observed, 0 = missing).

    Args:
      mask: ``[H, W]`` (the same for every channel) or ``[H, W, C]``, any real or boolean values
        (a soft mask is allowed).
      shape: image shape ``(H, W, C)``; when given, it must agree with ``mask``; ``None``: taken
        from ``mask`` (``C = 1`` for a 2-D mask).
      name: the operator's name.

    Returns:
      The pixel-diagonal :class:`LinearOperator` on ``shape``.

    Raises:
      TypeError: if ``mask`` is neither real nor boolean.
      ValueError: if ``mask`` is not 2-D or 3-D or does not fit ``shape``.
    """
    m = jnp.asarray(mask)
    if not (jnp.issubdtype(m.dtype, jnp.floating) or jnp.issubdtype(m.dtype, jnp.integer)
            or m.dtype == jnp.bool_):
        raise TypeError(f"mask: expected a real or boolean array, got {m.dtype}")
    if m.ndim not in (2, 3):
        raise ValueError(f"mask: expected [H, W] or [H, W, C], got shape {tuple(m.shape)}")
    if shape is None:
        shape = (*m.shape[:2], m.shape[2] if m.ndim == 3 else 1)
    shape = _image_shape(shape)
    if tuple(m.shape[:2]) != shape[:2] or (m.ndim == 3 and m.shape[2] != shape[2]):
        raise ValueError(f"mask: shape {tuple(m.shape)} does not fit images of shape {shape}")
    m = m.astype(jnp.result_type(float))
    diag = jnp.broadcast_to(m[..., None] if m.ndim == 2 else m, shape)
    return LinearOperator(diag, shape, shape, "pixel", name)


def box_inpainting(shape, box_size, *, corner=None) -> LinearOperator:
    """Inpainting with a missing square box of side ``box_size`` pixels (or ``(bh, bw)``).

    Args:
      shape: image shape ``(H, W, C)``.
      box_size: side of the box, a positive int, or ``(bh, bw)``.
      corner: top-left pixel ``(row, col)`` of the box; ``None``: centred (offsets
        ``(H - bh) // 2``, ``(W - bw) // 2``). The box must fit inside the image.

    Returns:
      The inpainting :class:`LinearOperator`.

    Raises:
      ValueError: if ``box_size`` is not positive or the box leaves the image.
    """
    h, w, c = shape = _image_shape(shape)
    bh, bw = (box_size, box_size) if np.ndim(box_size) == 0 else tuple(box_size)
    for v in (bh, bw):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise ValueError(f"box_size: expected positive int(s), got {box_size!r}")
    if bh > h or bw > w:
        raise ValueError(f"box_size: {box_size!r} does not fit in an image of {h}x{w}")
    r, q = ((h - bh) // 2, (w - bw) // 2) if corner is None else tuple(int(v) for v in corner)
    if not (0 <= r <= h - bh and 0 <= q <= w - bw):
        raise ValueError(f"corner: box of {bh}x{bw} at {corner!r} leaves the {h}x{w} image")
    mask = np.ones((h, w), np.float32)
    mask[r : r + bh, q : q + bw] = 0.0
    return inpainting(mask, shape, name="box_inpainting")


def random_inpainting(key: jax.Array, shape, missing_fraction: float) -> LinearOperator:
    """Inpainting that drops each pixel (all its channels) at random.

    Args:
      key: PRNG key of the mask.
      shape: image shape ``(H, W, C)``.
      missing_fraction: probability that a pixel is dropped, in ``[0, 1)``.

    Returns:
      The inpainting :class:`LinearOperator`.

    Raises:
      ValueError: if ``missing_fraction`` is outside ``[0, 1)``.
    """
    shape = _image_shape(shape)
    p = float(missing_fraction)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"missing_fraction: expected a value in [0, 1), got {missing_fraction!r}")
    mask = jax.random.bernoulli(key, 1.0 - p, shape[:2])
    return inpainting(mask, shape, name="random_inpainting")


# --------------------------------------------------------------------------- blurs


def _blur_from_kernel(kernel: np.ndarray, shape, name: str) -> LinearOperator:
    """Circular convolution with ``kernel [H, W]`` whose origin is pixel (0, 0) (wrapped)."""
    transfer = jnp.fft.fft2(jnp.asarray(kernel))  # unnormalised DFT of the kernel
    return LinearOperator(transfer, shape, shape, "fourier", name)


def _wrapped_offsets(n: int) -> np.ndarray:
    """Signed periodic offset of each index from 0: 0, 1, ..., -2, -1."""
    i = np.arange(n)
    return np.where(i <= n // 2, i, i - n).astype(np.float64)


def gaussian_blur(shape, sigma: float, *, kernel_size: int | None = None) -> LinearOperator:
    """Blur with a normalised isotropic Gaussian kernel, periodic boundary.

    The kernel is ``exp(-(di^2 + dj^2) / (2 sigma^2))`` on the wrapped offsets ``|di|, |dj| <=
    kernel_size // 2``, capped by the image, then divided by its sum.

    Args:
      shape: image shape ``(H, W, C)``.
      sigma: width of the kernel in pixels, ``> 0``.
      kernel_size: odd positive int; ``None``: the smallest odd size covering ``3 sigma`` either
        side.

    Returns:
      The blur :class:`LinearOperator`.

    Raises:
      ValueError: if ``sigma`` is not positive or ``kernel_size`` is not a positive odd int.
    """
    h, w, c = shape = _image_shape(shape)
    sigma = _positive(sigma, "sigma")
    if kernel_size is None:
        kernel_size = 2 * math.ceil(3 * sigma) + 1
    if isinstance(kernel_size, bool) or not isinstance(kernel_size, int | np.integer) or (
        kernel_size < 1 or kernel_size % 2 == 0
    ):
        raise ValueError(f"kernel_size: expected a positive odd int, got {kernel_size!r}")
    di, dj = _wrapped_offsets(h)[:, None], _wrapped_offsets(w)[None, :]
    half = kernel_size // 2
    k = np.exp(-(di**2 + dj**2) / (2 * sigma**2)) * ((np.abs(di) <= half) & (np.abs(dj) <= half))
    return _blur_from_kernel(k / k.sum(), shape, "gaussian_blur")


def motion_blur(shape, length: float, angle: float = 0.0, *, samples: int = 64) -> LinearOperator:
    """Linear motion blur along a centred segment, periodic boundary.

    The average of the image shifted along the segment. The segment is sampled at ``samples``
    evenly spaced points whose sub-pixel positions are spread bilinearly onto the grid; the kernel
    is point-symmetric (its transfer function is real) and sums to 1.

    Args:
      shape: image shape ``(H, W, C)``.
      length: length of the segment in pixels, ``> 0``.
      angle: direction of the segment, radians from the horizontal.
      samples: points on the segment, an int ``>= 2``.

    Returns:
      The blur :class:`LinearOperator`.

    Raises:
      ValueError: if ``length`` is not positive or ``samples < 2``.
    """
    h, w, c = shape = _image_shape(shape)
    length = _positive(length, "length")
    if isinstance(samples, bool) or not isinstance(samples, int | np.integer) or samples < 2:
        raise ValueError(f"samples: expected an int >= 2, got {samples!r}")
    s = np.linspace(-length / 2, length / 2, samples)
    rows, cols = -s * np.sin(angle), s * np.cos(angle)
    k = np.zeros((h, w))
    r0, c0 = np.floor(rows), np.floor(cols)
    fr, fc = rows - r0, cols - c0
    for dr, dc, wt in ((0, 0, (1 - fr) * (1 - fc)), (1, 0, fr * (1 - fc)),
                       (0, 1, (1 - fr) * fc), (1, 1, fr * fc)):
        np.add.at(k, (((r0 + dr) % h).astype(int), ((c0 + dc) % w).astype(int)), wt)
    return _blur_from_kernel(k / k.sum(), shape, "motion_blur")


# --------------------------------------------------------------------------- downsampling


def downsampling(shape, factor: int) -> LinearOperator:
    """Average over non-overlapping ``factor x factor`` blocks: ``[H, W, C] -> [H/f, W/f, C]``.

    ``A A^T = I / factor^2``, so ``factor^2 A^T`` is a right inverse.

    Args:
      shape: image shape ``(H, W, C)``; ``H`` and ``W`` must be multiples of ``factor``.
      factor: the block side ``f``, a positive int.

    Returns:
      The downsampling :class:`LinearOperator`.

    Raises:
      ValueError: if ``factor`` is not a positive int or does not divide ``H`` and ``W``.
    """
    h, w, c = shape = _image_shape(shape)
    if isinstance(factor, bool) or not isinstance(factor, int | np.integer) or factor < 1:
        raise ValueError(f"factor: expected a positive int, got {factor!r}")
    if h % factor or w % factor:
        raise ValueError(f"factor: {factor} does not divide the image size {h}x{w}")
    out = (h // factor, w // factor, c)
    return LinearOperator(None, shape, out, "none", "downsampling", int(factor))


# --------------------------------------------------------------------------- measurement


def measure(key: jax.Array, op: LinearOperator, x: jax.Array, noise_std) -> jax.Array:
    """A noisy measurement ``y = A x + noise_std * n``, ``n ~ N(0, I)`` of ``y``'s shape.

    Args:
      key: PRNG key of the noise.
      op: the :class:`LinearOperator` ``A``.
      x: images ``[..., H, W, C]`` of the operator's input shape.
      noise_std: a non-negative scalar, or an array broadcasting against ``y`` (e.g.
        ``[B, 1, 1, 1]`` for one level per image).

    Returns:
      The measurement ``y``, of ``A x``'s shape and dtype.

    Raises:
      TypeError: if ``op`` is not a :class:`LinearOperator`.
      ValueError: if a known ``noise_std`` has negative values.
    """
    if not isinstance(op, LinearOperator):
        raise TypeError(f"op: expected a LinearOperator, got {type(op).__name__}")
    y = op.apply(x)
    std = jnp.asarray(noise_std, y.dtype)
    try:
        negative = bool(jnp.any(std < 0))
    except jax.errors.ConcretizationTypeError:  # traced: checked by the caller
        negative = False
    if negative:
        raise ValueError(f"noise_std: expected values >= 0, got {noise_std!r}")
    return y + std * jax.random.normal(key, y.shape, y.dtype)
