"""jaxlib_ext.samplers.energy: normalized energy priors for linear inverse problems.

arXiv 2605.15487 (ICML 2026). An energy ``U(y, Sigma) ~ -log p_Sigma(y)`` conditioned on an
anisotropic covariance (pixel- or Fourier-diagonal), trained by anisotropic covariance score
matching, gives normalised posterior densities for any linear degradation diagonal in one of
those bases, without retraining.

Modules, one idea each: :mod:`covariance` (diagonal covariances, random training ones),
:mod:`energy` (the inner-product energy, Tweedie denoiser, noise score, the Gaussian closed
form), :mod:`network` (MLP and U-Net energy networks), :mod:`loss` (the A-CSM objective),
:mod:`train` (training with EMA and checkpoints; ``python -m jaxlib_ext energy``),
:mod:`problem` (a degradation as anisotropic denoising, its evidence), :mod:`levels` (the
task-shaped noise levels), :mod:`langevin` (preconditioned ULA/MALA with exact MH, on the
shared step of :mod:`jaxlib_ext.samplers.mala`), :mod:`pc` (predictor-corrector and PC-MALA),
:mod:`adaptive` (the energy-guided schedules), :mod:`blind` (posterior over degradation
parameters) and :mod:`dps` (the DPS baseline).

Every sampler follows :mod:`jaxlib_ext.samplers.base`: ``init``, ``build_kernel`` and a
constructor returning a ``SamplingAlgorithm`` (:func:`langevin.mala`,
:func:`pc.predictor_corrector`, :func:`adaptive.per_entry`, :func:`adaptive.per_level`,
:func:`dps.diffusion_posterior_sampling`); the drivers ``sample(rng_key, energy_fn, ...)``
run them.
"""

from jaxlib_ext.samplers.energy import (
    adaptive,
    blind,
    covariance,
    dps,
    energy,
    langevin,
    levels,
    loss,
    network,
    pc,
    problem,
)
from jaxlib_ext.samplers.energy.blind import BlindResult, blind_posterior, neg_log_evidence
from jaxlib_ext.samplers.energy.covariance import Covariance, random_covariance
from jaxlib_ext.samplers.energy.energy import (
    energy_and_grads,
    gaussian_energy,
    inner_product_energy,
    noise_score,
    score,
    tweedie_denoiser,
)
from jaxlib_ext.samplers.energy.loss import acsm_loss, add_noise, covariance_score_target
from jaxlib_ext.samplers.energy.network import (
    EnergyMLP,
    EnergyUNet,
    energy_fn_of,
    functional_energy,
)
from jaxlib_ext.samplers.energy.problem import DiagonalProblem, diagonal_problem, from_operator

__all__ = [
    "BlindResult",
    "Covariance",
    "DiagonalProblem",
    "EnergyMLP",
    "EnergyUNet",
    "acsm_loss",
    "adaptive",
    "add_noise",
    "blind",
    "blind_posterior",
    "covariance",
    "covariance_score_target",
    "diagonal_problem",
    "dps",
    "energy",
    "energy_and_grads",
    "energy_fn_of",
    "from_operator",
    "functional_energy",
    "gaussian_energy",
    "inner_product_energy",
    "langevin",
    "levels",
    "loss",
    "neg_log_evidence",
    "network",
    "noise_score",
    "pc",
    "problem",
    "random_covariance",
    "score",
    "tweedie_denoiser",
]
