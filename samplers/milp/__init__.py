"""jaxlib_ext.samplers.milp: unsupervised learned Langevin sampling for mixed-integer programs.

Reconstruction of the ICML 2026 unsupervised Langevin MILP sampler (UNLS4MILP; only its
abstract is public): sample the integer variables with a discrete Langevin sampler whose energy
unifies objective and constraint violation, complete the continuous ones with an exact LP
(HiGHS), and learn the proposal without labels with a bipartite graph network. Modules:

* :mod:`problem`: the :class:`MILP` type, :func:`make_milp`, :func:`check_solution`.
* :mod:`mps`: :func:`read_mps` (MPS/LP files through HiGHS).
* :mod:`generators`: set cover, combinatorial auction, capacitated facility location,
  independent set (the Ecole/learn2branch families, arXiv 1906.01629).
* :mod:`highs`: HiGHS models, the LP relaxation and the exact baseline :func:`solve_highs`.
* :mod:`lp_completion`: batched exact (and elastic) LP completion :func:`complete`.
* :mod:`energy`: the penalty energy (E.1) on the integer block.
* :mod:`langevin`: the sampling rules (:data:`RULES`): DLP / DMALA (arXiv 2206.09914), the
  regularised flip rule and the learned proposal's, as ``init``/``build_kernel`` and the
  sampling algorithm :func:`discrete_langevin`; annealed, many chains under ``jit``/``vmap``
  (:func:`run_langevin`).
* :mod:`gnn`: the bipartite GNN (Flax NNX); :mod:`proposal`: the learned proposal, the network
  whose outputs are the moves (after RLNN, Feng and Yang, ICML 2025); :mod:`training`: its
  on-policy training, the bounded-bias hybrid's unsupervised training and the supervised one;
  :mod:`diving`: the Neural Diving baseline (arXiv 2012.13349).
* :mod:`solve`: :func:`solve` -> :class:`MILPResult`, the certified end-to-end solver.
"""

from jaxlib_ext.samplers.milp.diving import neural_diving, predict_assignment
from jaxlib_ext.samplers.milp.energy import (
    EnergyData,
    continuous_shift,
    cut_value,
    energy,
    energy_data,
    energy_terms,
    pad_energy_data,
    violation,
    with_cuts,
)
from jaxlib_ext.samplers.milp.generators import (
    FAMILIES,
    capacitated_facility_location,
    combinatorial_auction,
    independent_set,
    set_cover,
)
from jaxlib_ext.samplers.milp.gnn import BipartiteGNN, gnn_bias_fn, node_features
from jaxlib_ext.samplers.milp.highs import HighsResult, highs_model, solve_highs
from jaxlib_ext.samplers.milp.langevin import (
    LEARNED_RULES,
    RULES,
    DiscreteLangevinInfo,
    DiscreteLangevinState,
    annealing_schedule,
    build_kernel,
    coordinate_gains,
    discrete_langevin,
    dlp_logits,
    flip_logits,
    init,
    move_log_probs,
    proposal_log_prob,
    run_langevin,
)
from jaxlib_ext.samplers.milp.lp_completion import Completion, complete, lp_value_cuts
from jaxlib_ext.samplers.milp.mps import read_mps
from jaxlib_ext.samplers.milp.problem import MILP, SolutionCheck, check_solution, make_milp
from jaxlib_ext.samplers.milp.proposal import LearnedProposal, load_proposal, save_proposal
from jaxlib_ext.samplers.milp.solve import SOLVE_RULES, MILPResult, solve
from jaxlib_ext.samplers.milp.training import (
    random_box_state,
    stack_for_proposal,
    stack_problems,
    train_proposal,
    train_supervised,
    train_unsupervised,
)

__all__ = [
    "FAMILIES",
    "LEARNED_RULES",
    "MILP",
    "RULES",
    "SOLVE_RULES",
    "BipartiteGNN",
    "Completion",
    "DiscreteLangevinInfo",
    "DiscreteLangevinState",
    "EnergyData",
    "HighsResult",
    "LearnedProposal",
    "MILPResult",
    "SolutionCheck",
    "annealing_schedule",
    "build_kernel",
    "capacitated_facility_location",
    "check_solution",
    "combinatorial_auction",
    "complete",
    "continuous_shift",
    "coordinate_gains",
    "cut_value",
    "discrete_langevin",
    "dlp_logits",
    "energy",
    "energy_data",
    "energy_terms",
    "flip_logits",
    "gnn_bias_fn",
    "highs_model",
    "independent_set",
    "init",
    "load_proposal",
    "lp_value_cuts",
    "make_milp",
    "miplib_path",
    "move_log_probs",
    "neural_diving",
    "node_features",
    "pad_energy_data",
    "predict_assignment",
    "proposal_log_prob",
    "random_box_state",
    "read_mps",
    "run_langevin",
    "save_proposal",
    "set_cover",
    "solve",
    "solve_highs",
    "stack_for_proposal",
    "stack_problems",
    "train_proposal",
    "train_supervised",
    "train_unsupervised",
    "violation",
    "with_cuts",
]


def miplib_path(name: str):
    """The path of a bundled MIPLIB 3 instance, for :func:`read_mps`.

    Args:
      name: ``"p0033"`` or ``"p0201"``.

    Returns:
      The path (an ``importlib.resources`` traversable).

    Raises:
      ValueError: no bundled instance of that name.
    """
    from importlib.resources import files

    path = files("jaxlib_ext.samplers") / "data" / "miplib3" / f"{name}.mps"
    if not path.is_file():
        raise ValueError(f"name: no bundled MIPLIB instance {name!r} (have p0033, p0201)")
    return path
