"""Latent DAPS: decoupled annealing posterior sampling in the latent of a latent diffusion model
(Zhang, Chu, Berner, Meng, Anandkumar, Song, arXiv 2407.01521, Algorithm 1 and its latent
form), a base solver with the ``corrector=`` hook of :mod:`.solvers`.

Where latent DPS and PSLD take one guided DDIM step from ``z_{t_i}`` to ``z_{t_{i+1}}``, a DAPS
step goes down to the clean latent and back up: an estimate ``zhat_0`` by a short
probability-flow ODE solve, Langevin dynamics on the clean latent toward the measurement, and
fresh forward noise at the next level, so that consecutive latents are decoupled.

**From their VE parametrisation to this VP schedule.** DAPS is written for the variance
exploding form ``x_t = x_0 + sigma_t eps`` (the authors' code: the EDM scheduler). With (P.1)
``x_t = z_t / sqrt(abar_t)`` is exactly that, with the same clean latent ``x_0 = z_0``, at::

    sigma_t = sqrt((1 - abar_t) / abar_t)                                                (L.1)

With ``abar = abar_{t_i}``, ``sigma = sigma_{t_i}``, ``abar' = abar_{t_{i+1}}`` (``1`` after the
last step) and ``xi ~ N(0, I)``, step ``i`` of ``N`` is:

1. **The ODE estimate** (``ode_steps = K`` network evaluations). ``K`` deterministic DDIM steps
   (``ddim_eta = 0``, (S.1); in ``(sigma, x)`` each is an Euler step of the probability-flow
   ODE, Song, Meng, Ermon, arXiv 2010.02502, sec. 4.3) from ``z_{t_i}`` over the training
   indices ``s_0 = t_i >= s_1 >= ... >= s_{K-1}``, the last landing on the clean latent
   (``abar' = 1``): ``zhat_0 = Phi_K(z_{t_i})``. ``s_k`` (``k >= 1``) is the least noisy index
   with ``sigma_{s_k} >= sigma_k`` on the authors' grid, the polynomial grid of Karras et al.
   (arXiv 2206.00364, eq. 5, ``rho = 7``) from ``sigma`` down to the schedule's smallest
   ``sigma_{0}``::

       sigma_k = ((1 - k / K) sigma^(1/7) + (k / K) sigma_{0}^(1/7))^7,   k = 0, ..., K   (L.2)

   ``K = 1`` is Tweedie's ``zhat_0(z_{t_i}, t_i)`` of (P.3). A repeated index (``t_i < K``)
   is a DDIM step of length zero, the identity.

2. **Langevin on the clean latent** (``langevin_steps = L`` unadjusted steps, no network
   evaluation, one decoder gradient each) from ``u_0 = zhat_0``, targeting ``pi_i(u) propto
   N(u; zhat_0, r_i^2 I) N(y; A D(u), beta_y^2 I)``, DAPS's Gaussian approximation of
   ``p(z_0 | z_{t_i})`` times the likelihood of (P.2)::

       u_{k+1} = u_k + eta_i [(zhat_0 - u_k) / r_i^2
                              - grad_u ||y - A D(u_k)||^2 / (2 beta_y^2)]
                     + sqrt(2 eta_i) xi_k                                                 (L.3)
       r_i     = sigma_{t_i}  (prior_std="sigma"),  sqrt(1 - abar_{t_i})  ("unit_prior")  (L.4)
       eta_i   = step_size (1 - (1 - min_step_ratio) i / (N + 1))                          (L.5)

   ``grad_clip=c`` clips ``grad_u ||y - A D(u)||^2`` elementwise to ``[-c, c]`` in (L.3).

3. **Re-noising** to the next level (after the last step, ``abar' = 1``, the result is
   ``z_0 = u_L``)::

       z_{t_{i+1}} = sqrt(abar') u_L + sqrt(1 - abar') xi                                 (L.6)

   which is ``x_{t_{i+1}} = u_L + sigma_{t_{i+1}} xi`` of the paper in VE form.

**The prior's spread** ``r_i``. DAPS approximates ``p(z_0 | z_t)`` by ``N(zhat_0, r_t^2 I)``;
the authors' code (the Langevin sampler with its ``"gaussian"`` prior term ``(zhat_0 - u) /
sigma^2``) takes ``r_t = sigma_t``, the annealing level itself, and so does ``"sigma"``, the
default: by (L.1) that is the spread of ``z_0`` given ``x_t = z_0 + sigma_t eps`` when the
prior is flat at that scale, an upper bound on the exact ``Cov[z_0 | z_t] = (S^{-1} +
sigma_t^{-2} I)^{-1}`` of a Gaussian prior ``N(m, S)``, and equal to it as ``sigma_t -> 0``.
``"unit_prior"`` (ours) takes ``r_t^2 = sigma_t^2 / (1 + sigma_t^2) = 1 - abar_t``, the exact
conditional variance when the latent prior is ``N(0, I)``, the scale latents are normalised to.
With the exact conditional in place of (L.3) a step would map the posterior's noisy marginal
``p_{t_i}(. | y)`` to ``p_{t_{i+1}}(. | y)``; with these approximations and a finite chain it
does so approximately, the closer the finer the annealing (checked on the linear-Gaussian model
of :mod:`.gaussian`).

**Defaults and their sources.** The update (L.2)-(L.6) and the defaults follow the authors'
code (github.com/zhangbingliang2019/DAPS); of the paper only the abstract could be read here.
Theirs: ``num_steps = 50`` annealing steps and ``ode_steps = 2`` (their latent-model sampler
configuration; pixel space uses 200 and 5); ``langevin_steps = 100``, ``step_size = 1e-4``,
``min_step_ratio = 0.01`` and the linear decay (L.5) with its ``N + 1`` (their pixel-space
Langevin configurations; the step is 5e-5, 2e-5 or 1e-5 on some tasks, and their current
latent configurations use a damped Hamiltonian sampler instead, not offered here);
``noise_std = 0.01 / sqrt(2)``: their likelihood term is ``||y - A x||^2 / tau^2`` with ``tau =
0.01`` on every task (not the true noise level), the likelihood of (P.2) at ``beta_y = tau /
sqrt(2)``; ``prior_std="sigma"``. Ours: the annealing levels (the evenly spaced training
indices of :func:`~jaxlib_ext.models.diffusion.ddim_timesteps`, as for the other solvers,
where the authors anneal ``sigma`` on the polynomial grid of (L.2) from 10 to 0.1 and then 0;
pass any descending indices to :func:`build_latent_daps_kernel`); the index map of (L.2) and
its landing on the clean latent (theirs stops at ``sigma = 0.001``); ``"unit_prior"``;
``grad_clip=None`` (their latent operator clips that gradient at 1, a bound in the units of
their images). The step size is absolute, as theirs: (L.3) is stable for ``eta_i (1 / r_i^2 +
||A J_D||^2 / beta_y^2) < 2`` (``J_D`` the decoder's Jacobian); scale it with ``beta_y^2``.

**Cost.** One solver step costs ``ode_steps`` network evaluations (the first also gives the
residual ``r(z_{t_i}, t_i)`` of (P.5) reported in
:class:`~jaxlib_ext.samplers.mclc.SolverStepInfo`) and ``langevin_steps`` decoder gradients; a
corrector of ``K`` steps adds ``K`` evaluations per solver step but the last: ``nfe = N
ode_steps + K (N - 1)``.

Layout, state and infos are those of :mod:`.solvers` (BlackJAX's): :func:`build_latent_daps_kernel`
returns ``kernel(rng_key, state, problem) -> (state, info)`` over
:class:`~jaxlib_ext.samplers.mclc.solvers.SolverState`, with the corrector after every step but
the last, at level ``t_{i+1}``; :func:`latent_daps_sampler` binds a problem and returns a
:class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`; :func:`latent_daps` runs ``N`` steps from a
key and decodes. Pure: ``jax.jit`` the call (the problem, the corrector, the strings and the
integers static) and ``jax.vmap`` over keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.models.diffusion import ddim_step
from jaxlib_ext.samplers.base import SamplingAlgorithm
from jaxlib_ext.samplers.mclc.problem import LatentInverseProblem, denoise
from jaxlib_ext.samplers.mclc.solvers import (
    SolverResult,
    _algorithm,
    _build_kernel,
    _check_kernel_args,
    _check_position,
    _check_positive,
    _check_problem,
    _run,
)

__all__ = [
    "PRIOR_STDS",
    "build_latent_daps_kernel",
    "latent_daps",
    "latent_daps_sampler",
]

PRIOR_STDS = ("sigma", "unit_prior")
"""The rules (L.4) for ``r_i``: ``"sigma"`` (the authors', default), ``"unit_prior"`` (ours)."""

_RHO = 7.0  # the exponent of the polynomial grid (L.2)
_TAU = 0.01  # the authors' likelihood scale tau, noise_std = tau / sqrt(2)


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name}: expected an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")


def _check_daps(step_size, langevin_steps, ode_steps, noise_std, min_step_ratio, prior_std,
                grad_clip):
    _check_positive("step_size", step_size)
    _check_int("langevin_steps", langevin_steps, 0)
    _check_int("ode_steps", ode_steps, 1)
    _check_positive("noise_std", noise_std)
    _check_positive("min_step_ratio", min_step_ratio)
    if not isinstance(min_step_ratio, jax.core.Tracer) and float(min_step_ratio) > 1:
        raise ValueError(f"min_step_ratio: expected a value in (0, 1], got {min_step_ratio!r}")
    if not isinstance(prior_std, str) or prior_std not in PRIOR_STDS:
        raise ValueError(f"prior_std: expected one of {PRIOR_STDS}, got {prior_std!r}")
    if grad_clip is not None:
        _check_positive("grad_clip", grad_clip)


def _ve_sigma(alpha_bars):
    """(L.1) at every training index: ``(T,)``, non-decreasing."""
    return jnp.sqrt((1.0 - alpha_bars) / alpha_bars)


def _ode_levels(alpha_bars, t, ode_steps: int):
    """The training indices ``s_0 = t >= s_1 >= ... >= s_{K-1}`` of (L.2), int32 ``(K,)``."""
    sig = _ve_sigma(alpha_bars)
    u = jnp.arange(ode_steps, dtype=sig.dtype) / ode_steps
    grid = ((1.0 - u) * sig[t] ** (1.0 / _RHO) + u * sig[0] ** (1.0 / _RHO)) ** _RHO  # (L.2)
    levels = jnp.clip(jnp.searchsorted(sig, grid, side="left"), 0, t).astype(jnp.int32)
    return levels.at[0].set(jnp.asarray(t, jnp.int32))


def _ode_estimate(problem: LatentInverseProblem, z, t, ode_steps: int):
    """``(zhat_0(z, t), Phi_K(z))``: Tweedie's estimate (P.3) of the first evaluation and the
    ODE estimate of step 1 (``ode_steps`` DDIM steps over (L.2)'s levels to the clean latent)."""
    eps, tweedie = denoise(problem, z, t)
    if ode_steps == 1:
        return tweedie, tweedie
    ab = problem.alpha_bars
    levels = _ode_levels(ab, t, ode_steps)
    zero = jnp.zeros_like(z)

    def body(carry, k):
        z, eps, z0 = carry
        s, s_next = levels[k - 1], levels[k]
        z = ddim_step(z0, eps, ab[s], ab[s_next], 0.0, zero)  # (S.1) at ddim_eta = 0
        eps, z0 = denoise(problem, z, s_next)
        return (z, eps, z0), None

    (_, _, z0), _ = jax.lax.scan(body, (z, eps, tweedie), jnp.arange(1, ode_steps))
    return tweedie, z0  # the last DDIM step, to abar' = 1, returns its zhat_0


def build_latent_daps_kernel(timesteps, *, step_size: float = 1e-4, langevin_steps: int = 100,
                             ode_steps: int = 2, noise_std: float = _TAU / math.sqrt(2),
                             min_step_ratio: float = 0.01, prior_std: str = "sigma",
                             grad_clip: float | None = None,
                             corrector: Callable | None = None) -> Callable:
    """One step of Latent DAPS, (L.2)-(L.6), with the corrector after it.

    The kernel ``kernel(rng_key, state, problem) -> (state, info)`` takes the
    :class:`~jaxlib_ext.samplers.mclc.solvers.SolverState` at ``t_i`` (``i = state.step``) to
    ``t_{i+1}``; the last step (``i = N - 1``) returns the Langevin output ``u_L`` (the clean
    latent) and runs no corrector (further steps repeat it).

    Args:
      timesteps: the descending training indices ``t_0 > ... > t_{N-1}`` (a concrete int array,
        e.g. :func:`~jaxlib_ext.models.diffusion.ddim_timesteps`); ``N`` enters (L.5).
      step_size: the Langevin step ``eta`` of (L.5), ``> 0`` (the authors' ``1e-4``).
      langevin_steps: ``L >= 0`` steps (L.3) per solver step (``0``: no measurement guidance).
      ode_steps: ``K >= 1`` network evaluations of the ODE estimate (L.2) (``1``: Tweedie).
      noise_std: ``beta_y > 0`` of the likelihood in (L.3) (the authors' ``tau / sqrt(2)``).
      min_step_ratio: the decay of (L.5), in ``(0, 1]`` (``1``: a constant step).
      prior_std: ``"sigma"`` (the authors') or ``"unit_prior"`` (ours), the rule (L.4).
      grad_clip: ``None`` or ``c > 0``, the elementwise clip of the likelihood gradient.
      corrector: ``None`` or ``corrector(rng_key, z, t, problem) -> (z, info)``, e.g.
        :func:`~jaxlib_ext.samplers.mclc.mclc`.

    Returns:
      ``kernel(rng_key, state, problem) -> (SolverState, SolverStepInfo)``.

    Raises:
      ValueError: ``timesteps`` or a setting out of range, naming it.
      TypeError: ``timesteps`` traced, ``langevin_steps`` or ``ode_steps`` not an int, or
        ``corrector`` not callable.

    References:
      Zhang et al., Improving Diffusion Inverse Problem Solving with Decoupled Noise Annealing,
      arXiv 2407.01521, Algorithm 1; Karras et al., arXiv 2206.00364, eq. 5.
    """
    ts = _check_kernel_args(timesteps, 0.0, corrector)
    _check_daps(step_size, langevin_steps, ode_steps, noise_std, min_step_ratio, prior_std,
                grad_clip)
    n = int(ts.shape[0])
    ts_j = jnp.asarray(ts)
    decay = 1.0 - (1.0 - min_step_ratio) * jnp.arange(n, dtype=jnp.float32) / (n + 1)
    etas = step_size * decay  # (L.5)

    def step(rng_key, problem, z, t, ab, ab_next):
        k_lang, k_noise = jax.random.split(rng_key)
        tweedie, z0hat = _ode_estimate(problem, z, t, ode_steps)  # (L.2)
        y, op, decoder = problem.measurement, problem.operator, problem.decoder
        r = jnp.sqrt(jnp.sum((y - op.apply(decoder(tweedie))) ** 2))  # (P.5)
        r2 = (1.0 - ab) / ab if prior_std == "sigma" else 1.0 - ab  # (L.4), squared
        r2_safe = jnp.where(r2 > 0, r2, 1.0)
        eta = etas[jnp.argmax(ts_j == t)]

        def sq_residual(u):
            return jnp.sum((y - op.apply(decoder(u))) ** 2)

        def langevin(u, key):
            g = jax.grad(sq_residual)(u)
            if grad_clip is not None:
                g = jnp.clip(g, -grad_clip, grad_clip)
            xi = jax.random.normal(key, u.shape, u.dtype)
            drift = (z0hat - u) / r2_safe - g / (2.0 * noise_std ** 2)
            return u + eta * drift + jnp.sqrt(2.0 * eta) * xi, None  # (L.3)

        u = z0hat
        if langevin_steps > 0:
            u, _ = jax.lax.scan(langevin, z0hat, jax.random.split(k_lang, langevin_steps))
            u = jnp.where(r2 > 0, u, z0hat)  # r_i = 0 (abar = 1): the prior pins u
        xi = jax.random.normal(k_noise, u.shape, u.dtype)
        return jnp.sqrt(ab_next) * u + jnp.sqrt(1.0 - ab_next) * xi, r  # (L.6)

    return _build_kernel(ts, step, corrector)


def latent_daps_sampler(problem: LatentInverseProblem, *, num_steps: int = 50,
                        step_size: float = 1e-4, langevin_steps: int = 100, ode_steps: int = 2,
                        noise_std: float = _TAU / math.sqrt(2), min_step_ratio: float = 0.01,
                        prior_std: str = "sigma", grad_clip: float | None = None,
                        corrector: Callable | None = None,
                        t_max: int | None = None) -> SamplingAlgorithm:
    """Latent DAPS, (L.2)-(L.6), on ``problem`` as a sampling algorithm.

    ``init(position)`` starts at ``z_{t_0}``; ``num_steps`` calls of ``step(rng_key, state)``
    end at the clean latent ``z_0`` (decode it with ``problem.decoder``).

    Args:
      problem: the :class:`~jaxlib_ext.samplers.mclc.LatentInverseProblem`.
      num_steps: solver (annealing) steps ``N`` (the authors' 50 for latent models).
      step_size: the Langevin step ``eta`` of (L.5), ``> 0``.
      langevin_steps: ``L >= 0`` Langevin steps (L.3) per solver step.
      ode_steps: ``K >= 1`` network evaluations of the ODE estimate (L.2).
      noise_std: ``beta_y > 0`` of the likelihood in (L.3).
      min_step_ratio: the decay of (L.5), in ``(0, 1]``.
      prior_std: ``"sigma"`` or ``"unit_prior"``, the rule (L.4).
      grad_clip: ``None`` or ``c > 0``, the elementwise clip of the likelihood gradient.
      corrector: ``None`` or ``corrector(rng_key, z, t, problem) -> (z, info)``.
      t_max: the first step's training index (default ``T - 1``; see
        :func:`~jaxlib_ext.models.diffusion.ddim_timesteps`).

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm` over
      :class:`~jaxlib_ext.samplers.mclc.solvers.SolverState` with
      :class:`~jaxlib_ext.samplers.mclc.solvers.SolverStepInfo`.

    Raises:
      TypeError: ``problem`` is not a ``LatentInverseProblem``, ``num_steps``,
        ``langevin_steps`` or ``ode_steps`` not an int, or ``corrector`` not callable.
      ValueError: an argument is out of range (naming it), or ``measurement`` has the wrong
        shape.

    References:
      Zhang et al., arXiv 2407.01521, Algorithm 1.
    """
    ts = _check_problem(problem, num_steps, 0.0, corrector, t_max)
    kernel = build_latent_daps_kernel(
        ts, step_size=step_size, langevin_steps=langevin_steps, ode_steps=ode_steps,
        noise_std=noise_std, min_step_ratio=min_step_ratio, prior_std=prior_std,
        grad_clip=grad_clip, corrector=corrector)
    return _algorithm(problem, kernel)


def latent_daps(rng_key, problem: LatentInverseProblem, *, num_steps: int = 50,
                step_size: float = 1e-4, langevin_steps: int = 100, ode_steps: int = 2,
                noise_std: float = _TAU / math.sqrt(2), min_step_ratio: float = 0.01,
                prior_std: str = "sigma", grad_clip: float | None = None,
                corrector: Callable | None = None, z_init=None,
                t_max: int | None = None) -> SolverResult:
    """Latent DAPS, (L.2)-(L.6), for one chain: ``num_steps`` steps of
    :func:`build_latent_daps_kernel` from ``z_init`` and the decoded result.

    Args:
      rng_key: PRNG key.
      problem: the :class:`~jaxlib_ext.samplers.mclc.LatentInverseProblem`.
      num_steps: solver (annealing) steps ``N`` (the authors' 50 for latent models).
      step_size: the Langevin step ``eta`` of (L.5), ``> 0`` (the authors' ``1e-4``).
      langevin_steps: ``L >= 0`` Langevin steps (L.3) per solver step (the authors' 100).
      ode_steps: ``K >= 1`` network evaluations of the ODE estimate (L.2) (the authors' 2).
      noise_std: ``beta_y > 0`` of the likelihood in (L.3) (the authors' ``tau / sqrt(2)``,
        ``tau = 0.01``; the measurement's noise level for the posterior of (P.2)).
      min_step_ratio: the decay of (L.5), in ``(0, 1]`` (the authors' 0.01).
      prior_std: ``"sigma"`` (the authors') or ``"unit_prior"`` (ours), the rule (L.4).
      grad_clip: ``None`` (ours) or ``c > 0``, the elementwise clip of the likelihood gradient.
      corrector: ``None`` or ``corrector(rng_key, z, t, problem) -> (z, info)``.
      z_init: the starting ``z_{t_0}`` (default ``N(0, I)`` from ``rng_key``).
      t_max: the first step's training index (default ``T - 1``).

    Returns:
      ``SolverResult(z0, x0, info)`` with a :class:`~jaxlib_ext.samplers.mclc.SolverInfo`;
      ``info.nfe = N ode_steps + K (N - 1)`` for a corrector of ``K`` steps.

    Raises:
      TypeError: as :func:`latent_daps_sampler`.
      ValueError: as :func:`latent_daps_sampler`, or ``z_init`` has the wrong shape.

    References:
      Zhang et al., arXiv 2407.01521, Algorithm 1; Song, Meng, Ermon, arXiv 2010.02502.
    """
    ts = _check_problem(problem, num_steps, 0.0, corrector, t_max)
    if z_init is not None:
        _check_position("z_init", z_init, problem)
    kernel = build_latent_daps_kernel(
        ts, step_size=step_size, langevin_steps=langevin_steps, ode_steps=ode_steps,
        noise_std=noise_std, min_step_ratio=min_step_ratio, prior_std=prior_std,
        grad_clip=grad_clip, corrector=corrector)
    return _run(rng_key, problem, kernel, ts, z_init, nfe_per_step=ode_steps)
