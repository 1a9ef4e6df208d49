"""jaxlib_ext.samplers: samplers as NumPyro distributions and MCMC kernels and as BlackJAX-style
kernels (``init``, ``build_kernel() -> kernel(rng_key, state)``, ``SamplingAlgorithm``; the
contract is :mod:`base`), for preference learning, stochastic optimisation, mixed-integer
programs and inverse problems.

Mallows preference learning: :mod:`rankings` (data, distances, the footrule data matrix ``D``),
:mod:`pseudo_mallows` (the Pseudo-Mallows distribution, arXiv 2205.13911, as a NumPyro
``Distribution``), :mod:`mallows_mcmc` (the leap-and-shift MCMC baseline: pure
``init``/``build_kernel`` with ``MallowsState``/``MallowsInfo``, ``mallows_mh`` binding them
into a ``SamplingAlgorithm``, and the NumPyro ``MCMCKernel`` ``MallowsMH``) and
:mod:`mallows_augment` (data augmentation, top-K recommendations).

Subpackage :mod:`smc`: SMC building blocks and SOSMC (arXiv 2601.22003), stochastic
optimisation with a persistent reweighted particle system, with the ImpDiff and SOUL baselines,
all on the same kernel contract.

Loaded on first access (``from jaxlib_ext.samplers import milp`` or ``samplers.milp``):
:mod:`milp` (learned Langevin sampling for mixed-integer programs with exact LP completion;
HiGHS from the ``milp`` extra), :mod:`energy` (normalized energy priors for linear inverse
problems, arXiv 2605.15487), :mod:`mclc` (latent-diffusion inverse solvers and the
measurement-consistent Langevin corrector, arXiv 2601.04791) and :mod:`inverse` (what both
image inverse-problem samplers share: the linear operator type with its adjoint and the
degradations, the image quality of reconstructions, PSNR and SSIM, and the variance-preserving
diffusion schedule and DDIM steps of :mod:`jaxlib_ext.models.diffusion`).
"""

import importlib

from jaxlib_ext.samplers import smc
from jaxlib_ext.samplers.mallows_augment import augment_mh, top_k_recommendations
from jaxlib_ext.samplers.mallows_mcmc import (
    MallowsInfo,
    MallowsMH,
    MallowsState,
    footrule_log_partition,
    leap_and_shift,
    mallows_mh,
    rank_diagnostics,
    run_mallows_mcmc,
)
from jaxlib_ext.samplers.pseudo_mallows import (
    PseudoMallows,
    exact_kl,
    exact_posterior_marginals,
    exhaustive_order_search,
    fit_augmented,
    kl_estimate,
    local_search_order,
    pseudo_mallows_log_prob,
    pseudo_mallows_sample,
    v_order,
)
from jaxlib_ext.samplers.rankings import (
    MISSING,
    footrule_data_matrix,
    footrule_distance,
    kendall_distance,
    validate_rankings,
)

__all__ = [
    "MISSING",
    "MallowsInfo",
    "MallowsMH",
    "MallowsState",
    "PseudoMallows",
    "augment_mh",
    "exact_kl",
    "exact_posterior_marginals",
    "exhaustive_order_search",
    "fit_augmented",
    "footrule_data_matrix",
    "footrule_distance",
    "footrule_log_partition",
    "kendall_distance",
    "kl_estimate",
    "leap_and_shift",
    "local_search_order",
    "mallows_mh",
    "pseudo_mallows_log_prob",
    "pseudo_mallows_sample",
    "rank_diagnostics",
    "run_mallows_mcmc",
    "smc",
    "top_k_recommendations",
    "v_order",
    "validate_rankings",
    *(_LAZY_SUBMODULES := ("energy", "inverse", "mclc", "milp")),
]


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
