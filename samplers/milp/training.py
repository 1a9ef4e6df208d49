"""Training the bipartite GNN: the learned proposal on its own rollouts, the bounded-bias hybrid
without labels, and the supervised Neural-Diving network.

**Learned proposal** (:func:`train_proposal`, the default learned sampler of :func:`solve`): the
network *is* the proposal (P.1) of :mod:`proposal`, trained on-policy by REINFORCE on the
one-step decrease of the unified energy along its own rollouts from random states (T.3; after
RLNN, Feng and Yang, ICML 2025). See its docstring.

**Unsupervised bounded bias** (:func:`train_unsupervised`, the hybrid option): states ``z`` are
collected by running the untrained flip-rule sampler (D.3) of :mod:`langevin` on the training
instances (snapshots along its annealing schedule, each with its ``tau`` and ``lam``). At each
state the network's logits ``b`` are added to (D.3), giving move probabilities
``p = sigmoid(l + b)`` along the move directions ``dir``; the loss is the energy (E.1) of the
expected next state (the relaxation; the "Erdos goes neural" form of the learned proposal of Feng
and Yang, ICML 2025) plus a move-count regulariser::

    L(theta) = E_{z} [ E_lam(z + p * dir) + mu (sum_i p_i - k)^2 / n ]                   (T.1)

The relaxation can be gamed: fractional expected states lower the penalty of packing rows
without any integer move doing so. ``objective="reinforce"`` (the default) therefore fits the
one-step proposal ``q_theta(z'|z)`` (independent moves with probabilities ``p``) to the annealed
target itself, minimising ``KL(q_theta || pi_tau) = E_q[E_lam(z')] / tau - H(q_theta) + const``
with the score-function estimator for the energy term (the REINFORCE variant of Feng and Yang's
learned sampler; ``S`` sampled moves per state, their mean as baseline) and the exact entropy of
the product of Bernoullis::

    L(theta) = E_z [ E_{z' ~ q_theta} E_lam(z') / tau - H(q_theta(.|z))
                     + mu (sum_i p_i - k)^2 / n ]                                            (T.2)

Unlike a purely greedy one-step objective, (T.2) keeps the proposal spread at hot states
(the entropy term) and sharp at cold ones, and it cannot learn to freeze the chain. The
network's logits are bounded (``gnn.BipartiteGNN(max_logit=...)``), so at low temperature the
exact gains of (D.3) decide.

No optimal solution enters (T.1) or (T.2). The paper's exact loss is not public; both are our
choice.

**Supervised** (:func:`train_supervised`; Neural Diving, Nair et al., arXiv 2012.13349, sec. 4):
the same network, evaluated at the all-lower-bound state, is trained by binary cross-entropy to
predict a HiGHS-optimal assignment ``z*`` of each training instance (``(z* - l)/(u - l)`` for
general integers); ``diving.neural_diving`` then predicts, fixes and completes.

Instances of one family are padded to common sizes (``energy.pad_energy_data``) and stacked, so
one ``jit``-compiled step serves the whole training set. Both trainers run on
:func:`jaxlib_ext.core.loop.run_loop` (Adam at a constant rate): optional Orbax checkpoints of
the parameters and the optimiser state with resume, a stop with
:class:`~jaxlib_ext.core.loop.NonFiniteLossError` on a non-finite loss, a time limit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlib_ext.core import loop
from jaxlib_ext.samplers.milp.energy import (
    EnergyData,
    energy,
    energy_data,
    pad_energy_data,
    with_cuts,
)
from jaxlib_ext.samplers.milp.gnn import BipartiteGNN
from jaxlib_ext.samplers.milp.highs import solve_highs
from jaxlib_ext.samplers.milp.langevin import (
    _terms_and_grad,
    annealing_schedule,
    coordinate_gains,
    flip_logits,
    move_log_probs,
    run_langevin,
)
from jaxlib_ext.samplers.milp.lp_completion import lp_value_cuts
from jaxlib_ext.samplers.milp.problem import MILP
from jaxlib_ext.samplers.milp.proposal import LearnedProposal

__all__ = ["random_box_state", "stack_for_proposal", "stack_problems", "train_proposal",
           "train_supervised", "train_unsupervised"]


def _round_up(v, k):
    return int(-(-v // k) * k)


def stack_problems(problems: list[MILP], *, pad_to: int = 16) -> EnergyData:
    """:class:`EnergyData` of every problem, padded to common sizes and stacked on a leading axis.

    Problems with continuous columns use their integer block only.

    Args:
      problems: the MILPs (at least one).
      pad_to: the sizes are rounded up to multiples of this.

    Returns:
      The stacked :class:`~jaxlib_ext.samplers.milp.energy.EnergyData`, leaves with a leading
      ``len(problems)`` axis.

    Raises:
      ValueError: no problems.
    """
    if not problems:
        raise ValueError("problems: expected at least one MILP")
    return _pad_and_stack([energy_data(p) for p in problems], pad_to)


def _pad_and_stack(datas: list[EnergyData], pad_to: int) -> EnergyData:
    """``datas`` padded to common sizes (multiples of ``pad_to``), stacked on a leading axis."""
    n = _round_up(max(d.c.shape[0] for d in datas), pad_to)
    m = _round_up(max(d.A.shape[0] for d in datas), pad_to)
    return jax.tree.map(lambda *xs: jnp.stack(xs), *[pad_energy_data(d, n, m) for d in datas])


def _collect_states(key, stacked: EnergyData, num_chains, num_steps, snapshots, num_flips,
                    temperature, penalty):
    temps, pens = annealing_schedule(num_steps, temperature, penalty)
    chunk = num_steps // snapshots
    P, n = stacked.c.shape
    states, taus, lams = [], [], []
    for p in range(P):
        data = jax.tree.map(lambda a, p=p: a[p], stacked)
        z = jnp.zeros((num_chains, n)) + data.lower
        for s in range(snapshots):
            key, sub = jax.random.split(key)
            sl = slice(s * chunk, (s + 1) * chunk)
            st, _ = run_langevin(sub, data, z, temperatures=temps[sl], penalties=pens[sl],
                                 num_flips=num_flips)
            z = st.z
            states.append(np.asarray(z))
            taus.append(np.full(num_chains, float(temps[sl][-1])))
            lams.append(np.full(num_chains, float(pens[sl][-1])))
    idx = np.repeat(np.arange(P), snapshots * num_chains)
    return (idx, np.concatenate(states), np.concatenate(taus), np.concatenate(lams))


def _train_loop(model, loss_fn, batch_fn, *, steps, lr, progress, desc, checkpoint_dir,
                checkpoint_every, resume, max_seconds, metrics_path, meta, rollout=None,
                clip_norm=None):
    """Adam on ``loss_fn(model, batch_fn(t))`` through :func:`jaxlib_ext.core.loop.run_loop`;
    returns ``(model, losses)``, the per-step losses of the steps this call ran.

    With ``rollout`` (a pytree of arrays: chains that the trained model itself moves), the loss
    is ``loss_fn(model, batch, rollout) -> (loss, next_rollout)`` and the chains are part of the
    checkpointed state, so a resumed run continues them exactly. ``clip_norm``: clip the
    gradient's global norm before Adam."""
    graphdef, params = nnx.split(model, nnx.Param)
    rest = nnx.state(model, nnx.Not(nnx.Param))
    tx = optax.adam(lr)
    if clip_norm is not None:
        tx = optax.chain(optax.clip_by_global_norm(clip_norm), tx)

    @jax.jit
    def step(state, batch):
        params, opt_state = state["params"], state["opt_state"]

        def f(params):
            m = nnx.merge(graphdef, params, rest)
            if rollout is None:
                return loss_fn(m, batch), None
            return loss_fn(m, batch, state["rollout"])
        (loss, nxt), grads = jax.value_and_grad(f, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        new = {"params": optax.apply_updates(params, updates), "opt_state": opt_state}
        if rollout is not None:
            new["rollout"] = nxt
        return new, {"loss": loss}

    config = loop.LoopConfig(
        steps=steps, log_every=1, checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every if checkpoint_dir is not None else 0,
        resume=resume, metrics_path=metrics_path, progress=progress, desc=desc,
        max_seconds=max_seconds, schedule={"kind": "constant", "peak_lr": float(lr)},
        meta=meta)
    state = {"params": params, "opt_state": tx.init(params)}
    if rollout is not None:
        state["rollout"] = rollout
    res = loop.run_loop(step, state, batch_fn, config)
    nnx.update(model, res.state["params"])
    return model, np.asarray([row["loss"] for row in res.history], np.float64)


def _check_run(steps, batch_size, checkpoint_every):
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps, batch_size: expected >= 1, got {steps}, {batch_size}")
    if checkpoint_every < 0:
        raise ValueError(f"checkpoint_every: expected >= 0, got {checkpoint_every}")


def train_unsupervised(key, problems: list[MILP], *, hidden: int = 32, num_layers: int = 2,
                       steps: int = 300, batch_size: int = 32, learning_rate: float = 1e-3,
                       num_chains: int = 8, num_steps: int = 400, snapshots: int = 8,
                       num_flips: int = 4, temperature=(0.5, 0.005), penalty=(1.0, 10.0),
                       move_weight: float = 0.1, objective: str = "reinforce",
                       num_samples: int = 8, progress: bool = False, checkpoint_dir=None,
                       checkpoint_every: int = 0, resume: bool = True,
                       max_seconds: float | None = None, metrics_path=None):
    """Train a :class:`~jaxlib_ext.samplers.milp.gnn.BipartiteGNN` without labels on
    ``problems``: ``objective="reinforce"`` (T.2, ``num_samples`` moves per state) or
    ``"relaxed"`` (T.1, ``move_weight`` is its ``mu``).

    The states are collected from ``key`` before training (again on resume, alike); step
    ``t`` draws its batch and its sampled moves from ``(key, t)`` alone.

    Args:
      key: the PRNG key of the network's initialisation, the states and the batches.
      problems: the training instances (one family).
      hidden, num_layers: the network's width and depth.
      steps, batch_size, learning_rate: the Adam run (a resumed run continues up to
        ``steps``).
      num_chains, num_steps, snapshots, num_flips, temperature, penalty: the untrained
        sampler's chains whose snapshots are the training states.
      move_weight, objective, num_samples: the loss (T.1 or T.2).
      checkpoint_dir: the checkpoint folder (Orbax, the parameters and the optimiser state
        every ``checkpoint_every`` steps and at the end), or ``None`` for none.
      checkpoint_every: steps between checkpoints; ``0``: only the last step.
      resume: start from the newest checkpoint in ``checkpoint_dir``, if any (the same
        ``key``, problems and learning rate continue the same run; another learning rate
        raises :class:`~jaxlib_ext.core.schedule.ScheduleMismatchError`).
      max_seconds: stop early (with a checkpoint) after this wall time.
      metrics_path: a JSONL file of the per-step losses, or ``None``.
      progress: show a progress bar.

    Returns:
      ``(model, losses)``: the trained network and the per-step losses of the steps this call
      ran; the losses of (T.2) are the KL up to ``log Z``, whose value is the mean energy of
      the sampled next states over ``tau`` minus the entropy, plus the move term.

    Raises:
      jaxlib_ext.core.loop.NonFiniteLossError: the loss became NaN or Inf.

    References:
      Feng and Yang, Regularized Langevin Dynamics for Combinatorial Optimization, ICML 2025
      (the learned sampler and its move regulariser).
    """
    _check_run(steps, batch_size, checkpoint_every)
    if objective not in ("reinforce", "relaxed"):
        raise ValueError(f"objective: expected 'reinforce' or 'relaxed', got {objective!r}")
    stacked = stack_problems(problems)
    k_model, k_states, k_batch = jax.random.split(key, 3)
    idx, states, taus, lams = _collect_states(k_states, stacked, num_chains, num_steps, snapshots,
                                              num_flips, temperature, penalty)
    model = BipartiteGNN(hidden, num_layers, rngs=nnx.Rngs(k_model))
    batch_seed = int(jax.random.randint(k_batch, (), 0, 2**31 - 1))

    def batches(t):
        rng = np.random.default_rng([batch_seed, t])
        b = rng.integers(len(idx), size=batch_size)
        return idx[b], states[b], taus[b], lams[b], rng.integers(2**31 - 1, size=batch_size)

    def loss_fn(m, batch):
        pi, z, tau, lam, seeds = batch

        def one_reinforce(pi, z, tau, lam, seed):  # (T.2)
            data = jax.tree.map(lambda a: a[pi], stacked)
            _, _, _, g = _terms_and_grad(data, z, 0.0, 0.0, lam, 1)
            gains = coordinate_gains(data, z, 0.0, 0.0, lam)
            base, direction = flip_logits(data, z, g, tau, num_flips, gains)
            movable = jnp.isfinite(base)
            logits = jnp.where(movable, base + m(data, z, g, 0.0, lam), 0.0)
            p = jnp.where(movable, jax.nn.sigmoid(logits), 0.0)
            flips = jax.random.bernoulli(jax.random.key(seed), jax.lax.stop_gradient(p),
                                         (num_samples,) + p.shape)
            z_new = z + flips * direction
            e = jax.vmap(lambda zz: energy(data, zz, penalty=lam))(z_new)
            logq = jnp.sum(jnp.where(movable, jnp.where(flips, jax.nn.log_sigmoid(logits),
                                                        jax.nn.log_sigmoid(-logits)), 0.0), -1)
            adv = jax.lax.stop_gradient((e - e.mean()) / tau)
            ent = jnp.sum(jnp.where(movable, -p * jax.nn.log_sigmoid(logits)
                                    - (1 - p) * jax.nn.log_sigmoid(-logits), 0.0))
            n = jnp.maximum(data.var_mask.sum(), 1.0)
            keep_moving = move_weight * (p.sum() - num_flips) ** 2 / n
            # value: KL(q || pi_tau) up to log Z; gradient: score function + exact entropy
            return (jnp.mean(adv * logq) - jax.lax.stop_gradient(jnp.mean(adv * logq))
                    + jax.lax.stop_gradient(e.mean() / tau) - ent + keep_moving)

        def one(pi, z, tau, lam, seed):  # (T.1)
            data = jax.tree.map(lambda a: a[pi], stacked)
            _, _, _, g = _terms_and_grad(data, z, 0.0, 0.0, lam, 1)
            gains = coordinate_gains(data, z, 0.0, 0.0, lam)
            logits, direction = flip_logits(data, z, g, tau, num_flips, gains)
            logits = logits + m(data, z, g, 0.0, lam)
            p = jnp.where(jnp.isfinite(logits), jax.nn.sigmoid(logits), 0.0)
            z_exp = z + p * direction  # (T.1)
            n = jnp.maximum(data.var_mask.sum(), 1.0)
            return energy(data, z_exp, penalty=lam) + move_weight * (p.sum() - num_flips) ** 2 / n

        fn = one_reinforce if objective == "reinforce" else one
        return jnp.mean(jax.vmap(fn)(pi, z, tau, lam, seeds))

    meta = {"trainer": "milp.unsupervised", "hidden": hidden, "num_layers": num_layers,
            "objective": objective}
    return _train_loop(model, loss_fn, batches, steps=steps, lr=learning_rate,
                       progress=progress, desc="unsupervised GNN",
                       checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                       resume=resume, max_seconds=max_seconds, metrics_path=metrics_path,
                       meta=meta)


def train_supervised(key, problems: list[MILP], *, solutions=None, hidden: int = 32,
                     num_layers: int = 2, steps: int = 300, batch_size: int = 8,
                     learning_rate: float = 1e-3, time_limit: float = 10.0,
                     progress: bool = False, checkpoint_dir=None, checkpoint_every: int = 0,
                     resume: bool = True, max_seconds: float | None = None,
                     metrics_path=None):
    """Train the same network on HiGHS-optimal assignments (Neural Diving's labels, arXiv
    2012.13349): binary cross-entropy of the logits at the all-lower-bound state against
    ``(z* - l) / (u - l)``, averaged over the real columns. Step ``t`` draws its batch of
    problems from ``t`` alone.

    Args:
      key: the PRNG key of the network's initialisation.
      problems: the training instances (one family).
      solutions: optional list of full ``x`` vectors; by default each problem is solved with
        HiGHS under ``time_limit`` seconds (problems without a solution are skipped).
      hidden, num_layers: the network's width and depth.
      steps, batch_size, learning_rate: the Adam run (a resumed run continues up to
        ``steps``).
      time_limit: HiGHS's limit per problem, in seconds.
      checkpoint_dir: the checkpoint folder (Orbax, the parameters and the optimiser state
        every ``checkpoint_every`` steps and at the end), or ``None`` for none.
      checkpoint_every: steps between checkpoints; ``0``: only the last step.
      resume: start from the newest checkpoint in ``checkpoint_dir``, if any (the same
        ``key``, problems and learning rate continue the same run; another learning rate
        raises :class:`~jaxlib_ext.core.schedule.ScheduleMismatchError`).
      max_seconds: stop early (with a checkpoint) after this wall time.
      metrics_path: a JSONL file of the per-step losses, or ``None``.
      progress: show a progress bar.

    Returns:
      ``(model, losses)``: the trained network and the per-step losses of the steps this call
      ran.

    Raises:
      jaxlib_ext.core.loop.NonFiniteLossError: the loss became NaN or Inf.

    References:
      Nair et al., Solving Mixed Integer Programs Using Neural Networks, arXiv 2012.13349,
      sec. 4.
    """
    _check_run(steps, batch_size, checkpoint_every)
    if solutions is None:
        solutions = [solve_highs(p, time_limit=time_limit).x for p in problems]
    if len(solutions) != len(problems):
        raise ValueError(f"solutions: expected {len(problems)}, got {len(solutions)}")
    kept = [(p, x) for p, x in zip(problems, solutions) if x is not None]
    if not kept:
        raise ValueError("problems: HiGHS found no solution to learn from")
    stacked = stack_problems([p for p, _ in kept])
    n = stacked.c.shape[1]
    targets = np.zeros((len(kept), n), np.float32)
    for i, (p, x) in enumerate(kept):
        iz = p.integer_index
        lo, up = np.ceil(p.lower[iz]), np.floor(p.upper[iz])
        targets[i, : iz.size] = (x[iz] - lo) / np.maximum(up - lo, 1.0)
    targets = jnp.asarray(targets)
    model = BipartiteGNN(hidden, num_layers, rngs=nnx.Rngs(key))
    def batches(t):
        return np.random.default_rng([0, t]).integers(len(kept), size=batch_size)

    def loss_fn(m, pi):
        def one(pi):
            data = jax.tree.map(lambda a: a[pi], stacked)
            z = data.lower
            _, _, _, g = _terms_and_grad(data, z, 0.0, 0.0, 1.0, 1)
            logits = m(data, z, g, 0.0, 1.0)
            bce = optax.sigmoid_binary_cross_entropy(logits, targets[pi]) * data.var_mask
            return bce.sum() / jnp.maximum(data.var_mask.sum(), 1.0)

        return jnp.mean(jax.vmap(one)(pi))

    meta = {"trainer": "milp.supervised", "hidden": hidden, "num_layers": num_layers}
    return _train_loop(model, loss_fn, batches, steps=steps, lr=learning_rate,
                       progress=progress, desc="supervised GNN",
                       checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                       resume=resume, max_seconds=max_seconds, metrics_path=metrics_path,
                       meta=meta)


def stack_for_proposal(problems: list[MILP], *, pad_to: int = 16, num_cuts: int = 16,
                       penalty: float = 10.0, seed: int = 0) -> EnergyData:
    """:class:`EnergyData` of every problem for :func:`train_proposal`, padded and stacked.

    Pure-integer problems as :func:`stack_problems`. A problem with continuous columns frees the
    rows that hold them and carries ``num_cuts`` cuts of its elastic LP value (E.2) at
    ``penalty`` (from the all-lower, all-upper and random box assignments), so the training
    energy is the unified one of :func:`solve`: objective, penalty, and the LP value.

    Args:
      problems: the MILPs (at least one).
      pad_to: the sizes are rounded up to multiples of this.
      num_cuts: LP-value cuts per mixed instance, ``>= 2``.
      penalty: ``lam`` of the elastic LP (L.2) of the cuts.
      seed: the NumPy seed of the random box assignments of the cuts.

    Returns:
      The stacked :class:`~jaxlib_ext.samplers.milp.energy.EnergyData`.

    Raises:
      ValueError: no problems or ``num_cuts < 2``.
    """
    if not problems:
        raise ValueError("problems: expected at least one MILP")
    if num_cuts < 2:
        raise ValueError(f"num_cuts: expected >= 2, got {num_cuts}")
    rng = np.random.default_rng(seed)
    mixed = any(p.continuous_index.size for p in problems)
    datas = []
    for p in problems:
        d = energy_data(p, lp_rows=True)
        if mixed:
            lo, up = np.asarray(d.lower, np.float64), np.asarray(d.upper, np.float64)
            Z = np.where(rng.random((num_cuts, lo.size)) < 0.5, lo, up)
            Z[0], Z[1] = lo, up
            if p.continuous_index.size:
                h, a = lp_value_cuts(p, Z, penalty=penalty)
            else:
                h, a = np.zeros((num_cuts, lo.size)), np.full(num_cuts, -np.inf)
            d = with_cuts(d, h, a)
        datas.append(d)
    return _pad_and_stack(datas, pad_to)


def random_box_state(key, data: EnergyData):
    """A uniformly random integer assignment in the box ``[lower, upper]``, the proposal's start
    state.

    Args:
      key: PRNG key.
      data: the :class:`~jaxlib_ext.samplers.milp.energy.EnergyData`.

    Returns:
      ``(n,)`` the assignment (0 on padded columns).
    """
    u = jax.random.uniform(key, data.lower.shape)
    z = jnp.floor(data.lower + u * (data.upper - data.lower + 1.0))
    return jnp.clip(z, data.lower, data.upper) * data.var_mask


def train_proposal(key, problems: list[MILP], *, hidden: int = 64, num_layers: int = 3,
                   init_move_logit: float = -3.0, steps: int = 2000, num_chains: int = 32,
                   rollout_steps: int = 100, num_samples: int = 4,
                   learning_rate: float = 1e-3, num_flips: int = 4, move_weight: float = 0.1,
                   penalty=(1.0, 10.0), num_cuts: int = 16, clip_norm: float | None = 1.0,
                   progress: bool = False,
                   checkpoint_dir=None, checkpoint_every: int = 0, resume: bool = True,
                   max_seconds: float | None = None, metrics_path=None):
    """Train a :class:`~jaxlib_ext.samplers.milp.proposal.LearnedProposal` on its own rollouts.

    On-policy REINFORCE after the learned sampler of Feng and Yang (ICML 2025, RLNN): a buffer
    of ``num_chains`` chains, each on a random training instance from a uniformly random box
    state, is moved by the current proposal (P.1) one step per training step; a chain that has
    made ``rollout_steps`` moves restarts on a new instance. The penalty ``lam`` of each chain
    follows the geometric schedule ``penalty`` over its rollout, as in :func:`solve`. At every
    chain's state ``z`` the loss draws ``S = num_samples`` moves ``z'_s ~ q_theta(. | z)`` and
    rewards the one-step decrease of the unified energy (E.1)/(E.2)::

        r_s = E_lam(z) - E_lam(z'_s),   A_s = (r_s - mean_s r) / sigma
        L(theta) = -mean_s[A_s log q_theta(z'_s | z)]
                   + mu (sum_i P_theta(z_i moves) - k)^2 / n                               (T.3)

    ``mu = move_weight``, ``k = num_flips``. Our choices beside RLNN (which uses the raw reward):
    the mean over the ``S`` moves is a baseline, ``sigma`` the standard deviation of
    ``r_s - mean_s r`` over the whole batch (so the step does not scale with the instances'
    energy units), and the gradient's global norm is clipped at ``clip_norm``; the move term is
    RLNN's regulariser, divided by the column count ``n`` so that ``mu`` does not scale with the
    instance. No solution and no solver label enters (T.3); the network never sees an optimum.

    Args:
      key: the PRNG key of the initialisation, the rollouts and the sampled moves.
      problems: the training instances (one family; hundreds for a useful proposal).
      hidden, num_layers, init_move_logit: the proposal's network (:class:`LearnedProposal`).
      steps, learning_rate: the Adam run (a resumed run continues up to ``steps``).
      num_chains, rollout_steps, num_samples: the on-policy buffer and the moves per state.
      num_flips, move_weight: ``k`` and ``mu`` of (T.3).
      penalty: ``(start, end)`` of each rollout's geometric penalty schedule.
      num_cuts: LP-value cuts per mixed instance (:func:`stack_for_proposal`).
      clip_norm: the gradient's global-norm clip (``None``: no clipping).
      checkpoint_dir: the checkpoint folder (Orbax: the parameters, the optimiser state and the
        chains every ``checkpoint_every`` steps and at the end), or ``None`` for none.
      checkpoint_every: steps between checkpoints; ``0``: only the last step.
      resume: continue from the newest checkpoint in ``checkpoint_dir``, if any.
      max_seconds: stop early (with a checkpoint) after this wall time.
      metrics_path: a JSONL file of the per-step losses, or ``None``.
      progress: show a progress bar.

    Returns:
      ``(proposal, losses)``: the trained proposal and the per-step losses of the steps this
      call ran (their value is minus the mean one-step energy decrease plus the move term).

    Raises:
      ValueError: bad arguments.
      jaxlib_ext.core.loop.NonFiniteLossError: the loss became NaN or Inf.

    References:
      Feng and Yang, Regularized Langevin Dynamics for Combinatorial Optimization, ICML 2025
      (RLNN).
    """
    _check_run(steps, num_chains, checkpoint_every)
    if rollout_steps < 1 or num_samples < 2:
        raise ValueError(f"rollout_steps, num_samples: expected >= 1 and >= 2, got "
                         f"{rollout_steps}, {num_samples}")
    p0, p1 = map(float, penalty)
    if not (p0 > 0 and p1 > 0):
        raise ValueError(f"penalty: expected two positive values, got {penalty}")
    k_model, k_rollout, k_batch = jax.random.split(key, 3)
    stacked = stack_for_proposal(problems, num_cuts=num_cuts, penalty=p1,
                                 seed=int(jax.random.randint(k_batch, (), 0, 2**31 - 1)))
    num_problems = stacked.c.shape[0]
    proposal = LearnedProposal(hidden, num_layers, init_move_logit=init_move_logit,
                               rngs=nnx.Rngs(k_model))
    # every chain starts "finished", so the first step draws its instance and start state
    rollout = {"z": jnp.zeros((num_chains, stacked.c.shape[1])),
               "age": jnp.full((num_chains,), rollout_steps, jnp.int32),
               "instance": jnp.zeros((num_chains,), jnp.int32)}
    base_seed = int(jax.random.randint(k_rollout, (), 0, 2**31 - 1))

    def batches(t):
        return np.asarray([base_seed, t], np.uint32)

    def loss_fn(m, seed, roll):
        key = jax.random.fold_in(jax.random.key(seed[0]), seed[1])
        k_inst, k_start, k_moves = jax.random.split(key, 3)
        restart = roll["age"] >= rollout_steps
        inst = jnp.where(restart, jax.random.randint(k_inst, (num_chains,), 0, num_problems),
                         roll["instance"])
        data = jax.tree.map(lambda a: a[inst], stacked)
        z = jnp.where(restart[:, None],
                      jax.vmap(random_box_state)(jax.random.split(k_start, num_chains), data),
                      roll["z"])
        age = jnp.where(restart, 0, roll["age"])
        lam = p0 * (p1 / p0) ** (age / max(rollout_steps - 1, 1))

        def one(key, data, z, lam):  # (T.3) at one chain's state, before the batch scale
            e0, _, _, g = _terms_and_grad(data, z, 0.0, 0.0, lam, 1)
            logp = move_log_probs(m(data, z, g, 0.0, lam), data, z)
            idx = jax.random.categorical(key, jax.lax.stop_gradient(logp), axis=-1,
                                         shape=(num_samples,) + z.shape)
            z_new = z + (idx - 1).astype(z.dtype)
            reward = e0 - jax.vmap(lambda zz: energy(data, zz, penalty=lam))(z_new)
            logq = jnp.sum(jnp.take_along_axis(logp[None], idx[..., None], -1)[..., 0], -1)
            p_move = jnp.sum((1.0 - jnp.exp(logp[:, 1])) * data.var_mask)
            n = jnp.maximum(data.var_mask.sum(), 1.0)
            moves = move_weight * (p_move - num_flips) ** 2 / n
            return reward, logq, moves, z_new[0]

        reward, logq, moves, z_next = jax.vmap(one)(
            jax.random.split(k_moves, num_chains), data, z, lam)
        centred = reward - reward.mean(axis=1, keepdims=True)
        adv = jax.lax.stop_gradient(centred / (jnp.sqrt(jnp.mean(centred**2)) + 1e-8))
        surrogate = -jnp.mean(adv * logq)
        # value: minus the mean one-step decrease (and the move term); gradient: (T.3)
        loss = (surrogate - jax.lax.stop_gradient(surrogate)
                - jax.lax.stop_gradient(reward.mean()) + jnp.mean(moves))
        nxt = {"z": jax.lax.stop_gradient(z_next), "age": age + 1, "instance": inst}
        return loss, nxt

    meta = {"trainer": "milp.proposal", **proposal.config()}
    return _train_loop(proposal, loss_fn, batches, steps=steps, lr=learning_rate,
                       progress=progress, desc="learned proposal",
                       checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                       resume=resume, max_seconds=max_seconds, metrics_path=metrics_path,
                       meta=meta, rollout=rollout, clip_norm=clip_norm)
