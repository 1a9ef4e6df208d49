"""Latent-diffusion solvers for linear inverse problems, with a pluggable corrector.

Both solvers run a DDIM reverse diffusion (Song, Meng, Ermon, arXiv 2010.02502, eq. 12;
:func:`~jaxlib_ext.models.diffusion.ddim_step`) over a descending subsequence
``t_0 > t_1 > ... > t_{N-1}`` of the training indices
(:func:`~jaxlib_ext.models.diffusion.ddim_timesteps`) and add a measurement-guidance step.
With ``zhat_0`` and ``eps`` of (P.3) at ``(z_{t_i}, t_i)``, ``abar = abar_{t_i}``,
``abar' = abar_{t_{i+1}}`` (``1`` after the last step)::

    sigma_i = ddim_eta sqrt((1 - abar') / (1 - abar)) sqrt(1 - abar / abar')
    z'      = sqrt(abar') zhat_0 + sqrt(1 - abar' - sigma_i^2) eps + sigma_i xi          (S.1)

* :func:`latent_dps`: diffusion posterior sampling (Chung et al., arXiv 2209.14687,
  Algorithm 1) in the latent::

      z_{t_{i+1}} = z' - step_size grad_{z_{t_i}} ||y - A D(zhat_0)||                   (S.2)

* :func:`psld`: posterior sampling with latent diffusion (Rout et al., arXiv 2307.00619,
  Algorithm 2), DPS plus the "gluing" term that asks ``zhat_0`` to be a fixed point of
  decode -> replace the measured part by ``A^T y`` -> encode::

      z_{t_{i+1}} = z' - step_size grad ||y - A D(zhat_0)||
                       - gluing_weight grad ||zhat_0 - E(A^T y + (I - A^T A) D(zhat_0))||  (S.3)

  Both terms use norms (not squared norms) as the authors' implementations do; the weights
  absorb the difference.

``corrector`` (e.g. :func:`~jaxlib_ext.samplers.mclc.mclc`) runs after every step but the last,
on ``z_{t_{i+1}}`` at level ``t_{i+1}``: ``corrector(rng_key, z, t, problem) -> (z, info)``. One
solver step costs one network evaluation; a corrector of ``K`` steps adds ``K`` per solver step
but the last, so ``nfe = N + K (N - 1)``; compare solvers at equal ``nfe`` by giving the
uncorrected one more steps.

Layout (BlackJAX's, :mod:`jaxlib_ext.samplers.base`): :func:`init` makes a :class:`SolverState`
(the latent and the index ``i`` of the next step), :func:`build_latent_dps_kernel` and
:func:`build_psld_kernel` return ``kernel(rng_key, state, problem) -> (state, info)``, one DDIM
step (S.1) with its guidance and the corrector after it, with a :class:`SolverStepInfo`;
:func:`latent_dps_sampler` and :func:`psld_sampler` bind a problem and return a
:class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`; :func:`latent_dps` and :func:`psld` run
``N`` steps from a key and decode. Everything is pure: ``jax.jit`` the call (the problem, the
corrector and the integers are static) and ``jax.vmap`` over keys for independent chains.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.models.diffusion import ddim_step, ddim_timesteps
from jaxlib_ext.samplers.base import SamplingAlgorithm
from jaxlib_ext.samplers.mclc.problem import (
    LatentInverseProblem,
    _residual_and_aux,
    residual_and_grad,
)

__all__ = [
    "SolverInfo",
    "SolverResult",
    "SolverState",
    "SolverStepInfo",
    "build_latent_dps_kernel",
    "build_psld_kernel",
    "init",
    "latent_dps",
    "latent_dps_sampler",
    "psld",
    "psld_sampler",
]


class SolverState(NamedTuple):
    """One chain of a latent solver.

    Attributes:
      z: the latent ``z_{t_i}``, of ``problem.latent_shape``.
      step: the index ``i`` of the next solver step (int32 scalar, 0 at :func:`init`).
    """

    z: jax.Array
    step: jax.Array


class SolverStepInfo(NamedTuple):
    """Diagnostics of one solver step.

    Attributes:
      residual: ``r(z_{t_i}, t_i)`` of (P.5) before the step.
      timestep: ``t_i``.
      corrector: the corrector's info of this step (zeros at the last step, where no corrector
        runs; ``None`` without a corrector).
    """

    residual: jax.Array
    timestep: jax.Array
    corrector: Any = None


class SolverInfo(NamedTuple):
    """Diagnostics of a solver run.

    Attributes:
      residual: ``(N,)`` ``r(z_{t_i}, t_i)`` of (P.5) at each solver step.
      final_residual: ``||y - A x_0||`` of the output.
      corrector: the corrector's info stacked over the ``N - 1`` corrected steps (``None``
        without a corrector).
      timesteps: ``(N,)`` the ``t_i``.
      nfe: network evaluations (int32 scalar).
    """

    residual: jax.Array
    final_residual: jax.Array
    corrector: Any
    timesteps: jax.Array
    nfe: jax.Array


class SolverResult(NamedTuple):
    """The result of a solver run.

    Attributes:
      z0: the final latent.
      x0: ``D(z0)``.
      info: :class:`SolverInfo`.
    """

    z0: jax.Array
    x0: jax.Array
    info: SolverInfo


def _check_positive(name, value, allow_zero=False):
    if isinstance(value, jax.core.Tracer):
        return
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected a finite number {bound}, got {value!r}")


def _check_kernel_args(timesteps, ddim_eta, corrector) -> np.ndarray:
    if isinstance(timesteps, jax.core.Tracer):
        raise TypeError("timesteps: expected a concrete array (see ddim_timesteps), got a traced "
                        "value")
    ts = np.asarray(timesteps)
    if ts.ndim != 1 or ts.shape[0] < 1 or not np.issubdtype(ts.dtype, np.integer):
        raise ValueError(f"timesteps: expected a non-empty 1-D array of ints, got shape "
                         f"{ts.shape} and dtype {ts.dtype}")
    if ts.min() < 0 or np.any(np.diff(ts) >= 0):
        raise ValueError(f"timesteps: expected distinct non-negative indices in descending "
                         f"order, got {ts.tolist()}")
    _check_positive("ddim_eta", ddim_eta, allow_zero=True)
    if not isinstance(ddim_eta, jax.core.Tracer) and float(ddim_eta) > 1:
        raise ValueError(f"ddim_eta: expected a value in [0, 1], got {ddim_eta!r}")
    if corrector is not None and not callable(corrector):
        raise TypeError(f"corrector: expected None or a callable (rng_key, z, t, problem) -> "
                        f"(z, info), got {type(corrector).__name__}")
    return ts.astype(np.int32)


def _check_problem(problem, num_steps, ddim_eta, corrector, t_max):
    if not isinstance(problem, LatentInverseProblem):
        raise TypeError(f"problem: expected a LatentInverseProblem (see "
                        f"latent_inverse_problem), got {type(problem).__name__}")
    if isinstance(num_steps, bool) or not isinstance(num_steps, int):
        raise TypeError(f"num_steps: expected an int, got {num_steps!r}")
    ts = ddim_timesteps(problem.alpha_bars.shape[0], num_steps, t_max)  # range checks
    _check_kernel_args(ts, ddim_eta, corrector)
    latent = tuple(problem.latent_shape)
    x = jax.eval_shape(problem.decoder, jax.ShapeDtypeStruct(latent, jnp.float32))
    y = jax.eval_shape(problem.operator.apply, x)
    if tuple(jnp.shape(problem.measurement)) != tuple(y.shape):
        raise ValueError(f"measurement: expected shape {tuple(y.shape)} (the operator applied "
                         f"to a decoded latent), got {tuple(jnp.shape(problem.measurement))}")
    return ts


def _check_psld(problem, step_size, gluing_weight):
    _check_positive("step_size", step_size)
    _check_positive("gluing_weight", gluing_weight, allow_zero=True)
    if problem.encoder is None:
        raise ValueError("problem: psld needs an encoder (latent_inverse_problem(..., "
                         "encoder=...))")


def _check_position(name, position, problem):
    latent = tuple(problem.latent_shape)
    if tuple(jnp.shape(position)) != latent:
        raise ValueError(f"{name}: expected shape {latent} (latent_shape), got "
                         f"{tuple(jnp.shape(position))}")


def init(position) -> SolverState:
    """The state of a solver (either one) at the start latent ``z_{t_0}``.

    Args:
      position: the latent ``z_{t_0}``, of ``problem.latent_shape`` (cast to float32).

    Returns:
      A :class:`SolverState` at step ``0``.
    """
    return SolverState(jnp.asarray(position, jnp.float32), jnp.zeros((), jnp.int32))


def _build_kernel(timesteps: np.ndarray, guided_step: Callable, corrector):
    """The kernel of one solver step: ``guided_step(rng_key, problem, z, t, abar, abar_next)
    -> (z', r)`` at ``t_i``, then ``corrector`` at ``t_{i+1}`` except after the last step."""
    ts = jnp.asarray(timesteps)
    n = int(timesteps.shape[0])

    def kernel(rng_key, state: SolverState, problem: LatentInverseProblem):
        ab = problem.alpha_bars
        i = jnp.minimum(state.step, n - 1)
        last = i == n - 1
        t, t_next = ts[i], ts[jnp.minimum(i + 1, n - 1)]
        ab_next = jnp.where(last, jnp.ones((), ab.dtype), ab[t_next])
        k_step, k_corr = jax.random.split(rng_key)
        k_step = jnp.where(last, rng_key, k_step)  # the last step has no corrector: whole key
        z, r = guided_step(k_step, problem, state.z, t, ab[t], ab_next)
        info = None
        if corrector is not None:
            def correct(z):
                return corrector(k_corr, z, t_next, problem)

            blank = jax.eval_shape(correct, z)[1]

            def skip(z):
                return z, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), blank)

            z, info = jax.lax.cond(last, skip, correct, z)
        return SolverState(z, state.step + 1), SolverStepInfo(r, t, info)

    return kernel


def build_latent_dps_kernel(timesteps, *, step_size: float = 1.0, ddim_eta: float = 1.0,
                            corrector: Callable | None = None) -> Callable:
    """One step of latent DPS, (S.1)-(S.2), with the corrector after it.

    The kernel ``kernel(rng_key, state, problem) -> (state, info)`` takes the
    :class:`SolverState` at ``t_i`` (``i = state.step``) to ``t_{i+1}``; the last step
    (``i = N - 1``) goes to the clean latent and runs no corrector (further steps repeat it).

    Args:
      timesteps: the descending training indices ``t_0 > ... > t_{N-1}`` (a concrete int array,
        e.g. :func:`~jaxlib_ext.models.diffusion.ddim_timesteps`); each must index
        ``problem.alpha_bars``.
      step_size: the guidance weight of (S.2), ``> 0``.
      ddim_eta: ``0`` (deterministic DDIM) to ``1`` (ancestral).
      corrector: ``None`` or ``corrector(rng_key, z, t, problem) -> (z, info)``, e.g.
        :func:`~jaxlib_ext.samplers.mclc.mclc`.

    Returns:
      ``kernel(rng_key, state, problem) -> (SolverState, SolverStepInfo)``.

    Raises:
      ValueError: ``timesteps``, ``step_size`` or ``ddim_eta`` out of range.
      TypeError: ``timesteps`` traced, or ``corrector`` not callable.

    References:
      Chung et al., Diffusion Posterior Sampling for General Noisy Inverse Problems, arXiv
      2209.14687, Algorithm 1; Song, Meng, Ermon, arXiv 2010.02502, eq. 12.
    """
    ts = _check_kernel_args(timesteps, ddim_eta, corrector)
    _check_positive("step_size", step_size)

    def step(rng_key, problem, z, t, ab, ab_next):
        eps, z0, r, g = residual_and_grad(problem, z, t)
        xi = jax.random.normal(rng_key, eps.shape, eps.dtype)
        z_next = ddim_step(z0, eps, ab, ab_next, ddim_eta, xi)  # (S.1)
        return z_next - step_size * g, r  # (S.2)

    return _build_kernel(ts, step, corrector)


def build_psld_kernel(timesteps, *, step_size: float = 1.0, gluing_weight: float = 0.1,
                      ddim_eta: float = 1.0, corrector: Callable | None = None) -> Callable:
    """One step of PSLD, (S.1) and (S.3), with the corrector after it.

    As :func:`build_latent_dps_kernel`, with the gluing term; the kernel needs
    ``problem.encoder``.

    Args:
      timesteps: the descending training indices ``t_0 > ... > t_{N-1}`` (a concrete int
        array).
      step_size: the weight of the measurement term of (S.3), ``> 0``.
      gluing_weight: the weight of the gluing term of (S.3), ``>= 0``.
      ddim_eta: ``0`` (deterministic DDIM) to ``1`` (ancestral).
      corrector: ``None`` or ``corrector(rng_key, z, t, problem) -> (z, info)``.

    Returns:
      ``kernel(rng_key, state, problem) -> (SolverState, SolverStepInfo)``.

    Raises:
      ValueError: ``timesteps``, ``step_size``, ``gluing_weight`` or ``ddim_eta`` out of range.
      TypeError: ``timesteps`` traced, or ``corrector`` not callable.

    References:
      Rout et al., Solving Linear Inverse Problems Provably via Posterior Sampling with Latent
      Diffusion Models, arXiv 2307.00619, Algorithm 2.
    """
    ts = _check_kernel_args(timesteps, ddim_eta, corrector)
    _check_positive("step_size", step_size)
    _check_positive("gluing_weight", gluing_weight, allow_zero=True)

    def step(rng_key, problem, z, t, ab, ab_next):
        op = problem.operator
        aty = op.adjoint(problem.measurement)

        def loss(z):
            rho, (eps, z0) = _residual_and_aux(problem, t)(z)
            r = jnp.sqrt(jnp.sum(rho ** 2) + 1e-20)
            x = problem.decoder(z0)
            glued = problem.encoder(aty + x - op.adjoint(op.apply(x)))
            glue = jnp.sqrt(jnp.sum((z0 - glued) ** 2) + 1e-20)
            return step_size * r + gluing_weight * glue, (eps, z0, r)

        g, (eps, z0, r) = jax.grad(loss, has_aux=True)(z)
        xi = jax.random.normal(rng_key, eps.shape, eps.dtype)
        z_next = ddim_step(z0, eps, ab, ab_next, ddim_eta, xi)  # (S.1)
        return z_next - g, r  # (S.3)

    return _build_kernel(ts, step, corrector)


def _algorithm(problem, kernel) -> SamplingAlgorithm:
    def init_fn(position):
        _check_position("position", position, problem)
        return init(position)

    def step_fn(rng_key, state):
        return kernel(rng_key, state, problem)

    return SamplingAlgorithm(init_fn, step_fn)


def latent_dps_sampler(problem: LatentInverseProblem, *, num_steps: int = 50,
                       step_size: float = 1.0, ddim_eta: float = 1.0,
                       corrector: Callable | None = None,
                       t_max: int | None = None) -> SamplingAlgorithm:
    """Latent DPS, (S.1)-(S.2), on ``problem`` as a sampling algorithm.

    ``init(position)`` starts at ``z_{t_0}``; ``num_steps`` calls of ``step(rng_key, state)``
    end at the clean latent ``z_0`` (decode it with ``problem.decoder``).

    Args:
      problem: the :class:`~jaxlib_ext.samplers.mclc.LatentInverseProblem`.
      num_steps: solver steps ``N``.
      step_size: the guidance weight of (S.2), ``> 0``.
      ddim_eta: ``0`` (deterministic DDIM) to ``1`` (ancestral).
      corrector: ``None`` or ``corrector(rng_key, z, t, problem) -> (z, info)``.
      t_max: the first step's training index (default ``T - 1``; see
        :func:`~jaxlib_ext.models.diffusion.ddim_timesteps`).

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm` over :class:`SolverState` with
      :class:`SolverStepInfo`.

    Raises:
      TypeError: ``problem`` is not a ``LatentInverseProblem``, ``num_steps`` not an int, or
        ``corrector`` not callable.
      ValueError: an argument is out of range, or ``measurement`` has the wrong shape.

    References:
      Chung et al., arXiv 2209.14687, Algorithm 1.
    """
    ts = _check_problem(problem, num_steps, ddim_eta, corrector, t_max)
    kernel = build_latent_dps_kernel(ts, step_size=step_size, ddim_eta=ddim_eta,
                                     corrector=corrector)
    return _algorithm(problem, kernel)


def psld_sampler(problem: LatentInverseProblem, *, num_steps: int = 50,
                 step_size: float = 1.0, gluing_weight: float = 0.1, ddim_eta: float = 1.0,
                 corrector: Callable | None = None,
                 t_max: int | None = None) -> SamplingAlgorithm:
    """PSLD, (S.1) and (S.3), on ``problem`` as a sampling algorithm; needs
    ``problem.encoder``.

    Args:
      problem: the :class:`~jaxlib_ext.samplers.mclc.LatentInverseProblem`, with an encoder.
      num_steps: solver steps ``N``.
      step_size: the weight of the measurement term of (S.3), ``> 0``.
      gluing_weight: the weight of the gluing term of (S.3), ``>= 0``.
      ddim_eta: ``0`` (deterministic DDIM) to ``1`` (ancestral).
      corrector: ``None`` or ``corrector(rng_key, z, t, problem) -> (z, info)``.
      t_max: the first step's training index (default ``T - 1``).

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm` over :class:`SolverState` with
      :class:`SolverStepInfo`.

    Raises:
      TypeError: as :func:`latent_dps_sampler`.
      ValueError: as :func:`latent_dps_sampler`, or ``problem`` has no encoder.

    References:
      Rout et al., arXiv 2307.00619, Algorithm 2.
    """
    ts = _check_problem(problem, num_steps, ddim_eta, corrector, t_max)
    _check_psld(problem, step_size, gluing_weight)
    kernel = build_psld_kernel(ts, step_size=step_size, gluing_weight=gluing_weight,
                               ddim_eta=ddim_eta, corrector=corrector)
    return _algorithm(problem, kernel)


def _run(rng_key, problem: LatentInverseProblem, kernel: Callable, timesteps: np.ndarray,
         z_init, nfe_per_step: int = 1) -> SolverResult:
    """``N`` kernel steps from ``z_init`` (or ``N(0, I)``) and the decoded result; each solver
    step costs ``nfe_per_step`` network evaluations."""
    num_steps = int(timesteps.shape[0])
    k_init, k_steps, k_last = jax.random.split(rng_key, 3)
    z = (jax.random.normal(k_init, problem.latent_shape, jnp.float32) if z_init is None
         else z_init)

    def body(state, key):
        return kernel(key, state, problem)

    state, infos = jax.lax.scan(body, init(z), jax.random.split(k_steps, num_steps - 1))
    # the last step, whose index is known here: XLA folds its level's constants
    state, last = kernel(k_last, state._replace(step=jnp.asarray(num_steps - 1, jnp.int32)),
                         problem)
    x0 = problem.decoder(state.z)
    final = jnp.sqrt(jnp.sum((problem.measurement - problem.operator.apply(x0)) ** 2))
    residual = jnp.concatenate([infos.residual, last.residual[None]])
    cinfo = infos.corrector  # the last step runs no corrector
    k_corr = 0 if cinfo is None else jax.tree.leaves(cinfo)[0].shape[-1]
    nfe = jnp.asarray(nfe_per_step * num_steps + k_corr * (num_steps - 1), jnp.int32)
    return SolverResult(state.z, x0, SolverInfo(residual, final, cinfo, jnp.asarray(timesteps),
                                                nfe))


def latent_dps(rng_key, problem: LatentInverseProblem, *, num_steps: int = 50,
               step_size: float = 1.0, ddim_eta: float = 1.0, corrector: Callable | None = None,
               z_init=None, t_max: int | None = None) -> SolverResult:
    """Latent DPS, (S.1)-(S.2), for one chain: ``num_steps`` steps of
    :func:`build_latent_dps_kernel` from ``z_init`` and the decoded result.

    Args:
      rng_key: PRNG key.
      problem: the :class:`~jaxlib_ext.samplers.mclc.LatentInverseProblem`.
      num_steps: solver steps ``N``.
      step_size: the guidance weight of (S.2), ``> 0``.
      ddim_eta: ``0`` (deterministic DDIM) to ``1`` (ancestral).
      corrector: ``None`` or ``corrector(rng_key, z, t, problem) -> (z, info)``.
      z_init: the starting ``z_{t_0}`` (default ``N(0, I)`` from ``rng_key``).
      t_max: the first step's training index (default ``T - 1``; see
        :func:`~jaxlib_ext.models.diffusion.ddim_timesteps`).

    Returns:
      ``SolverResult(z0, x0, info)`` with a :class:`SolverInfo`.

    Raises:
      TypeError: ``problem`` is not a ``LatentInverseProblem``, ``num_steps`` not an int, or
        ``corrector`` not callable.
      ValueError: an argument is out of range, or ``measurement`` or ``z_init`` has the wrong
        shape.

    References:
      Chung et al., arXiv 2209.14687, Algorithm 1; Song, Meng, Ermon, arXiv 2010.02502, eq. 12.
    """
    ts = _check_problem(problem, num_steps, ddim_eta, corrector, t_max)
    _check_positive("step_size", step_size)
    if z_init is not None:
        _check_position("z_init", z_init, problem)
    kernel = build_latent_dps_kernel(ts, step_size=step_size, ddim_eta=ddim_eta,
                                     corrector=corrector)
    return _run(rng_key, problem, kernel, ts, z_init)


def psld(rng_key, problem: LatentInverseProblem, *, num_steps: int = 50, step_size: float = 1.0,
         gluing_weight: float = 0.1, ddim_eta: float = 1.0, corrector: Callable | None = None,
         z_init=None, t_max: int | None = None) -> SolverResult:
    """PSLD, (S.1) and (S.3), for one chain: ``num_steps`` steps of :func:`build_psld_kernel`
    from ``z_init`` and the decoded result; needs ``problem.encoder``.

    Args:
      rng_key: PRNG key.
      problem: the :class:`~jaxlib_ext.samplers.mclc.LatentInverseProblem`, with an encoder.
      num_steps: solver steps ``N``.
      step_size: the weight of the measurement term of (S.3), ``> 0``.
      gluing_weight: the weight of the gluing term of (S.3), ``>= 0``.
      ddim_eta: ``0`` (deterministic DDIM) to ``1`` (ancestral).
      corrector: ``None`` or ``corrector(rng_key, z, t, problem) -> (z, info)``.
      z_init: the starting ``z_{t_0}`` (default ``N(0, I)`` from ``rng_key``).
      t_max: the first step's training index (default ``T - 1``).

    Returns:
      ``SolverResult(z0, x0, info)`` with a :class:`SolverInfo`.

    Raises:
      TypeError: as :func:`latent_dps`.
      ValueError: as :func:`latent_dps`, or ``problem`` has no encoder.

    References:
      Rout et al., arXiv 2307.00619, Algorithm 2.
    """
    ts = _check_problem(problem, num_steps, ddim_eta, corrector, t_max)
    _check_psld(problem, step_size, gluing_weight)
    if z_init is not None:
        _check_position("z_init", z_init, problem)
    kernel = build_psld_kernel(ts, step_size=step_size, gluing_weight=gluing_weight,
                               ddim_eta=ddim_eta, corrector=corrector)
    return _run(rng_key, problem, kernel, ts, z_init)
