"""Anisotropic covariance score matching: whitened DSM plus the covariance-score term.

arXiv 2605.15487, sec. 3 (the training objective; "A-CSM"). For clean ``x``, a covariance
``Sigma`` (diagonal in its basis, variances ``s``) and ``y = x + Sigma^{1/2} eps``, with
``x_hat = y - Sigma grad_y U`` and ``e = F(y - x)`` the noise in the basis, per sample
(``d`` = number of entries)::

    L_dsm = (1/d) || Sigma^{-1/2} (x_hat - x) ||^2 = (1/d) || eps - Sigma^{1/2} grad_y U ||^2 (L.1)
    t     = 1/2 (1/s - |e|^2 / s^2)                     (covariance-score target)           (L.2)
    L_cov = (1/d) || s * (dU/ds - t) ||^2 = (1/d) || s dU/ds - 1/2 (1 - |e|^2 / s) ||^2     (L.3)
    L     = L_dsm + lambda L_cov                                                           (L.4)

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

__all__ = ["acsm_loss", "add_noise", "covariance_score_target"]


def _mean_rest(a):
    return jnp.mean(a, axis=tuple(range(1, a.ndim)))


def add_noise(key, x, cov: Covariance):
    """``(y, eps)`` with ``y = x + Sigma^{1/2} eps``, ``eps ~ N(0, I)`` real, shape of ``x``."""
    eps = jax.random.normal(key, x.shape, x.dtype)
    return x + cov.apply(eps, 0.5), eps


def covariance_score_target(y, x, cov: Covariance):
    """(L.2): ``1/2 (1/s - |F(y - x)|^2 / s^2)``, shape of ``cov.diag``."""
    e2 = jnp.abs(cov.to_basis(y - x)) ** 2
    return 0.5 * (1.0 / cov.diag - e2 / cov.diag ** 2)


def acsm_loss(energy_fn: EnergyFn, x, cov: Covariance, key, *, cov_weight: float = 1.0):
    """(L.4) averaged over the batch; returns ``(loss, {"dsm": ..., "cov": ...})``.

    ``x``: clean samples ``[B, ...]``; ``cov``: their covariances; ``cov_weight`` = lambda
    (0 gives plain whitened DSM, which leaves ``U``'s dependence on ``Sigma`` unconstrained)."""
    y, eps = add_noise(key, x, cov)
    _, gy, gs = energy_and_grads(energy_fn, y, cov)
    dsm = _mean_rest((eps - cov.apply(gy, 0.5)) ** 2)                      # (L.1)
    e2_over_s = jnp.abs(cov.to_basis(y - x)) ** 2 / cov.diag
    cov_term = _mean_rest((cov.diag * gs - 0.5 * (1.0 - e2_over_s)) ** 2)  # (L.3)
    loss = jnp.mean(dsm + cov_weight * cov_term)                          # (L.4)
    return loss, {"dsm": jnp.mean(dsm), "cov": jnp.mean(cov_term)}
