"""Blind estimation of the degradation: the posterior over operator parameters on a grid.

arXiv 2605.15487 (blind inverse problems by Bayes' rule): because ``U`` is normalised, the
evidence of a measurement under each candidate operator ``(A_i, sigma_j)`` is
``p(y | i, j) = exp(-nll_ij)`` with ``nll_ij`` from (P.2) of
:mod:`~jaxlib_ext.samplers.energy.problem`, and with a prior ``pi_ij`` (flat by default)::

    p(i, j | y) ∝ pi_ij exp(-nll_ij),      (i, j)_hat = argmax_ij p(i, j | y)               (B.1)

The grid is the product of candidate operator diagonals (box sizes, blur widths, ...) and
candidate noise levels. One network evaluation (no gradient) per grid point and measurement.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers.energy.energy import EnergyFn
from jaxlib_ext.samplers.energy.problem import DiagonalProblem, diagonal_problem

__all__ = ["BlindResult", "blind_posterior", "neg_log_evidence"]


class BlindResult(NamedTuple):
    """The grid posterior of a batch of measurements.

    Attributes:
      nll: ``[B, I, J]``, ``-log p(y | i, j)``.
      posterior: ``[B, I, J]``, (B.1).
      operator_index: ``[B]``, the argmax's operator.
      noise_index: ``[B]``, the argmax's noise level.
    """

    nll: jax.Array
    posterior: jax.Array
    operator_index: jax.Array
    noise_index: jax.Array


def neg_log_evidence(energy_fn: EnergyFn, problem: DiagonalProblem):
    """The negative log-evidence (P.2) of each measurement.

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      problem: the :class:`~.problem.DiagonalProblem` of the measurements.

    Returns:
      ``-log p(y | A, sigma_n) = U(z, Sigma) + offset`` ``[B]``.

    References:
      arXiv 2605.15487 (blind inverse problems).
    """
    return energy_fn(problem.z, problem.cov) + problem.nll_offset


def blind_posterior(energy_fn: EnergyFn, y, operators, noise_stds, *, basis: str,
                    sigma_max: float = 20.0, log_prior=None) -> BlindResult:
    """The posterior (B.1) over a grid of operators and noise levels.

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      y: the measurements ``[B, ...]``.
      operators: ``[I, ...]`` candidate diagonals (each broadcastable to one measurement;
        complex transfer functions for ``basis="fourier"``).
      noise_stds: ``[J]`` candidate noise levels (> 0).
      basis: ``"pixel"`` or ``"fourier"``.
      sigma_max: the cap of the missing coefficients' variance.
      log_prior: ``[I, J]`` log prior over the grid (flat if None).

    Returns:
      A :class:`BlindResult`.

    References:
      arXiv 2605.15487 (blind inverse problems by Bayes' rule).
    """
    y = jnp.asarray(y)
    ops = jnp.asarray(operators)
    ns = jnp.asarray(noise_stds)
    if y.ndim < 2:
        raise ValueError(f"y: expected a batch [B, ...], got shape {y.shape}")
    if ops.ndim < 1 or ns.ndim != 1:
        raise ValueError(f"operators, noise_stds: expected [I, ...] and [J], got shapes "
                         f"{ops.shape} and {ns.shape}")
    ni, nj = ops.shape[0], ns.shape[0]
    if ni * nj < 2:
        raise ValueError(f"operators, noise_stds: the grid has {ni * nj} point(s); a posterior "
                         f"over the grid needs at least 2")
    if log_prior is not None and jnp.shape(log_prior) != (ni, nj):
        raise ValueError(f"log_prior: expected shape {(ni, nj)}, got {jnp.shape(log_prior)}")
    # validates shapes and noise levels once, outside the loop
    diagonal_problem(y, ops[0], basis=basis, noise_std=ns[0], sigma_max=sigma_max)
    try:
        bad = not bool(jnp.all(ns > 0))
    except jax.errors.ConcretizationTypeError:  # traced (under jit): checked where concrete
        bad = False
    if bad:
        raise ValueError("noise_stds: expected positive noise levels")

    def one(ij):
        i, j = ij // nj, ij % nj
        prob = diagonal_problem(y, ops[i], basis=basis, noise_std=ns[j], sigma_max=sigma_max)
        return neg_log_evidence(energy_fn, prob)

    nll = jax.lax.map(one, jnp.arange(ni * nj)).T.reshape(y.shape[0], ni, nj)
    logp = -nll + (0.0 if log_prior is None else jnp.asarray(log_prior))
    flat = logp.reshape(y.shape[0], -1)
    post = jax.nn.softmax(flat, axis=-1).reshape(nll.shape)
    best = jnp.argmax(flat, axis=-1)
    return BlindResult(nll, post, best // nj, best % nj)
