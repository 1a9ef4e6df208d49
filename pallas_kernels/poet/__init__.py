r"""POET-X linear layer (arXiv 2506.08001, 2603.05500) as a pure JAX op.

``poet_linear(x, w, theta_in, theta_out, perm_in, perm_out, *, block_size, method="auto",
memory_saving=False)`` computes ``x @ W_eff``, ``W_eff = R_in @ w @ R_out``, input-centrically:

.. math:: y = \mathrm{rot}_{out}(\mathrm{rot}_{in}(x)\, w), \qquad
          \mathrm{rot}(z) = \mathrm{unpermute}(\mathrm{BlockDiag}(G)(z[\ldots, \pi]))

with ``x`` ``[..., n]``, the stored base weight ``w`` ``[n, m]`` (``x @ w`` is the plain layer),
``theta_in`` ``[n / b, b (b - 1) / 2]``, ``theta_out`` ``[m / b, b (b - 1) / 2]`` and integer
permutations ``perm_in`` (length ``n``) and ``perm_out`` (length ``m``). Each row of a theta is the
row-major strict upper triangle of a block's skew matrix (``Q[triu_indices(b, 1)] = row;
Q = Q - Q^T``) and the block is ``G = I + 2Q + 2Q^2 + 2Q^3 + Q^4``, acting on row vectors
(``z_k @ G_k``): with identity permutations, ``theta_out = 0`` and ``w = I``, ``W_eff`` is the
block-diagonal matrix of the ``G`` blocks of ``theta_in`` (not their transposes). ``theta = 0``
gives ``x @ w`` exactly for any permutations. Details in
:mod:`jaxlib_ext.pallas_kernels.poet.reference`.

Paths (``method``, one of :data:`METHODS`: the library's vocabulary, every one offered):

- ``"reference"``: builds ``W_eff`` densely (the naive POET path; for tests);
- ``"xla"``: input-centric, :func:`~jaxlib_ext.pallas_kernels.poet.xla.poet_linear_xla`;
- ``"pallas"``: input-centric with the block products on the Pallas kernels
  (:mod:`jaxlib_ext.pallas_kernels.poet.pallas`, interpreted off GPU);
- ``"auto"``: ``_common.resolve_auto``: the Pallas kernels on a GPU backend where the compiled
  kernels take the operands (``block_size`` a multiple of 16, no float64), otherwise ``"xla"``.

``memory_saving=True`` (``"xla"`` and ``"pallas"``) is the ``POET-X_mem`` variant: a
``custom_vjp`` that keeps only the layer input for the backward pass, recomputes the rotations
there and gives the base weight a zero gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlib_ext.pallas_kernels._common import (
    METHODS,
    check_method,
    lazy_attributes,
    resolve_auto,
)
from jaxlib_ext.pallas_kernels.poet.reference import (
    cayley_neumann,
    effective_weight,
    inverse_permutation,
    num_block_params,
    poet_linear_reference,
    rotation_matrix,
    skew,
)
from jaxlib_ext.pallas_kernels.poet.xla import poet_linear_memory, poet_linear_xla, rotate

__all__ = [
    "METHODS",
    "PoetKernelConfig",
    "cayley_neumann",
    "effective_weight",
    "inverse_permutation",
    "num_block_params",
    "poet_linear",
    "poet_linear_memory",
    "poet_linear_reference",
    "poet_linear_xla",
    "rotate",
    "rotation_matrix",
    "skew",
]

# The Pallas entry point, (module, name): what ``"auto"`` picks on a GPU when it imports.
_KERNEL = ("jaxlib_ext.pallas_kernels.poet.pallas", "block_rotate_pallas")


__getattr__ = lazy_attributes(__name__, {
    "PoetKernelConfig": "jaxlib_ext.pallas_kernels.poet.config",
})


def _check(x, w, theta_in, theta_out, perm_in, perm_out, block_size):
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2:
        raise ValueError(f"block_size must be an int >= 2, got {block_size!r}")
    for name, a in (("x", x), ("w", w), ("theta_in", theta_in), ("theta_out", theta_out)):
        if not hasattr(a, "shape") or not jnp.issubdtype(a.dtype, jnp.floating):
            raise TypeError(f"{name} must be a floating array, got {getattr(a, 'dtype', type(a))}")
    for name, p in (("perm_in", perm_in), ("perm_out", perm_out)):
        if not hasattr(p, "shape") or not jnp.issubdtype(p.dtype, jnp.integer) or p.ndim != 1:
            raise TypeError(f"{name} must be a 1-d integer array, got {getattr(p, 'dtype', p)!r}"
                            f" of shape {getattr(p, 'shape', None)}")
    if w.ndim != 2:
        raise ValueError(f"w must have shape [n, m], got {tuple(w.shape)}")
    n, m = w.shape
    if x.ndim < 1 or x.shape[-1] != n:
        raise ValueError(f"x must have shape [..., n] with n = {n} from w, got {tuple(x.shape)}")
    for side, size in (("n (input features)", n), ("m (output features)", m)):
        if size % block_size:
            raise ValueError(
                f"block_size {block_size} must divide {side} = {size}; layers whose sizes are "
                f"not multiples of the block size stay dense"
            )
    p = num_block_params(block_size)
    for name, theta, size in (("theta_in", theta_in, n), ("theta_out", theta_out, m)):
        if tuple(theta.shape) != (size // block_size, p):
            raise ValueError(f"{name} must have shape [{size} / b, b (b - 1) / 2] = "
                             f"{(size // block_size, p)}, got {tuple(theta.shape)}")
    if perm_in.shape[0] != n:
        raise ValueError(f"perm_in must have length n = {n}, got {perm_in.shape[0]}")
    if perm_out.shape[0] != m:
        raise ValueError(f"perm_out must have length m = {m}, got {perm_out.shape[0]}")


def _poet_linear_pallas(x, w, theta_in, theta_out, perm_in, perm_out, *, block_size, config):
    from jaxlib_ext.pallas_kernels.poet.pallas import block_rotate_pallas

    def rot(z, theta, perm):
        return rotate(z, theta, perm, block_size, lambda z, g: block_rotate_pallas(z, g, config))

    h = jnp.matmul(rot(x, theta_in, perm_in), w.astype(x.dtype))
    return rot(h, theta_out, perm_out)


def poet_linear(x, w, theta_in, theta_out, perm_in, perm_out, *, block_size: int,
                method: str = "auto", memory_saving: bool = False,
                config=None) -> jax.Array:
    """``x @ W_eff`` of a POET-X layer; conventions in the module docstring.

    Args:
      x: ``[..., n]`` float.
      w: ``[n, m]`` float, the base weight.
      theta_in, theta_out: ``[n / b, b (b - 1) / 2]``, ``[m / b, b (b - 1) / 2]``.
      perm_in, perm_out: integer permutations of ``range(n)``, ``range(m)``.
      block_size: ``b >= 2``, dividing ``n`` and ``m``.
      method: ``"auto" | "reference" | "xla" | "pallas"`` (:data:`METHODS`).
      memory_saving: the recomputing ``custom_vjp`` (not with ``"reference"``).
      config: a :class:`PoetKernelConfig` for ``"pallas"`` (``None``: its defaults, interpreted
        off GPU).

    Returns:
      ``[..., m]`` in ``x``'s dtype.

    Raises:
      ValueError: sizes not divisible by ``block_size``, ``block_size < 2``, wrong theta shapes,
        permutations of the wrong length, an unknown method.
      TypeError: non-float arrays or non-integer permutations.
    """
    method = check_method(method, METHODS, op="poet_linear")
    _check(x, w, theta_in, theta_out, perm_in, perm_out, block_size)
    # the compiled kernels take power-of-two tiles of at least 16 (config.py) and no float64
    f64 = any(jnp.dtype(a.dtype) == jnp.float64 for a in (x, w, theta_in, theta_out))
    method = resolve_auto(method, kernel=_KERNEL, supported=block_size % 16 == 0 and not f64)
    args = (x, w, theta_in, theta_out, perm_in, perm_out)
    if memory_saving:
        if method == "reference":
            raise ValueError("memory_saving=True needs method 'xla' or 'pallas', got 'reference'")
        return poet_linear_memory(*args, block_size=block_size, impl=method, config=config)
    if method == "reference":
        return poet_linear_reference(*args, block_size=block_size)
    if method == "xla":
        return poet_linear_xla(*args, block_size=block_size)
    return _poet_linear_pallas(*args, block_size=block_size, config=config)
