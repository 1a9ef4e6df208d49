r"""POET block rotations and the dense reference of the POET-X linear layer.

Conventions (POET, arXiv 2506.08001, section 3; POET-X, arXiv 2603.05500, section 3):

* A block of size :math:`b` is parameterised by a row ``theta_row`` of :math:`b(b-1)/2` numbers,
  the strict upper triangle of a skew matrix in row-major order:
  ``Q[np.triu_indices(b, 1)] = theta_row; Q = Q - Q.T``.
* Its rotation is the Cayley–Neumann truncation of the Cayley map
  :math:`(I+Q)(I-Q)^{-1}` that the authors' kernel computes,

  .. math:: G = I + 2Q + 2Q^2 + 2Q^3 + Q^4 = (I + Q)(I + Q + Q^2 + Q^3),

  exactly :math:`I` at :math:`Q = 0` and orthogonal up to fourth order: since
  :math:`G^T = G(-Q)`, :math:`G^T G - I = -2Q^4 + Q^8` exactly, so halving :math:`Q` divides
  the orthogonality error by about 16.
  POET (arXiv 2506.08001, the Neumann-terms ablation) recommends more terms; the released
  POET-X kernel fixes this fourth-order expansion, which is what is implemented.
* Blocks act on row vectors: ``blockdiag(z)[..., k, :] = z[..., k, :] @ G_k`` for the ``k``-th
  group of ``b`` features. A rotation with permutation ``perm`` (an integer vector) is
  ``rot(z) = unpermute(blockdiag(z[..., perm]))``, ``unpermute(u) = u[..., argsort(perm)]``;
  as a matrix, ``rot(z) = z @ R`` with ``R = S B S^T``, ``S[perm[i], i] = 1`` and
  ``B = BlockDiag(G_1, ..., G_{n/b})``: the paper's :math:`R = \Psi^T \mathrm{BlockDiag}(G)\Psi`
  (arXiv 2506.08001, the block-stochastic POET-BS parameterisation) written for row vectors.
* The POET-X layer is ``y = rot_out(rot_in(x) @ w)`` with the stored base weight ``w`` of shape
  ``[n, m]`` (``x @ w`` is the plain layer), i.e. ``y = x @ W_eff`` with
  ``W_eff = R_in @ w @ R_out``. With identity permutations, ``theta_out = 0`` and ``w = I``,
  ``W_eff`` is the block-diagonal matrix of the ``G`` blocks of ``theta_in`` themselves (not
  their transposes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import block_diag

__all__ = [
    "cayley_neumann",
    "effective_weight",
    "inverse_permutation",
    "num_block_params",
    "poet_linear_reference",
    "rotation_matrix",
    "skew",
]


def num_block_params(block_size: int) -> int:
    """Parameters of one block: the strict upper triangle, ``b (b - 1) / 2``.

    Args:
      block_size: ``b``, the block size.

    Returns:
      ``b (b - 1) // 2``, a Python int.
    """
    return block_size * (block_size - 1) // 2


def skew(theta: jax.Array, block_size: int) -> jax.Array:
    """``[k, b(b-1)/2] -> [k, b, b]``: ``Q[triu_indices(b, 1)] = theta_row; Q = Q - Q^T``.

    Args:
      theta: ``[..., k, b(b-1)/2]`` block parameters, one row per block.
      block_size: ``b``.

    Returns:
      The ``[..., k, b, b]`` skew-symmetric matrices ``Q``, of ``theta``'s dtype.
    """
    rows, cols = np.triu_indices(block_size, 1)
    upper = jnp.zeros(theta.shape[:-1] + (block_size, block_size), theta.dtype)
    upper = upper.at[..., rows, cols].set(theta)
    return upper - jnp.swapaxes(upper, -1, -2)


def cayley_neumann(theta: jax.Array, block_size: int) -> jax.Array:
    """``[k, b(b-1)/2] -> [k, b, b]``: ``G = I + 2Q + 2Q^2 + 2Q^3 + Q^4`` per block.

    Evaluated as ``I + Q (2I + Q (2I + Q (2I + Q)))`` (three matmuls at full float32 precision:
    the blocks' orthogonality rests on them; their cost does not grow with the tokens).

    Args:
      theta: ``[k, b(b-1)/2]`` block parameters (see :func:`skew`).
      block_size: ``b``.

    Returns:
      The ``[k, b, b]`` blocks ``G``, of ``theta``'s dtype.

    References:
      POET-X, arXiv 2603.05500, section 3.
    """
    q = skew(theta, block_size)
    eye = jnp.eye(block_size, dtype=theta.dtype)
    hp = jax.lax.Precision.HIGHEST
    acc = 2 * eye + q
    for _ in range(2):
        acc = 2 * eye + jnp.matmul(q, acc, precision=hp)
    return eye + jnp.matmul(q, acc, precision=hp)


def inverse_permutation(perm: jax.Array) -> jax.Array:
    """``inv`` with ``inv[perm[i]] = i`` (a scatter, no sort).

    Args:
      perm: ``int[n]`` permutation.

    Returns:
      The ``[n]`` inverse permutation, of ``perm``'s dtype.
    """
    n = perm.shape[-1]
    return jnp.zeros((n,), perm.dtype).at[perm].set(jnp.arange(n, dtype=perm.dtype))


def rotation_matrix(theta: jax.Array, perm: jax.Array, block_size: int) -> jax.Array:
    """The dense ``[n, n]`` matrix ``R = S B S^T`` of ``rot`` (``rot(z) = z @ R``).

    Args:
      theta: ``[n / b, b(b-1)/2]`` block parameters.
      perm: ``int[n]`` permutation of the rotation.
      block_size: ``b``.

    Returns:
      The ``[n, n]`` matrix ``R``, of ``theta``'s dtype.
    """
    g = cayley_neumann(theta, block_size)
    b = block_diag(*[g[i] for i in range(g.shape[0])])
    n = perm.shape[0]
    s = jnp.eye(n, dtype=theta.dtype)[:, perm]  # S[perm[i], i] = 1
    return jnp.matmul(jnp.matmul(s, b), s.T)


def effective_weight(w, theta_in, theta_out, perm_in, perm_out, block_size: int) -> jax.Array:
    """``W_eff = R_in @ w @ R_out``, ``[n, m]``, built densely (the naive POET path).

    Args:
      w: ``[n, m]`` base weight.
      theta_in: ``[n / b, b(b-1)/2]`` input-rotation parameters.
      theta_out: ``[m / b, b(b-1)/2]`` output-rotation parameters.
      perm_in: ``int[n]`` input permutation.
      perm_out: ``int[m]`` output permutation.
      block_size: ``b``.

    Returns:
      The ``[n, m]`` effective weight.
    """
    r_in = rotation_matrix(theta_in, perm_in, block_size)
    r_out = rotation_matrix(theta_out, perm_out, block_size)
    return jnp.matmul(jnp.matmul(r_in, w), r_out)


def poet_linear_reference(x, w, theta_in, theta_out, perm_in, perm_out, *, block_size: int):
    """``x @ W_eff`` with ``W_eff`` materialised (:func:`effective_weight`).

    Args:
      x: ``[..., n]`` inputs.
      w: ``[n, m]`` base weight.
      theta_in: ``[n / b, b(b-1)/2]`` input-rotation parameters.
      theta_out: ``[m / b, b(b-1)/2]`` output-rotation parameters.
      perm_in: ``int[n]`` input permutation.
      perm_out: ``int[m]`` output permutation.
      block_size: ``b``.

    Returns:
      The ``[..., m]`` outputs, of ``x``'s dtype.
    """
    w_eff = effective_weight(w, theta_in, theta_out, perm_in, perm_out, block_size)
    return jnp.matmul(x, w_eff.astype(x.dtype))
