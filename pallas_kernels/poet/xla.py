r"""Input-centric POET-X layer in XLA (arXiv 2603.05500, section 3), and its memory-saving form.

``y = rot_out(rot_in(x) @ w)`` without ever forming ``W_eff`` (conventions in
:mod:`jaxlib_ext.pallas_kernels.poet.reference`): gather the features by ``perm``, multiply
each group of ``b`` features by its block ``G_k`` (a batched ``[.., b] x [b, b]`` product), gather
back by the inverse permutation, one dense GEMM with the base weight, and the same on the output
side. Extra cost per token :math:`O(b (n + m))` over the GEMM.

:func:`poet_linear_memory` is the ``POET-X_mem`` variant: a ``custom_vjp`` that keeps only the
layer input (and the parameters) for the backward pass, recomputes the rotated activations there,
and returns a zero cotangent for the base weight, which POET keeps frozen between merges. The
per-block products can come from XLA (``impl="xla"``) or from the Pallas kernels
(``impl="pallas"``, :mod:`jaxlib_ext.pallas_kernels.poet.pallas`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.pallas_kernels._common import like_varying
from jaxlib_ext.pallas_kernels.poet.reference import cayley_neumann, inverse_permutation

__all__ = [
    "block_apply", "block_gram", "permute", "poet_linear_memory", "poet_linear_xla", "rotate",
]

def block_apply(z: jax.Array, g: jax.Array) -> jax.Array:
    """``[..., k b] x [k, b, b] -> [..., k b]``: ``out[..., k, :] = z[..., k, :] @ G_k``.

    Differentiable: ``dz = block_apply(dy, G^T)``, ``dG = block_gram(z, dy)``. Inside
    ``jax.shard_map`` ``z`` and ``G`` first take the varying axes of both, so the cotangent of
    a replicated ``G`` is summed over the devices.

    Args:
      z: ``[..., k b]`` row vectors.
      g: ``[k, b, b]`` blocks (cast to ``z``'s dtype).

    Returns:
      The ``[..., k b]`` products, of ``z``'s dtype.
    """
    z, g = like_varying((z, g), z, g)
    return _block_apply(z, g)


@jax.custom_vjp
def _block_apply(z, g):
    k, b, _ = g.shape
    zb = z.reshape(z.shape[:-1] + (k, b))
    return jnp.einsum("...kb,kbc->...kc", zb, g.astype(z.dtype)).reshape(z.shape)


def _apply_fwd(z, g):
    return _block_apply(z, g), (z, g)


def _apply_bwd(res, dy):
    z, g = res
    dz = block_apply(dy, jnp.swapaxes(g, -1, -2))
    return dz.astype(z.dtype), block_gram(z, dy, g.shape[0]).astype(g.dtype)


_block_apply.defvjp(_apply_fwd, _apply_bwd)


def block_gram(z: jax.Array, dy: jax.Array, k: int) -> jax.Array:
    """``[..., k b] x [..., k b] -> [k, b, b]``: ``sum over tokens of z_k^T dy_k``.

    The cotangent of ``G_k`` in :func:`block_apply`, accumulated in float32 (or float64). One
    ``[b, T] x [T, b]`` product per block (XLA lays these out better than one batched einsum).

    Args:
      z: ``[..., k b]`` inputs of the block product.
      dy: ``[..., k b]`` output cotangents (cast to ``z``'s dtype).
      k: number of blocks.

    Returns:
      The ``[k, b, b]`` sums, float32 (float64 for float64 ``z``).
    """
    b = z.shape[-1] // k
    z2 = z.reshape(-1, z.shape[-1])
    d2 = dy.reshape(-1, dy.shape[-1]).astype(z.dtype)
    acc = jnp.promote_types(z.dtype, jnp.float32)
    return jnp.stack([
        jnp.matmul(z2[:, i * b:(i + 1) * b].T, d2[:, i * b:(i + 1) * b],
                   preferred_element_type=acc)
        for i in range(k)
    ])


def _gather(z, perm):
    # An in-bounds gather, materialised: XLA would otherwise fuse it into the consuming dot as
    # a strided operand, which runs several times slower than the gather and the dot apart.
    return jax.lax.optimization_barrier(jnp.take(z, perm, axis=-1, mode="clip"))


@jax.custom_vjp
def permute(z, perm, inv):
    """``z[..., perm]`` whose cotangent is the gather ``dz[..., inv]`` instead of autodiff's
    scatter-add.

    Args:
      z: ``[..., n]`` array.
      perm: ``int[n]`` permutation.
      inv: ``int[n]``, the inverse of ``perm``.

    Returns:
      ``z[..., perm]``.
    """
    return _gather(z, perm)


def _permute_fwd(z, perm, inv):
    return _gather(z, perm), (perm, inv)


def _permute_bwd(res, dz):
    perm, inv = res
    zero = lambda p: np.zeros(p.shape, jax.dtypes.float0)  # noqa: E731
    return _gather(dz, inv), zero(perm), zero(inv)


permute.defvjp(_permute_fwd, _permute_bwd)


def rotate(z, theta, perm, block_size: int, apply=block_apply):
    """``rot(z) = unpermute(blockdiag(z[..., perm]))``; autodiff except for the gathers
    (:func:`permute`).

    Args:
      z: ``[..., n]`` row vectors.
      theta: ``[n / b, b(b-1)/2]`` block parameters.
      perm: ``int[n]`` permutation.
      block_size: ``b``.
      apply: ``apply(z, G)``, the block product (:func:`block_apply` or a kernel).

    Returns:
      The ``[..., n]`` rotated vectors.
    """
    g = cayley_neumann(theta, block_size)
    inv = inverse_permutation(perm)
    return permute(apply(permute(z, perm, inv), g), inv, perm)


def poet_linear_xla(x, w, theta_in, theta_out, perm_in, perm_out, *, block_size: int):
    """``rot_out(rot_in(x) @ w)``; gradients by autodiff (``POET-X_fast``: keeps the intermediates).

    Args:
      x: ``[..., n]`` inputs.
      w: ``[n, m]`` base weight (cast to ``x``'s dtype).
      theta_in: ``[n / b, b(b-1)/2]`` input-rotation parameters.
      theta_out: ``[m / b, b(b-1)/2]`` output-rotation parameters.
      perm_in: ``int[n]`` input permutation.
      perm_out: ``int[m]`` output permutation.
      block_size: ``b``.

    Returns:
      The ``[..., m]`` outputs.
    """
    h = jnp.matmul(rotate(x, theta_in, perm_in, block_size), w.astype(x.dtype))
    return rotate(h, theta_out, perm_out, block_size)


def _kernels(impl: str, config):
    if impl == "xla":
        return block_apply, block_gram
    from jaxlib_ext.pallas_kernels.poet import pallas

    return (functools.partial(pallas.block_apply_pallas, config=config),
            functools.partial(pallas.block_gram_pallas, config=config))


def poet_linear_memory(x, w, theta_in, theta_out, perm_in, perm_out, *, block_size: int,
                       impl: str = "xla", config=None):
    """``rot_out(rot_in(x) @ w)`` with the recomputing backward (``POET-X_mem``).

    Residuals: ``x``, ``w``, the thetas and permutations (no activation-sized intermediate).
    The cotangent of ``w`` is zero (frozen base weight), those of the permutations are ``float0``.
    Inside ``jax.shard_map`` the floating arguments first take the varying axes of all of them, so
    the cotangents of replicated parameters are summed over the devices.

    Args:
      x: ``[..., n]`` inputs.
      w: ``[n, m]`` base weight (cast to ``x``'s dtype).
      theta_in: ``[n / b, b(b-1)/2]`` input-rotation parameters.
      theta_out: ``[m / b, b(b-1)/2]`` output-rotation parameters.
      perm_in: ``int[n]`` input permutation.
      perm_out: ``int[m]`` output permutation.
      block_size: ``b``.
      impl: ``"xla"`` (:func:`block_apply`, :func:`block_gram`) or ``"pallas"`` (the Pallas block
        kernels).
      config: the ``PoetKernelConfig`` of ``impl="pallas"``.

    Returns:
      The ``[..., m]`` outputs.
    """
    x, w, theta_in, theta_out = like_varying((x, w, theta_in, theta_out), x, w, theta_in,
                                             theta_out, perm_in, perm_out)
    return _memory(block_size, (impl, config), x, w, theta_in, theta_out, perm_in, perm_out)


def _forward(block_size, impl, x, w, theta_in, theta_out, perm_in, perm_out):
    apply, _ = _kernels(*impl)
    g_in = cayley_neumann(theta_in, block_size)
    g_out = cayley_neumann(theta_out, block_size)
    inv_in, inv_out = inverse_permutation(perm_in), inverse_permutation(perm_out)
    xp = _gather(x, perm_in)
    h = jnp.matmul(_gather(apply(xp, g_in), inv_in), w.astype(x.dtype))
    hp = _gather(h, perm_out)
    return _gather(apply(hp, g_out), inv_out), (xp, hp, g_in, g_out, inv_in)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _memory(block_size, impl, x, w, theta_in, theta_out, perm_in, perm_out):
    return _forward(block_size, impl, x, w, theta_in, theta_out, perm_in, perm_out)[0]


def _memory_fwd(block_size, impl, x, w, theta_in, theta_out, perm_in, perm_out):
    y = _forward(block_size, impl, x, w, theta_in, theta_out, perm_in, perm_out)[0]
    return y, (x, w, theta_in, theta_out, perm_in, perm_out)


def _memory_bwd(block_size, impl, res, dy):
    # Tying the residuals to the incoming cotangent in one barrier keeps XLA from merging this
    # recomputation with the forward pass or scheduling it before the backward pass starts,
    # either of which would keep the forward's intermediates alive until here.
    res, dy = jax.lax.optimization_barrier((res, dy))
    x, w, theta_in, theta_out, perm_in, perm_out = res
    apply, gram = _kernels(*impl)
    # recompute the rotated activations from the input
    _, (xp, hp, g_in, g_out, inv_in) = _forward(
        block_size, impl, x, w, theta_in, theta_out, perm_in, perm_out
    )
    k_in, k_out = g_in.shape[0], g_out.shape[0]
    # out = c[..., inv_out] with c = blockdiag(hp)  =>  dc = dy[..., perm_out]
    dc = _gather(dy, perm_out)
    dg_out = gram(hp, dc, k_out)
    dh = _gather(apply(dc, jnp.swapaxes(g_out, -1, -2)), inverse_permutation(perm_out))
    dz = jnp.matmul(dh, w.astype(dh.dtype).T)  # dz = d rot_in(x)
    da = _gather(dz, perm_in)
    dg_in = gram(xp, da, k_in)
    dx = _gather(apply(da, jnp.swapaxes(g_in, -1, -2)), inv_in)
    _, vjp_in = jax.vjp(lambda t: cayley_neumann(t, block_size), theta_in)
    _, vjp_out = jax.vjp(lambda t: cayley_neumann(t, block_size), theta_out)
    (dtheta_in,) = vjp_in(dg_in.astype(theta_in.dtype))
    (dtheta_out,) = vjp_out(dg_out.astype(theta_out.dtype))
    zero_perm = lambda p: np.zeros(p.shape, jax.dtypes.float0)  # noqa: E731
    return (dx.astype(x.dtype), jnp.zeros_like(w), dtheta_in, dtheta_out,
            zero_perm(perm_in), zero_perm(perm_out))


_memory.defvjp(_memory_fwd, _memory_bwd)
