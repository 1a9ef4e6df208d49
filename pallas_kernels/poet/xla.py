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

from jaxlib_ext.pallas_kernels.poet.reference import cayley_neumann, inverse_permutation

__all__ = ["block_apply", "block_gram", "poet_linear_memory", "poet_linear_xla", "rotate"]

_HP = jax.lax.Precision.HIGHEST


def block_apply(z: jax.Array, g: jax.Array) -> jax.Array:
    """``[..., k b] x [k, b, b] -> [..., k b]``: ``out[..., k, :] = z[..., k, :] @ G_k``."""
    k, b, _ = g.shape
    zb = z.reshape(z.shape[:-1] + (k, b))
    out = jnp.einsum("...kb,kbc->...kc", zb, g.astype(z.dtype), precision=_HP)
    return out.reshape(z.shape)


def block_gram(z: jax.Array, dy: jax.Array, k: int) -> jax.Array:
    """``[..., k b] x [..., k b] -> [k, b, b]``: ``sum over tokens of z_k^T dy_k`` (the cotangent
    of ``G_k`` in :func:`block_apply`), accumulated in float32 (or float64)."""
    b = z.shape[-1] // k
    zb = z.reshape(-1, k, b)
    gb = dy.reshape(-1, k, b)
    acc = jnp.promote_types(z.dtype, jnp.float32)
    return jnp.einsum("tkb,tkc->kbc", zb, gb, precision=_HP, preferred_element_type=acc)


def rotate(z, theta, perm, block_size: int):
    """``rot(z) = unpermute(blockdiag(z[..., perm]))`` (plain autodiff)."""
    g = cayley_neumann(theta, block_size)
    return block_apply(z[..., perm], g)[..., inverse_permutation(perm)]


def poet_linear_xla(x, w, theta_in, theta_out, perm_in, perm_out, *, block_size: int):
    """``rot_out(rot_in(x) @ w)``; gradients by autodiff (``POET-X_fast``: keeps the
    intermediates)."""
    h = jnp.matmul(rotate(x, theta_in, perm_in, block_size), w.astype(x.dtype), precision=_HP)
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
    ``config``: the ``PoetKernelConfig`` of ``impl="pallas"``.
    """
    return _memory(block_size, (impl, config), x, w, theta_in, theta_out, perm_in, perm_out)


def _forward(block_size, impl, x, w, theta_in, theta_out, perm_in, perm_out):
    apply, _ = _kernels(*impl)
    g_in = cayley_neumann(theta_in, block_size)
    g_out = cayley_neumann(theta_out, block_size)
    inv_in, inv_out = inverse_permutation(perm_in), inverse_permutation(perm_out)
    xp = x[..., perm_in]
    h = jnp.matmul(apply(xp, g_in)[..., inv_in], w.astype(x.dtype), precision=_HP)
    hp = h[..., perm_out]
    return apply(hp, g_out)[..., inv_out], (xp, hp, g_in, g_out, inv_in)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _memory(block_size, impl, x, w, theta_in, theta_out, perm_in, perm_out):
    return _forward(block_size, impl, x, w, theta_in, theta_out, perm_in, perm_out)[0]


def _memory_fwd(block_size, impl, x, w, theta_in, theta_out, perm_in, perm_out):
    y = _forward(block_size, impl, x, w, theta_in, theta_out, perm_in, perm_out)[0]
    return y, (x, w, theta_in, theta_out, perm_in, perm_out)


def _memory_bwd(block_size, impl, res, dy):
    x, w, theta_in, theta_out, perm_in, perm_out = res
    apply, gram = _kernels(*impl)
    # recompute the rotated activations from the input
    _, (xp, hp, g_in, g_out, inv_in) = _forward(
        block_size, impl, x, w, theta_in, theta_out, perm_in, perm_out
    )
    k_in, k_out = g_in.shape[0], g_out.shape[0]
    # out = c[..., inv_out] with c = blockdiag(hp)  =>  dc = dy[..., perm_out]
    dc = dy[..., perm_out]
    dg_out = gram(hp, dc, k_out)
    dh = apply(dc, jnp.swapaxes(g_out, -1, -2))[..., inverse_permutation(perm_out)]
    dz = jnp.matmul(dh, w.astype(dh.dtype).T, precision=_HP)  # dz = d rot_in(x)
    da = dz[..., perm_in]
    dg_in = gram(xp, da, k_in)
    dx = apply(da, jnp.swapaxes(g_in, -1, -2))[..., inv_in]
    _, vjp_in = jax.vjp(lambda t: cayley_neumann(t, block_size), theta_in)
    _, vjp_out = jax.vjp(lambda t: cayley_neumann(t, block_size), theta_out)
    (dtheta_in,) = vjp_in(dg_in.astype(theta_in.dtype))
    (dtheta_out,) = vjp_out(dg_out.astype(theta_out.dtype))
    zero_perm = lambda p: np.zeros(p.shape, jax.dtypes.float0)  # noqa: E731
    return (dx.astype(x.dtype), jnp.zeros_like(w), dtheta_in, dtheta_out,
            zero_perm(perm_in), zero_perm(perm_out))


_memory.defvjp(_memory_fwd, _memory_bwd)
