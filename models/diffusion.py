"""Variance-preserving (VP) diffusion: the schedules, Tweedie's estimate, the DDIM and ancestral
steps, and the DDIM timesteps.

The forward process (Ho et al., arXiv 2006.11239, Eq. 4) noises a clean ``z_0`` to step
``t = 0, ..., T - 1`` of a schedule of betas::

    z_t = sqrt(abar_t) z_0 + sqrt(1 - abar_t) eps,   eps ~ N(0, I),
    abar_t = prod_{s <= t} (1 - beta_s)                                             (D.1)

(``abar_0 = 1 - beta_0`` is one step of noise, not the clean latent). Given a noise prediction
``eps`` at ``(z_t, t)``, Tweedie's formula solves (D.1) for the clean estimate::

    zhat_0 = (z_t - sqrt(1 - abar_t) eps) / sqrt(abar_t)                            (D.2)

DDIM (Song, Meng, Ermon, arXiv 2010.02502, Eq. 12 with ``sigma`` of Eq. 16) goes from
``abar = abar_t`` to a less noisy ``abar' = abar_{t'}`` (``abar' = 1``: the clean latent)::

    sigma = eta sqrt((1 - abar') / (1 - abar)) sqrt(1 - abar / abar')
    z_t'  = sqrt(abar') zhat_0 + sqrt(1 - abar' - sigma^2) eps + sigma xi,   xi ~ N(0, I)  (D.3)

``eta = 0`` is deterministic DDIM; ``eta = 1`` over consecutive steps is the ancestral step
(Ho et al., Eq. 11). These functions are pure array maps: ``alpha_bar`` arguments broadcast
against the latents (a scalar, or ``[B, 1, 1, 1]`` for one step per image), so they serve a
batched sampler indexed by a :class:`Schedule` (:func:`alpha_bar` looks the values up) and a
single-chain solver holding only an ``alpha_bars`` array alike.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "SCHEDULES",
    "Schedule",
    "alpha_bar",
    "ancestral_step",
    "clip_eps",
    "ddim_step",
    "ddim_timesteps",
    "linear_schedule",
    "make_schedule",
    "predict_z0",
    "q_sample",
]

SCHEDULES = ("cosine", "linear")


class Schedule(NamedTuple):
    """Variance-preserving schedule, each ``float32 [T]``, indexed by ``t = 0, ..., T - 1``.

    Attributes:
      betas: the per-step noise variances.
      alphas: ``1 - betas``.
      alphas_cumprod: ``alphas_cumprod[t] = prod_{s <= t} alphas[s]`` (alpha-bar of (D.1)).
    """

    betas: jax.Array
    alphas: jax.Array
    alphas_cumprod: jax.Array


def _schedule_of_betas(betas: np.ndarray) -> Schedule:
    alphas = 1.0 - betas
    return Schedule(*(jnp.asarray(a, jnp.float32) for a in (betas, alphas, np.cumprod(alphas))))


def linear_schedule(timesteps: int = 1000, beta_min: float = 1e-4,
                    beta_max: float = 2e-2) -> Schedule:
    """Betas linear from ``beta_min`` to ``beta_max`` over ``timesteps`` steps, computed in
    float64 and stored as float32.

    With the defaults and ``T = 1000`` this is Ho et al.'s schedule, which is also
    ``make_schedule(1000, "linear")``; for other ``T`` :func:`make_schedule` scales both ends by
    ``1000 / T``, this function does not.

    Args:
      timesteps: the number of steps ``T``, an int ``>= 1``.
      beta_min: the first beta.
      beta_max: the last beta, ``0 < beta_min <= beta_max < 1``.

    Returns:
      The :class:`Schedule`.

    Raises:
      ValueError: if ``timesteps`` is not an int ``>= 1`` or the betas are out of range.

    References:
      Ho, Jain, Abbeel, Denoising Diffusion Probabilistic Models, arXiv 2006.11239, Sec. 4.
    """
    if isinstance(timesteps, bool) or not isinstance(timesteps, int | np.integer) or (
            timesteps < 1):
        raise ValueError(f"timesteps: expected an int >= 1, got {timesteps!r}")
    if not 0 < beta_min <= beta_max < 1:
        raise ValueError(f"beta_min, beta_max: expected 0 < beta_min <= beta_max < 1, got "
                         f"{beta_min}, {beta_max}")
    return _schedule_of_betas(np.linspace(beta_min, beta_max, timesteps, dtype=np.float64))


def make_schedule(timesteps: int = 1000, kind: str = "cosine") -> Schedule:
    """The ``"cosine"`` (arXiv 2102.09672, Eq. 17) or ``"linear"`` (arXiv 2006.11239, Sec. 4)
    schedule, computed in float64 and stored as float32.

    Args:
      timesteps: the number of steps ``T``, an int ``>= 2``.
      kind: ``"cosine"`` (``s = 0.008``, betas clipped at 0.999) or ``"linear"``
        (:func:`linear_schedule` from ``1e-4`` to ``0.02``, both scaled by ``1000 / T`` as in
        Nichol & Dhariwal's code, so that the total noise does not depend on ``T``; needs
        ``T > 20``).

    Returns:
      The :class:`Schedule`.

    Raises:
      ValueError: if ``timesteps`` is not an int ``>= 2`` (``> 20`` for ``"linear"``) or
        ``kind`` is unknown.

    References:
      Nichol & Dhariwal, Improved Denoising Diffusion Probabilistic Models, arXiv 2102.09672.

      Ho et al., Denoising Diffusion Probabilistic Models, arXiv 2006.11239.
    """
    if isinstance(timesteps, bool) or not isinstance(timesteps, int) or timesteps < 2:
        raise ValueError(f"timesteps: expected an int >= 2, got {timesteps!r}")
    if kind == "cosine":
        s = 0.008
        u = np.arange(timesteps + 1, dtype=np.float64) / timesteps
        f = np.cos((u + s) / (1 + s) * np.pi / 2) ** 2
        return _schedule_of_betas(np.clip(1.0 - f[1:] / f[:-1], 0.0, 0.999))  # Eq. 17, clipped
    if kind == "linear":
        scale = 1000.0 / timesteps
        if 0.02 * scale >= 1.0:
            raise ValueError(f"timesteps: the linear schedule needs timesteps > 20 (its last beta, "
                             f"0.02 * 1000 / timesteps, must stay below 1), got {timesteps}")
        return linear_schedule(timesteps, 1e-4 * scale, 0.02 * scale)
    raise ValueError(f"kind: expected one of {SCHEDULES}, got {kind!r}")


def alpha_bar(schedule: Schedule, t) -> jax.Array:
    """``abar_t`` of (D.1) at integer steps.

    Args:
      schedule: the :class:`Schedule`.
      t: integer steps of any shape, in ``[-1, T - 1]``; ``-1`` is the clean latent.

    Returns:
      ``abar_t``, ``t``'s shape (``1`` where ``t = -1``).
    """
    t = jnp.asarray(t)
    return jnp.where(t >= 0, schedule.alphas_cumprod[jnp.maximum(t, 0)], 1.0)


def predict_z0(z: jax.Array, eps: jax.Array, alpha_bar) -> jax.Array:
    """Tweedie's clean estimate (D.2), ``(z_t - sqrt(1 - abar_t) eps) / sqrt(abar_t)``.

    Args:
      z: the noisy latents ``z_t``.
      eps: the noise (prediction) at ``(z, t)``, ``z``'s shape.
      alpha_bar: ``abar_t`` in ``(0, 1]``, broadcasting against ``z``.

    Returns:
      The clean-latent estimate, ``z``'s shape.

    References:
      Ho et al., arXiv 2006.11239, Eq. 4 solved for ``z_0``.
    """
    return (z - jnp.sqrt(1.0 - alpha_bar) * eps) / jnp.sqrt(alpha_bar)


def q_sample(z0: jax.Array, eps: jax.Array, alpha_bar) -> jax.Array:
    """The forward process (D.1), ``z_t = sqrt(abar_t) z_0 + sqrt(1 - abar_t) eps``.

    Args:
      z0: clean latents.
      eps: the noise, ``z0``'s shape.
      alpha_bar: ``abar_t``, broadcasting against ``z0``.

    Returns:
      ``z_t``, ``z0``'s shape.

    References:
      Ho et al., arXiv 2006.11239, Eq. 4.
    """
    return jnp.sqrt(alpha_bar) * z0 + jnp.sqrt(1.0 - alpha_bar) * eps


def clip_eps(z: jax.Array, eps: jax.Array, alpha_bar, clip_z0: float | None) -> jax.Array:
    """``eps`` re-derived from Tweedie's estimate (D.2) clipped to ``[-clip_z0, clip_z0]``
    (unchanged when ``clip_z0`` is ``None``).

    Pixel-space samplers clip ``x0`` to the data range (Ho et al., arXiv 2006.11239, and DDIM's
    reference code); unit-variance latents are bounded by a few units instead. It matters at
    the first steps of the cosine schedule, whose last ``alpha-bar`` (about ``2e-9`` for
    ``T = 1000``, from the clipping at 0.999 of Eq. 17 of arXiv 2102.09672) makes Tweedie's
    estimate divide the noise model's error by ``sqrt(alpha-bar)``.

    Args:
      z: latents ``z_t``.
      eps: the noise prediction at ``(z, t)``, ``z``'s shape.
      alpha_bar: ``abar_t`` in ``(0, 1)``, broadcasting against ``z``.
      clip_z0: the bound on Tweedie's estimate, or ``None`` for no clipping.

    Returns:
      The re-derived ``eps``, ``z``'s shape.
    """
    if clip_z0 is None:
        return eps
    z0 = jnp.clip(predict_z0(z, eps, alpha_bar), -clip_z0, clip_z0)
    return (z - jnp.sqrt(alpha_bar) * z0) / jnp.sqrt(1.0 - alpha_bar)


def ddim_step(z0_hat: jax.Array, eps: jax.Array, alpha_bar, alpha_bar_prev, eta,
              noise: jax.Array) -> jax.Array:
    """One DDIM step (D.3) from ``(zhat_0, eps)`` at level ``abar`` to the level ``abar'``.

    ``sigma`` is Eq. 16 as a product of two square roots, the second of ``max(1 - abar / abar',
    0)``: the same value as ``sqrt`` of the whole product up to float32 round-off (relative
    ``1e-7``), and ``0`` rather than NaN where round-off puts ``abar`` a hair above ``abar'``.
    At ``abar' = 1`` (the clean latent) the step returns ``zhat_0``.

    Args:
      z0_hat: Tweedie's estimate (D.2) at the current level (:func:`predict_z0`).
      eps: the noise prediction at the current level, ``z0_hat``'s shape.
      alpha_bar: ``abar`` of the current level, broadcasting against ``eps``.
      alpha_bar_prev: ``abar'`` of the next (less noisy) level, ``>= alpha_bar``; ``1`` after
        the last step.
      eta: in ``[0, 1]``, ``0`` deterministic DDIM, ``1`` ancestral.
      noise: the standard normal ``xi``, ``eps``'s shape (multiplied by ``sigma = 0`` when
        ``eta = 0``).

    Returns:
      The latents at the next level, ``eps``'s shape.

    References:
      Song, Meng, Ermon, Denoising Diffusion Implicit Models, arXiv 2010.02502, Eqs. 12, 16.
    """
    sigma = eta * jnp.sqrt((1.0 - alpha_bar_prev) / (1.0 - alpha_bar)) * jnp.sqrt(
        jnp.maximum(1.0 - alpha_bar / alpha_bar_prev, 0.0))
    direction = jnp.sqrt(jnp.maximum(1.0 - alpha_bar_prev - sigma ** 2, 0.0))
    return jnp.sqrt(alpha_bar_prev) * z0_hat + direction * eps + sigma * noise


def ancestral_step(schedule: Schedule, z: jax.Array, eps: jax.Array, t,
                   noise: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One ancestral step ``z_t -> z_{t-1}`` (arXiv 2006.11239, Eq. 11).

    The variance is ``beta-tilde_t = (1 - abar_{t-1}) / (1 - abar_t) beta_t`` (Eq. 7); there
    is no noise at ``t = 0``.

    Args:
      schedule: the :class:`Schedule`.
      z: ``[B, ...]`` latents ``z_t``.
      eps: the noise prediction at ``(z, t)``, ``z``'s shape.
      t: integer steps ``[B]`` or a scalar, in ``[0, T - 1]``.
      noise: standard normal noise, ``z``'s shape.

    Returns:
      ``(z_prev, mean)``, each ``z``'s shape.

    References:
      Ho et al., Denoising Diffusion Probabilistic Models, arXiv 2006.11239.
    """
    t = jnp.broadcast_to(t, z.shape[:1])
    per_sample = (-1,) + (1,) * (z.ndim - 1)
    beta = schedule.betas[t].reshape(per_sample)
    alpha = schedule.alphas[t].reshape(per_sample)
    a_t = alpha_bar(schedule, t).reshape(per_sample)
    a_p = alpha_bar(schedule, t - 1).reshape(per_sample)
    mean = (z - beta / jnp.sqrt(1.0 - a_t) * eps) / jnp.sqrt(alpha)
    var = (1.0 - a_p) / (1.0 - a_t) * beta
    return mean + jnp.sqrt(var) * noise, mean


def ddim_timesteps(num_train_steps: int, num_steps: int, t_max: int | None = None) -> np.ndarray:
    """``num_steps`` distinct training indices from ``t_max`` down to ``0``, evenly spaced:
    ``round(linspace(t_max, 0, num_steps))``.

    The first index is ``t_max`` for every ``num_steps``, one included, since a sampler
    starts from ``z ~ N(0, I)``, the law at the noisiest level. Rounding the ascending
    ``linspace(0, t_max, num_steps)`` and reversing it (``timestep_spacing="linspace"`` of
    diffusers) gives ``[0]`` for one step, and differs from this at some exact half-integer
    spacings, where float round-off of the two ``linspace`` directions falls on either side of
    the tie; the descending form is the closer to exact rational rounding there.

    A schedule whose last ``abar`` is close to 0 (the cosine schedule's is about 2e-9) makes
    Tweedie's estimate (D.2), and any gradient through it, blow up at ``T - 1``; start lower
    there.

    Args:
      num_train_steps: ``T``, the length of the training schedule.
      num_steps: the number of indices, an int in ``[1, t_max + 1]``.
      t_max: the first index (default ``T - 1``), an int in ``[0, T - 1]``.

    Returns:
      ``(num_steps,)`` int32 NumPy array, descending.

    Raises:
      ValueError: ``t_max`` or ``num_steps`` out of range.

    References:
      Song, Meng, Ermon, arXiv 2010.02502, Sec. 4.2 (the sub-sequences of accelerated
      sampling).
    """
    if t_max is None:
        t_max = num_train_steps - 1
    if isinstance(t_max, bool) or not isinstance(t_max, int | np.integer) or not (
            0 <= t_max < num_train_steps):
        raise ValueError(f"t_max: expected an int in [0, {num_train_steps - 1}], got {t_max!r}")
    if isinstance(num_steps, bool) or not isinstance(num_steps, int | np.integer) or not (
            1 <= num_steps <= t_max + 1):
        raise ValueError(f"num_steps: expected an int in [1, {t_max + 1}] (t_max + 1), got "
                         f"{num_steps!r}")
    return np.round(np.linspace(t_max, 0, num_steps)).astype(np.int32)
