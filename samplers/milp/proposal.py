"""The learned proposal: a bipartite GNN whose outputs *are* the move probabilities.

Template: the learned sampler of regularised Langevin dynamics (RLNN; Feng and Yang, ICML 2025,
github.com/Shengyu-Feng/RLD4CO), where a graph network alone gives each binary variable's flip
probability and is trained without labels on its own rollouts. For the integer block of a MILP
(general integers in a box) each column ``i`` moves by ``d_i in {-1, 0, +1}``, independently::

    q_theta(z' | z) = prod_i softmax(u_i^-, 0, u_i^+)[z'_i - z_i]                          (P.1)

with ``(u^-, u^+) = GNN_theta(instance, z) + m0`` the two outputs of
:class:`~jaxlib_ext.samplers.milp.gnn.BipartiteGNN` (unbounded) plus a constant ``m0``
(``init_move_logit``), and moves that leave the box (and every move of a padded column) masked.
The exact single-move gains, the gradient and the row violations of the unified energy (E.1) are
the network's *input* features (:func:`gnn.node_features`), not an additive base: nothing but the
network decides where the chain goes. Its head starts at zero, so an untrained proposal is a lazy
random walk that moves a column with probability ``sigmoid(m0)`` (about 0.05 for the default
``m0 = -3``; for a binary column one of the two moves is masked).

Two samplers use it (:func:`langevin.build_kernel`):

* ``rule="learned"``: ``z' ~ q_theta(. | z)``, unadjusted. Like RLNN it is a learned
  heuristic, trained to lower the energy; no stationary distribution is claimed.
* ``rule="learned-mh"``: ``q_theta`` as the proposal of a Metropolis-Hastings step::

      accept with prob  min(1, exp(-(E(z') - E(z)) / tau) q_theta(z | z') / q_theta(z' | z))   (P.2)

  Every move ``d`` inside the box has its reverse ``-d`` inside the box and every unmasked logit
  is finite, so ``q_theta(z | z') > 0`` whenever ``q_theta(z' | z) > 0``: ``pi_tau`` is invariant
  exactly, for any parameters.

Training (on-policy REINFORCE on the proposal's own rollouts) is
:func:`jaxlib_ext.samplers.milp.training.train_proposal`; :func:`save_proposal` and
:func:`load_proposal` store a trained proposal with the configuration it was built from.
"""

from __future__ import annotations

import json
import pathlib

import jax
from flax import nnx

from jaxlib_ext.samplers.milp.energy import EnergyData
from jaxlib_ext.samplers.milp.gnn import CON_FEATURES, VAR_FEATURES, BipartiteGNN

__all__ = ["LearnedProposal", "load_proposal", "save_proposal"]

_CONFIG = "proposal.json"
_PARAMS = "params"


class LearnedProposal(nnx.Module):
    """The network of (P.1): ``proposal(data, z, g, shift, penalty) -> (n, 2)``, the logits
    ``(u^-, u^+)`` of the moves ``-1`` and ``+1`` of every column relative to staying.

    Args:
      hidden: the GNN's width.
      num_layers: the GNN's number of message-passing rounds.
      init_move_logit: ``m0`` of (P.1), added to both outputs; the untrained proposal moves a
        column with probability ``sigmoid(m0)`` (two open directions: about twice that).
      rngs: the parameters' initialisation.

    References:
      Feng and Yang, Regularized Langevin Dynamics for Combinatorial Optimization, ICML 2025
      (RLNN, github.com/Shengyu-Feng/RLD4CO).
    """

    def __init__(self, hidden: int = 64, num_layers: int = 3, *, init_move_logit: float = -3.0,
                 rngs: nnx.Rngs):
        self.hidden, self.num_layers = int(hidden), int(num_layers)
        self.init_move_logit = float(init_move_logit)
        self.gnn = BipartiteGNN(hidden, num_layers, outputs=2, max_logit=None, rngs=rngs)

    def config(self) -> dict:
        """The constructor's arguments and the feature sizes, as stored by :func:`save_proposal`.

        Returns:
          A JSON-serialisable dict.
        """
        return {"hidden": self.hidden, "num_layers": self.num_layers,
                "init_move_logit": self.init_move_logit, "var_features": VAR_FEATURES,
                "con_features": CON_FEATURES}

    def __call__(self, data: EnergyData, z, g, shift=0.0, penalty=1.0):
        return self.gnn(data, z, g, shift, penalty) + self.init_move_logit


def save_proposal(directory, proposal: LearnedProposal, meta: dict | None = None) -> pathlib.Path:
    """Write ``proposal`` to ``directory`` (created).

    Args:
      directory: the folder: its parameters (Orbax) and ``proposal.json`` with
        :meth:`LearnedProposal.config` and ``meta``.
      proposal: the :class:`LearnedProposal`.
      meta: extra JSON-serialisable facts (e.g. the family it was trained on).

    Returns:
      The folder's absolute path.
    """
    from jaxlib_ext.core.checkpoint import Checkpointer

    directory = pathlib.Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    with Checkpointer(directory / _PARAMS, max_to_keep=1, async_save=False) as ckpt:
        ckpt.save(0, nnx.state(proposal, nnx.Param))
    record = {"config": proposal.config(), "meta": dict(meta or {})}
    (directory / _CONFIG).write_text(json.dumps(record, indent=1, sort_keys=True))
    return directory


def load_proposal(directory) -> LearnedProposal:
    """The :class:`LearnedProposal` that :func:`save_proposal` wrote to ``directory``.

    Args:
      directory: the folder.

    Returns:
      The proposal with its saved parameters.

    Raises:
      FileNotFoundError: ``directory`` holds no saved proposal.
      ValueError: it was saved by a network with other feature sizes than this version's
        (``VAR_FEATURES``, ``CON_FEATURES`` of :mod:`gnn`), or its parameters do not fit the
        stored configuration.
    """
    from jaxlib_ext.core.checkpoint import Checkpointer, abstract_like

    directory = pathlib.Path(directory).absolute()
    path = directory / _CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"proposal: no {_CONFIG} in {directory} (write one with "
                                "save_proposal or `python -m jaxlib_ext milp-train`)")
    try:
        cfg = json.loads(path.read_text())["config"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"proposal: {path} is not a saved proposal ({e})") from None
    have = {"var_features": VAR_FEATURES, "con_features": CON_FEATURES}
    for name, n in have.items():
        if cfg.get(name) != n:
            raise ValueError(f"proposal: {directory} was trained with {name}={cfg.get(name)}, "
                             f"this network uses {n}; retrain it with this version")
    proposal = LearnedProposal(cfg["hidden"], cfg["num_layers"],
                               init_move_logit=cfg["init_move_logit"], rngs=nnx.Rngs(0))
    params = nnx.state(proposal, nnx.Param)
    abstract = abstract_like(params, jax.tree.map(lambda a: a.sharding, params))
    try:
        with Checkpointer(directory / _PARAMS, read_only=True) as ckpt:
            params, _ = ckpt.restore(None, abstract)
    except (ValueError, KeyError) as e:
        raise ValueError(f"proposal: the parameters in {directory} do not fit its "
                         f"configuration {cfg} ({e})") from None
    nnx.update(proposal, params)
    return proposal
