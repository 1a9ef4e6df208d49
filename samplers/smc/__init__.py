"""jaxlib_ext.samplers.smc: SMC building blocks and SOSMC, stochastic optimisation with a
persistent, reweighted particle system (arXiv 2601.22003).

:mod:`weights` (normalised log-weights, ESS, the incremental weights of both SOSMC variants),
:mod:`resampling` (multinomial, the default; stratified; systematic), :mod:`moves` (ULA, MALA,
RWM, HMC for one particle of a potential ``U(theta, x)``, and ``move_algorithm`` for one move
as a chain), :mod:`objectives` (gradient estimators: the weighted mean of ``grad_theta U``, the
reward-tuning covariance form), :mod:`sosmc` (the algorithm: ``init``, ``build_kernel``,
``sosmc(...) -> SamplingAlgorithm``, :class:`SOSMCState`, :class:`SOSMCInfo`, and the driver
``run``), :mod:`baselines` (ImpDiff and SOUL in the same API, the SOSMC authors' forms by
default) and :mod:`problems` (MMLE and reward-tuning test problems).
"""

from jaxlib_ext.samplers.smc import baselines, moves, objectives, problems, resampling, weights
from jaxlib_ext.samplers.smc.baselines import impdiff, soul
from jaxlib_ext.samplers.smc.moves import MoveInfo, MoveState, hmc, mala, move_algorithm, rwm, ula
from jaxlib_ext.samplers.smc.objectives import reward_tuning_grad, weighted_potential_grad
from jaxlib_ext.samplers.smc.problems import (
    Problem,
    digits_reward,
    gaussian_mmle,
    mixture2d_reward,
    ppca_mmle,
)
from jaxlib_ext.samplers.smc.resampling import multinomial, resample, stratified, systematic
from jaxlib_ext.samplers.smc.sosmc import (
    NonFiniteError,
    RunResult,
    SOSMCInfo,
    SOSMCState,
    run,
    sosmc,
)
from jaxlib_ext.samplers.smc.weights import ess, normalize, ula_log_increment

__all__ = [
    "MoveInfo",
    "MoveState",
    "NonFiniteError",
    "Problem",
    "RunResult",
    "SOSMCInfo",
    "SOSMCState",
    "baselines",
    "digits_reward",
    "ess",
    "gaussian_mmle",
    "hmc",
    "impdiff",
    "mala",
    "mixture2d_reward",
    "move_algorithm",
    "moves",
    "multinomial",
    "normalize",
    "objectives",
    "ppca_mmle",
    "problems",
    "resample",
    "resampling",
    "reward_tuning_grad",
    "run",
    "rwm",
    "sosmc",
    "soul",
    "stratified",
    "systematic",
    "ula",
    "ula_log_increment",
    "weighted_potential_grad",
    "weights",
]
