"""Importance log-weights of an SMC particle system: normalisation, ESS and the incremental
weights of the two SOSMC variants (arXiv 2601.22003).

Notation (local numbering; the paper's own equation numbers could not be checked here, so the
labels below are this package's). ``pi_theta(x) ∝ exp(-U_theta(x))``, particles ``X_1..X_N``
with log-weights ``log w_i`` (stored normalised, ``logsumexp(log w) = 0``)::

    W_i = exp(log w_i) / sum_j exp(log w_j)                                              (W.1)
    ESS = 1 / sum_i W_i^2            in [1, N]                                           (W.2)

Invariant variant (the move after the reweighting leaves ``pi_{theta_{k+1}}`` invariant)::

    log w_i += U_{theta_k}(X_i) - U_{theta_{k+1}}(X_i)                                   (W.3)

ULA variant (forward kernel ``M_k`` = one ULA step at ``theta_k``, backward kernel ``L_{k+1}`` =
one ULA step at ``theta_{k+1}`` read backwards), with ``X'`` the moved particle::

    log w_i += log[pi_{k+1}(X') L_{k+1}(X' -> X)] - log[pi_k(X) M_k(X -> X')]
             = a_k(X, X') - a_{k+1}(X', X)                                               (W.4)
    a_j(u, v) = U_{theta_j}(u) + 1/2 <v - u, grad U_{theta_j}(u)> + h/4 ||grad U_{theta_j}(u)||^2

(the Gaussian quadratic terms ``||v - u||^2 / 4h`` of both kernels cancel).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

__all__ = [
    "check_log_weights",
    "ess",
    "invariant_log_increment",
    "normalize",
    "ula_log_increment",
    "weights",
]


def concrete_values(x) -> np.ndarray | None:
    """``x`` as a NumPy array when its values are known, ``None`` for a tracer.

    Values are known for an array, or a constant closed over by a ``jit``-ed function. The checks
    then run in NumPy: a ``jnp`` operation inside a trace returns a tracer even on constants,
    which ``bool()`` rejects.

    Args:
      x: an array, a constant or a tracer.

    Returns:
      ``np.asarray(x)``, or ``None`` when ``x`` is a tracer.
    """
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


def check_log_weights(log_weights, name: str = "log_weights", min_size: int = 2) -> jax.Array:
    """Validates a 1-D array of log-weights and returns it as a float array.

    Rules: a 1-D float array with at least ``min_size`` entries; no NaN, no ``+inf``; ``-inf``
    (zero weight) is allowed but not for every entry. The value checks run whenever the values
    are known, constants closed over by a ``jit``-ed function included; on traced arguments
    (under ``jit``/``vmap``) only the shape check runs.

    Args:
      log_weights: the array to check.
      name: argument name used in the error messages.
      min_size: least number of entries (2 for a particle system; 1 for a one-chain baseline).

    Returns:
      ``log_weights`` as a ``jax.Array``.

    Raises:
      ValueError: naming ``name``, on a bad shape or bad known values.
      TypeError: naming ``name``, if the array is not a float array.
    """
    lw = jnp.asarray(log_weights)
    if not jnp.issubdtype(lw.dtype, jnp.floating):
        raise TypeError(f"{name}: expected a float array, got dtype {lw.dtype}")
    if lw.ndim != 1 or lw.shape[0] < min_size:
        raise ValueError(f"{name}: expected shape (N,) with N >= {min_size}, got {lw.shape}")
    values = concrete_values(lw)
    if values is not None:
        if np.any(np.isnan(values)) or np.any(values == np.inf):
            raise ValueError(f"{name}: non-finite entries (NaN or +inf) in the log-weights")
        if np.all(values == -np.inf):
            raise ValueError(f"{name}: every log-weight is -inf (all weights zero)")
    return lw


def normalize(log_weights) -> jax.Array:
    """``log w - logsumexp(log w)``: the log of (W.1).

    Args:
      log_weights: ``(N,)`` float log-weights, ``N >= 2``; no NaN or ``+inf``, not all ``-inf``.

    Returns:
      The ``(N,)`` normalised log-weights.

    Raises:
      ValueError: if ``log_weights`` has a bad shape or (when known) bad values.
      TypeError: if ``log_weights`` is not a float array.
    """
    lw = check_log_weights(log_weights)
    return lw - jax.nn.logsumexp(lw)


def weights(log_weights) -> jax.Array:
    """Normalised weights ``W`` (W.1), shape ``(N,)``, summing to one.

    Args:
      log_weights: ``(N,)`` float log-weights, ``N >= 2``; no NaN or ``+inf``, not all ``-inf``.

    Returns:
      The ``(N,)`` weights ``softmax(log_weights)``.

    Raises:
      ValueError: if ``log_weights`` has a bad shape or (when known) bad values.
      TypeError: if ``log_weights`` is not a float array.
    """
    return jax.nn.softmax(check_log_weights(log_weights))


def ess(log_weights) -> jax.Array:
    """Effective sample size (W.2), ``1 / sum W_i^2``, computed in log space.

    ``exp(2 logsumexp(lw) - logsumexp(2 lw))``.

    Args:
      log_weights: ``(N,)`` float log-weights, ``N >= 2``; no NaN or ``+inf``, not all ``-inf``.

    Returns:
      The scalar ESS, in ``[1, N]``.

    Raises:
      ValueError: if ``log_weights`` has a bad shape or (when known) bad values.
      TypeError: if ``log_weights`` is not a float array.
    """
    lw = check_log_weights(log_weights)
    return jnp.exp(2.0 * jax.nn.logsumexp(lw) - jax.nn.logsumexp(2.0 * lw))


def invariant_log_increment(potential: Callable, params_old, params_new, particles) -> jax.Array:
    """(W.3) for every particle: ``U_{theta_k}(X_i) - U_{theta_{k+1}}(X_i)``, shape ``(N,)``.

    Exactly zero when ``params_new`` equals ``params_old`` (the same program on the same
    inputs), which keeps the weights exactly uniform for frozen parameters.

    Args:
      potential: ``U(params, x)`` for one particle (a scalar).
      params_old: ``theta_k``.
      params_new: ``theta_{k+1}``.
      particles: pytree of the ``X_i``, leading axis ``N``.

    Returns:
      The ``(N,)`` log-weight increments.
    """
    u = jax.vmap(potential, in_axes=(None, 0))
    return u(params_old, particles) - u(params_new, particles)


def _a(potential, params, u, v, step_size):
    """``a_j(u, v)`` of (W.4) for one particle (pytrees ``u``, ``v``)."""
    value, grad = jax.value_and_grad(potential, argnums=1)(params, u)
    g, _ = ravel_pytree(grad)
    du = ravel_pytree(v)[0] - ravel_pytree(u)[0]
    return value + 0.5 * jnp.dot(du, g) + 0.25 * step_size * jnp.dot(g, g)


def ula_log_increment(potential: Callable, params_old, params_new, particles, moved,
                      step_size) -> jax.Array:
    """(W.4) for every particle: ``a_k(X, X') - a_{k+1}(X', X)``, shape ``(N,)``.

    With ``params_new == params_old`` this is the log of the ratio that corrects ULA's bias: the
    weighted particles still target ``pi_theta`` exactly.

    Args:
      potential: ``U(params, x)`` for one particle (a scalar, differentiable in ``x``).
      params_old: ``theta_k``, the parameters of the ULA move.
      params_new: ``theta_{k+1}``.
      particles: pytree of the ``X`` before the ULA move, leading axis ``N``.
      moved: pytree of the ``X'`` after the move, same structure.
      step_size: the ULA step size.

    Returns:
      The ``(N,)`` log-weight increments.
    """
    def one(x, xp):
        return (_a(potential, params_old, x, xp, step_size)
                - _a(potential, params_new, xp, x, step_size))

    return jax.vmap(one)(particles, moved)
