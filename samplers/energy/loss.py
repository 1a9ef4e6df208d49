"""Anisotropic covariance score matching: whitened DSM plus the covariance-score term.

arXiv 2605.15487, sec. 3 (the training objective; "A-CSM"). For clean ``x``, a covariance
``Sigma`` (diagonal in its basis, variances ``s``) and ``y = x + Sigma^{1/2} eps``, with
``x_hat = y - Sigma grad_y U`` and ``e = F(y - x)`` the noise in the basis, per sample
(``d`` = number of entries)::

    L_dsm = (1/d) || Sigma^{-1/2} (x_hat - x) ||^2 = (1/d) || eps - Sigma^{1/2} grad_y U ||^2 (L.1)
    t     = 1/2 (1/s - |e|^2 / s^2)                     (covariance-score target)           (L.2)
    L_cov = (1/d^2) || s * (dU/ds - t) ||^2 = (1/d^2) || s dU/ds - 1/2 (1 - |e|^2 / s) ||^2 (L.3)
    L     = L_dsm + lambda L_cov                                                           (L.4)

The ``1/d^2`` of (L.3) is the authors' reduction (``compute_metrics`` in their ``main.py``: the
mean over the ``d`` entries, divided by ``d`` once more; ``cov_reduction="authors"``, the
default). ``cov_reduction="mean"`` (ours) averages once, ``(1/d) ||.||^2``: at the same
``lambda`` its covariance term weighs ``d`` times more (784 times on 28 x 28 MNIST), i.e.
``lambda`` under ``"mean"`` equals ``d lambda`` under ``"authors"``.

(L.2) is ``d/ds_k`` of ``-log N(y; x, Sigma)``; its conditional expectation given ``y`` is
``d/ds_k -log p_Sigma(y)``, so (L.3) is minimised by the true noise score as (L.1) is by the true
data score. (L.1) is evaluated in the whitened form ``eps - Sigma^{1/2} grad U``, which stays
finite for tiny variances. Both terms come from one reverse pass through ``U``; the loss is then
differentiated once more with respect to the network's parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers.energy.covariance import Covariance
from jaxlib_ext.samplers.energy.energy import EnergyFn, energy_and_grads

__all__ = ["COV_REDUCTIONS", "acsm_loss", "add_noise", "covariance_score_target"]

#: ``"authors"``: (L.3) with ``1/d^2`` (the authors' code); ``"mean"``: ``1/d`` (ours).
COV_REDUCTIONS = ("authors", "mean")


def _mean_rest(a):
    return jnp.mean(a, axis=tuple(range(1, a.ndim)))


def add_noise(key, x, cov: Covariance):
    """Noisy samples ``y = x + Sigma^{1/2} eps``.

    Args:
      key: a PRNG key.
      x: clean samples ``[B, ...]``.
      cov: ``Sigma``, a :class:`~.covariance.Covariance` of ``x``'s shape.

    Returns:
      ``(y, eps)``, ``eps ~ N(0, I)`` real, both of ``x``'s shape.
    """
    eps = jax.random.normal(key, x.shape, x.dtype)
    return x + cov.apply(eps, 0.5), eps


def covariance_score_target(y, x, cov: Covariance):
    """The covariance-score target (L.2).

    Args:
      y: noisy samples ``[B, ...]``.
      x: their clean samples.
      cov: ``Sigma``, a :class:`~.covariance.Covariance` of ``x``'s shape.

    Returns:
      ``1/2 (1/s - |F(y - x)|^2 / s^2)``, ``cov.diag``'s shape.

    References:
      arXiv 2605.15487, sec. 3.
    """
    e2 = jnp.abs(cov.to_basis(y - x)) ** 2
    return 0.5 * (1.0 / cov.diag - e2 / cov.diag ** 2)


def acsm_loss(energy_fn: EnergyFn, x, cov: Covariance, key, *, cov_weight: float = 1.0,
              cov_reduction: str = "authors"):
    """The A-CSM objective (L.4), averaged over the batch.

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      x: clean samples ``[B, ...]``.
      cov: their covariances, a :class:`~.covariance.Covariance` of ``x``'s shape.
      key: a PRNG key (the noise).
      cov_weight: ``lambda`` >= 0 (0 gives plain whitened DSM, which leaves ``U``'s
        dependence on ``Sigma`` unconstrained).
      cov_reduction: ``"authors"`` (``1/d^2`` in (L.3)) or ``"mean"`` (``1/d``, ours).

    Returns:
      ``(loss, {"dsm": ..., "cov": ...})``; ``"cov"`` is the reduced (L.3) term, before
      ``lambda``.

    References:
      arXiv 2605.15487, sec. 3 (anisotropic covariance score matching).
    """
    if cov_reduction not in COV_REDUCTIONS:
        raise ValueError(f"cov_reduction: expected one of {COV_REDUCTIONS}, got "
                         f"{cov_reduction!r}")
    if isinstance(cov_weight, (int, float)) and cov_weight < 0:
        raise ValueError(f"cov_weight: expected >= 0, got {cov_weight}")
    y, eps = add_noise(key, x, cov)
    _, gy, gs = energy_and_grads(energy_fn, y, cov)
    dsm = _mean_rest((eps - cov.apply(gy, 0.5)) ** 2)                      # (L.1)
    e2_over_s = jnp.abs(cov.to_basis(y - x)) ** 2 / cov.diag
    cov_term = _mean_rest((cov.diag * gs - 0.5 * (1.0 - e2_over_s)) ** 2)  # (L.3), 1/d
    if cov_reduction == "authors":
        cov_term = cov_term / x[0].size                            # (L.3), 1/d^2
    loss = jnp.mean(dsm + cov_weight * cov_term)                          # (L.4)
    return loss, {"dsm": jnp.mean(dsm), "cov": jnp.mean(cov_term)}
