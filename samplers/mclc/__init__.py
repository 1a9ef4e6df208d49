"""jaxlib_ext.samplers.mclc: latent-diffusion solvers for linear inverse problems and MCLC, the
measurement-consistent Langevin corrector (arXiv 2601.04791).

:mod:`problem` (the problem container and its checks, Tweedie's denoiser, the measurement
residual and its linearisation), :mod:`solvers` (latent DPS and PSLD over DDIM, with a
``corrector=`` hook: ``init``, ``build_latent_dps_kernel``/``build_psld_kernel``, the sampling
algorithms ``latent_dps_sampler``/``psld_sampler`` and the drivers ``latent_dps``/``psld``),
:mod:`daps` (Latent DAPS, decoupled annealing posterior sampling, arXiv 2407.01521: an ODE
estimate of the clean latent, Langevin on it toward the measurement, fresh noise at the next
level; the same states, infos and hook: ``build_latent_daps_kernel``, ``latent_daps_sampler``,
the driver ``latent_daps``, the rules ``PRIOR_STDS`` of its prior spread),
:mod:`corrector` (``init``, ``build_kernel``, ``mclc_sampler``, the driver ``mclc_correct``
and the hook ``mclc``; its constraint forms: the published projection (default); ours:
projection with retraction, first-order compensation, none; the step rules: ``eta_t``
proportional to the level's variance (default), the SNR rule), :mod:`gaussian` (the
linear-Gaussian latent model with its closed-form posterior, the oracle of the tests; a
Gaussian prior on principal components of images, an untrained latent model with an exact
denoiser).

The operator type, the degradations and the diffusion schedule and steps these build on are
in :mod:`jaxlib_ext.samplers.inverse` (:class:`~jaxlib_ext.samplers.inverse.LinearOperator`,
:func:`~jaxlib_ext.samplers.inverse.linear_operator`,
:func:`~jaxlib_ext.samplers.inverse.check_adjoint`,
:func:`~jaxlib_ext.samplers.inverse.linear_schedule`,
:func:`~jaxlib_ext.samplers.inverse.ddim_timesteps`, ...).
"""

from jaxlib_ext.samplers.mclc import corrector, daps, gaussian, problem, solvers
from jaxlib_ext.samplers.mclc.corrector import (
    CONSTRAINTS,
    MCLC,
    STEP_RULES,
    CorrectorInfo,
    CorrectorState,
    StepBoundWarning,
    compensation_constraint,
    expected_squared_step,
    mclc,
    mclc_correct,
    mclc_sampler,
    no_constraint,
    projection_constraint,
    tangent_constraint,
)
from jaxlib_ext.samplers.mclc.daps import (
    PRIOR_STDS,
    build_latent_daps_kernel,
    latent_daps,
    latent_daps_sampler,
)
from jaxlib_ext.samplers.mclc.gaussian import (
    LinearGaussianLatentModel,
    PCALatentPrior,
    gaussian_kl,
    linear_gaussian_model,
    pca_latent_prior,
)
from jaxlib_ext.samplers.mclc.problem import (
    LatentInverseProblem,
    ResidualLinearization,
    denoise,
    latent_inverse_problem,
    measurement_residual,
    residual_linearization,
)
from jaxlib_ext.samplers.mclc.solvers import (
    SolverInfo,
    SolverResult,
    SolverState,
    SolverStepInfo,
    build_latent_dps_kernel,
    build_psld_kernel,
    latent_dps,
    latent_dps_sampler,
    psld,
    psld_sampler,
)

__all__ = [
    "CONSTRAINTS",
    "MCLC",
    "CorrectorInfo",
    "CorrectorState",
    "LatentInverseProblem",
    "LinearGaussianLatentModel",
    "PCALatentPrior",
    "PRIOR_STDS",
    "ResidualLinearization",
    "STEP_RULES",
    "SolverInfo",
    "SolverResult",
    "SolverState",
    "SolverStepInfo",
    "StepBoundWarning",
    "build_latent_daps_kernel",
    "build_latent_dps_kernel",
    "build_psld_kernel",
    "compensation_constraint",
    "corrector",
    "daps",
    "denoise",
    "expected_squared_step",
    "gaussian",
    "gaussian_kl",
    "latent_daps",
    "latent_daps_sampler",
    "latent_dps",
    "latent_dps_sampler",
    "latent_inverse_problem",
    "linear_gaussian_model",
    "mclc",
    "mclc_correct",
    "mclc_sampler",
    "measurement_residual",
    "no_constraint",
    "pca_latent_prior",
    "problem",
    "projection_constraint",
    "psld",
    "psld_sampler",
    "residual_linearization",
    "solvers",
    "tangent_constraint",
]
