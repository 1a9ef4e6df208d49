"""Resampling schemes: ancestor indices drawn from normalised weights.

Each scheme ``scheme(key, weights, num_samples) -> indices`` (int32, shape ``(num_samples,)``)
is unbiased: the number of copies ``C_i`` of particle ``i`` has ``E[C_i] = M W_i`` with
``M = num_samples``. With the cumulative sums ``c_i = W_1 + ... + W_i``:

* **multinomial**: ``M`` i.i.d. draws from ``Categorical(W)`` (here by inverting ``c`` at ``M``
  sorted uniforms, the same law);
* **stratified**: one uniform in each stratum, ``u_m = (m + U_m) / M``, ``U_m ~ U[0, 1)`` i.i.d.;
* **systematic**: one shared offset, ``u_m = (m + U) / M``.

Stratified and systematic have lower variance than multinomial (Douc, Cappé & Moulines 2005).
Multinomial is the SOSMC authors' scheme (arXiv 2601.22003) and the default of :func:`resample`
and :func:`~.sosmc.sosmc`; systematic is our option.
Indices are ``searchsorted(c, u, side="right")``, clipped to ``N - 1`` against round-off in
``c_N``. :func:`resample` applies a scheme to a particle pytree and resets the log-weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.samplers.smc.weights import check_log_weights, concrete_values

__all__ = ["SCHEMES", "multinomial", "resample", "stratified", "systematic"]


def _check(weights, num_samples):
    w = jnp.asarray(weights)
    if w.ndim != 1 or w.shape[0] < 1:
        raise ValueError(f"weights: expected shape (N,), got {w.shape}")
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise TypeError(f"weights: expected a float array, got dtype {w.dtype}")
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples: expected a positive int, got {num_samples!r}")
    values = concrete_values(w)  # known values (closed-over constants too) are checked
    if values is not None:
        if np.any(~np.isfinite(values)) or np.any(values < 0):
            raise ValueError("weights: must be finite and non-negative")
        total = float(values.sum(dtype=np.float64))
        if not abs(total - 1.0) < 1e-3:
            raise ValueError(f"weights: must sum to 1, got {total}")
    return w


def _invert(w, u):
    c = jnp.cumsum(w)
    idx = jnp.searchsorted(c, u * c[-1], side="right")
    return jnp.clip(idx, 0, w.shape[0] - 1).astype(jnp.int32)


def multinomial(key, weights, num_samples: int) -> jax.Array:
    """``num_samples`` i.i.d. ancestors from ``Categorical(weights)``.

    Args:
      key: PRNG key.
      weights: ``(N,)`` float normalised weights (non-negative, summing to 1).
      num_samples: ``M``, the number of ancestors drawn, a positive int.

    Returns:
      The ``int32[M]`` ancestor indices, non-decreasing.

    Raises:
      ValueError: if ``weights`` is not of shape ``(N,)``, ``num_samples`` is not a positive int,
        or known weights are negative, non-finite or do not sum to 1 (within ``1e-3``).
      TypeError: if ``weights`` is not a float array.
    """
    w = _check(weights, num_samples)
    u = jnp.sort(jax.random.uniform(key, (num_samples,), dtype=w.dtype))
    return _invert(w, u)


def stratified(key, weights, num_samples: int) -> jax.Array:
    """Stratified resampling: one uniform per stratum ``[m/M, (m+1)/M)``.

    Args:
      key: PRNG key.
      weights: ``(N,)`` float normalised weights (non-negative, summing to 1).
      num_samples: ``M``, the number of ancestors drawn, a positive int.

    Returns:
      The ``int32[M]`` ancestor indices, non-decreasing.

    Raises:
      ValueError: if ``weights`` is not of shape ``(N,)``, ``num_samples`` is not a positive int,
        or known weights are negative, non-finite or do not sum to 1 (within ``1e-3``).
      TypeError: if ``weights`` is not a float array.
    """
    w = _check(weights, num_samples)
    u = (jnp.arange(num_samples, dtype=w.dtype)
         + jax.random.uniform(key, (num_samples,), dtype=w.dtype)) / num_samples
    return _invert(w, u)


def systematic(key, weights, num_samples: int) -> jax.Array:
    """Systematic resampling: one uniform offset shared by all strata.

    Args:
      key: PRNG key.
      weights: ``(N,)`` float normalised weights (non-negative, summing to 1).
      num_samples: ``M``, the number of ancestors drawn, a positive int.

    Returns:
      The ``int32[M]`` ancestor indices, non-decreasing.

    Raises:
      ValueError: if ``weights`` is not of shape ``(N,)``, ``num_samples`` is not a positive int,
        or known weights are negative, non-finite or do not sum to 1 (within ``1e-3``).
      TypeError: if ``weights`` is not a float array.
    """
    w = _check(weights, num_samples)
    u = (jnp.arange(num_samples, dtype=w.dtype)
         + jax.random.uniform(key, (), dtype=w.dtype)) / num_samples
    return _invert(w, u)


SCHEMES = {"multinomial": multinomial, "stratified": stratified, "systematic": systematic}


def resample(key, particles, log_weights, scheme: str = "multinomial"):
    """Resamples a particle pytree (leading axis ``N``) by its log-weights.

    Args:
      key: PRNG key.
      particles: pytree whose leaves have a leading axis ``N``.
      log_weights: ``(N,)`` float log-weights, ``N >= 2`` (see ``check_log_weights``).
      scheme: one of ``"multinomial"``, ``"stratified"``, ``"systematic"``.

    Returns:
      ``(particles, log_weights, indices)``: the resampled pytree, the new log-weights uniform
      (``-log N``, normalised) and the ``int32[N]`` ancestors.

    Raises:
      ValueError: for an unknown ``scheme`` or invalid ``log_weights``.
      TypeError: if ``log_weights`` is not a float array.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: expected one of {sorted(SCHEMES)}, got {scheme!r}")
    lw = check_log_weights(log_weights)
    n = lw.shape[0]
    idx = SCHEMES[scheme](key, jax.nn.softmax(lw), n)
    new = jax.tree.map(lambda a: jnp.take(a, idx, axis=0), particles)
    return new, jnp.full_like(lw, -jnp.log(n)), idx
