r"""``SparseLinear``: a block-sparse Flax NNX linear layer with a sampled weight gradient.

Memory side of SMET (arXiv 2606.00888, section on memory-efficient DST): the layer stores only the
``K`` active blocks of its ``(in, out)`` kernel, ``sparse_values: [K, block_size]``, and their
block indices ``sparse_indices: int32[K]`` (blocks are ``block_size`` consecutive entries of the
kernel in row-major order, as SMET's masks; ``block_size`` must divide ``in * out``). With
:math:`W` the dense kernel the values stand for (zero elsewhere),

.. math::

   y = x W + b, \qquad
   \frac{\partial L}{\partial x} = \frac{\partial L}{\partial y} W^\top, \qquad
   \frac{\partial L}{\partial W_{rc}} = \sum_n x_{nr} \frac{\partial L}{\partial y_{nc}}
   \quad \text{only for active } (r, c)

The last line is a sampled dense-dense product (SDDMM): the weight gradient is computed at the
active entries only, in chunks of slots, and comes out as ``[K, block_size]``; the dense
``in x out`` weight gradient is never formed (``custom_vjp``). The dense kernel itself is rebuilt
transiently from the values in the forward and backward passes (a weight, not a gradient); a
Pallas block-sparse matmul would remove that too, and is left for the GPU kernel work.

Protocol with the optimizer: the value leaf is named ``"sparse_values"``
(``jaxlib_ext.optim._common.SPARSE_VALUES_KEY``); :func:`jaxlib_ext.optim.smet` recognises it by
that key, keeps per-slot state and marks slots it pruned; :func:`regrow_sparse_indices` then draws
their new block indices among the blocks that were inactive, as SMET's random regrowth.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.optim._common import SPARSE_VALUES_KEY, path_names

__all__ = [
    "SparseIndices",
    "SparseLinear",
    "dense_kernel",
    "regrow_indices",
    "regrow_sparse_indices",
    "sampled_weight_grad",
    "sparse_matmul",
]


class SparseIndices(nnx.Variable):
    """Active block indices of a :class:`SparseLinear` (int32, not trained by gradients)."""


def _rows_cols(indices, block_size: int, out_features: int):
    """Row and column of every entry ``[K, block_size]`` of the active blocks."""
    flat = indices.astype(jnp.int32)[:, None] * block_size + jnp.arange(block_size)[None, :]
    return flat // out_features, flat % out_features


def dense_kernel(values, indices, in_features: int, out_features: int) -> jax.Array:
    """Scatter ``[K, block_size]`` values into the dense ``(in, out)`` kernel (zeros elsewhere).

    Args:
      values: ``[K, block_size]`` values of the active blocks.
      indices: ``int[K]`` indices of the active blocks in the row-major flattened kernel, in units
        of ``block_size`` entries.
      in_features: rows of the kernel.
      out_features: columns of the kernel.

    Returns:
      The ``[in_features, out_features]`` kernel, of ``values``' dtype.
    """
    block_size = values.shape[1]
    nb = in_features * out_features // block_size
    w = jnp.zeros((nb, block_size), values.dtype).at[indices].set(values)
    return w.reshape(in_features, out_features)


def sampled_weight_grad(x2, gy2, indices, block_size: int, out_features: int, slot_chunk: int):
    """SDDMM: ``dW[k, j] = sum_n x[n, r_k] * gy[n, c_k + j]`` for the active blocks only.

    Processed ``slot_chunk`` slots at a time, so the temporaries are
    ``N x slot_chunk x block_size``.

    Args:
      x2: ``[N, in]`` layer inputs.
      gy2: ``[N, out]`` output cotangents.
      indices: ``int[K]`` active block indices (see :func:`dense_kernel`).
      block_size: entries per block.
      out_features: columns of the kernel.
      slot_chunk: slots processed at a time (clipped to ``[1, K]``).

    Returns:
      The ``[K, block_size]`` gradient of the block values.
    """
    k = indices.shape[0]
    chunk = max(1, min(slot_chunk, k))
    n_chunks = -(-k // chunk)
    pad = n_chunks * chunk - k
    rows, cols = _rows_cols(jnp.pad(indices, (0, pad)), block_size, out_features)

    def one(args):
        r, c = args  # [chunk, bs] each
        xg = jnp.take(x2, r.reshape(-1), axis=1)  # [N, chunk * bs]
        gg = jnp.take(gy2, c.reshape(-1), axis=1)
        return jnp.sum(xg * gg, axis=0).reshape(chunk, block_size)

    shape = (n_chunks, chunk, block_size)
    out = jax.lax.map(one, (rows.reshape(shape), cols.reshape(shape)))
    return out.reshape(n_chunks * chunk, block_size)[:k]


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def sparse_matmul(x, values, indices, out_features: int, slot_chunk: int = 256):
    """``x @ W`` with ``W`` given by block values and indices; see the module docstring.

    Args:
      x: ``[..., in]`` inputs.
      values: ``[K, block_size]`` values of the active blocks.
      indices: ``int[K]`` active block indices (see :func:`dense_kernel`); no cotangent.
      out_features: columns of ``W`` (static).
      slot_chunk: slots per step of the backward's :func:`sampled_weight_grad` (static).

    Returns:
      The ``[..., out_features]`` product.
    """
    in_features = x.shape[-1]
    return x @ dense_kernel(values, indices, in_features, out_features)


def _fwd(x, values, indices, out_features, slot_chunk):
    return sparse_matmul(x, values, indices, out_features, slot_chunk), (x, values, indices)


def _bwd(out_features, slot_chunk, res, gy):
    x, values, indices = res
    in_features = x.shape[-1]
    block_size = values.shape[1]
    w = dense_kernel(values, indices, in_features, out_features)
    gx = gy @ w.T
    x2 = x.reshape(-1, in_features)
    gy2 = gy.reshape(-1, out_features)
    gv = sampled_weight_grad(x2, gy2, indices, block_size, out_features, slot_chunk)
    return gx, gv.astype(values.dtype), None


sparse_matmul.defvjp(_fwd, _bwd)


class SparseLinear(nnx.Module):
    """Block-sparse ``(in, out)`` linear layer storing only its active blocks.

    Args:
      in_features, out_features: dense kernel shape ``(in, out)`` (Flax layout).
      density: fraction of active blocks, ``K = max(1, round(density * in * out / block_size))``.
      block_size: consecutive row-major entries per block; must divide ``in * out``.
      use_bias: add a dense bias.
      slot_chunk: slots per chunk in the sampled weight gradient.
      rngs: ``nnx.Rngs``; ``params`` draws the initial pattern and values.

    The initial values follow ``lecun_normal`` of the dense kernel (std ``1/sqrt(in)``) at the
    active entries; the pattern is uniform without replacement (exactly ``K`` blocks, unlike the
    reference code's per-block Bernoulli draw, so shapes are static).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        density: float,
        block_size: int = 1,
        use_bias: bool = True,
        slot_chunk: int = 256,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        if not 0.0 < float(density) <= 1.0:
            raise ValueError(f"density: expected a value in (0, 1], got {density}")
        if block_size < 1 or (in_features * out_features) % block_size:
            raise ValueError(
                f"block_size: expected a positive divisor of in*out={in_features * out_features}, "
                f"got {block_size}"
            )
        self.in_features, self.out_features = in_features, out_features
        self.block_size, self.slot_chunk = block_size, slot_chunk
        nb = in_features * out_features // block_size
        k = int(min(nb, max(1, round(float(density) * nb))))
        self.num_blocks = nb
        key_idx, key_val = jax.random.split(rngs.params())
        _, idx = jax.lax.top_k(jax.random.uniform(key_idx, (nb,)), k)
        values = jax.random.normal(key_val, (k, block_size), param_dtype) / math.sqrt(in_features)
        self.sparse_values = nnx.Param(values, logical_axes=(None, None))
        self.sparse_indices = SparseIndices(jnp.sort(idx).astype(jnp.int32))
        self.bias = (
            nnx.Param(jnp.zeros((out_features,), param_dtype), logical_axes=(None,))
            if use_bias
            else None
        )

    @property
    def density(self) -> float:
        return self.sparse_indices[...].shape[0] / self.num_blocks

    def dense_kernel(self) -> jax.Array:
        """The dense ``(in, out)`` kernel these values stand for (for checks and export)."""
        return dense_kernel(
            self.sparse_values[...], self.sparse_indices[...], self.in_features,
            self.out_features,
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"x: expected last axis {self.in_features}, got shape {x.shape}"
            )
        y = sparse_matmul(
            x, self.sparse_values[...], self.sparse_indices[...], self.out_features,
            self.slot_chunk,
        )
        if self.bias is not None:
            y = y + self.bias[...]
        return y


def regrow_indices(indices: jax.Array, regrown: jax.Array, num_blocks: int, key) -> jax.Array:
    """New block indices for the ``regrown`` slots, uniform among currently inactive blocks.

    Pure function: slots with ``regrown=False`` keep their index; the candidates exclude every
    block in ``indices`` (so a block pruned in this update cannot come straight back).

    Args:
      indices: ``int[K]`` active block indices.
      regrown: ``bool[K]``, the slots that take a new index.
      num_blocks: number of blocks of the kernel.
      key: PRNG key of the draw.

    Returns:
      The ``int32[K]`` new indices (``indices`` unchanged when every block is active).
    """
    k = indices.shape[0]
    num_inactive = num_blocks - k
    if num_inactive == 0:
        return indices
    noise = jax.random.uniform(key, (num_blocks,)).at[indices].set(-1.0)
    kc = min(k, num_inactive)
    _, cand = jax.lax.top_k(noise, kc)
    order = jnp.cumsum(regrown.astype(jnp.int32)) - 1  # i-th regrown slot takes candidate i
    return jnp.where(regrown, cand[jnp.clip(order, 0, kc - 1)].astype(jnp.int32), indices)


def regrow_sparse_indices(model: nnx.Module, regrown_tree, key) -> None:
    """Give the slots SMET pruned new random block indices, in place, in every ``SparseLinear``.

    Args:
      model: the NNX model holding ``SparseLinear`` layers.
      regrown_tree: a tree like ``nnx.state(model, nnx.Param)`` with ``bool[K]`` at each
        ``sparse_values`` leaf (``jaxlib_ext.optim.smet_regrown(opt_state, params)``), ``None``
        elsewhere.
      key: PRNG key (folded with the layer's position for each layer).
    """
    flat = jax.tree_util.tree_flatten_with_path(regrown_tree, is_leaf=lambda x: x is None)[0]
    by_path = {
        path_names(p)[:-1]: m
        for p, m in flat
        if m is not None and path_names(p)[-1:] == (SPARSE_VALUES_KEY,)
    }
    for i, (path, node) in enumerate(nnx.iter_graph(model)):
        if not isinstance(node, SparseLinear):
            continue
        mask = by_path.get(tuple(str(p) for p in path))
        if mask is None:
            continue
        if not isinstance(mask, jax.core.Tracer) and not bool(jnp.any(mask)):
            continue
        node.sparse_indices[...] = regrow_indices(
            node.sparse_indices[...], mask, node.num_blocks, jax.random.fold_in(key, i)
        )
