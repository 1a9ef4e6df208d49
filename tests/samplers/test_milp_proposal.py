"""The learned proposal (P.1): the network is the proposal; its MH form (P.2) is exact; on-policy
training (T.3) improves it beyond the seeds' spread on held-out instances; saving and loading."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.samplers import milp
from tests.samplers._markov import assert_boltzmann_invariant


def _random_head(proposal, seed=0, scale=1.0):
    """Give the zero-initialised head random weights, so the proposal depends on the state."""
    head = proposal.gnn.head
    rng = np.random.default_rng(seed)
    head.kernel[...] = jnp.asarray(scale * rng.normal(size=head.kernel[...].shape),
                                   head.kernel[...].dtype)
    return proposal


def _tiny(n=4, seed=1, upper=1):
    rng = np.random.default_rng(seed)
    return milp.make_milp(rng.normal(size=n), rng.integers(-1, 3, size=(2, n)).astype(float),
                          row_upper=[2.0, 3.0], upper=float(upper), integrality=np.ones(n, bool))


@pytest.mark.parametrize("n, upper", [(4, 1), (3, 2)])
def test_metropolised_proposal_leaves_target_invariant(n, upper):
    """pi K = pi for the full transition matrix of (P.1) + (P.2) with a state-dependent network
    (binary and general-integer boxes), to 1e-10."""
    with jax.enable_x64(True):
        d = milp.energy_data(_tiny(n, upper=upper), dtype=jnp.float64)
        prop = _random_head(milp.LearnedProposal(8, 2, rngs=nnx.Rngs(0)))
        prop = jax.tree.map(lambda a: a.astype(jnp.float64) if hasattr(a, "dtype") else a, prop)
        tau, lam = 0.7, 1.3
        states = jnp.asarray(list(itertools.product(range(upper + 1), repeat=n)), jnp.float64)
        e_fn = lambda z: milp.energy(d, z, penalty=lam)  # noqa: E731
        E, G = jax.vmap(e_fn)(states), jax.vmap(jax.grad(e_fn))(states)
        logp = jax.vmap(lambda z, g: milp.move_log_probs(prop(d, z, g, 0.0, lam), d, z))(
            states, G)

        def log_q(i, j):  # log q(states[j] | states[i]) of (P.1)
            step = states[j] - states[i]
            ok = jnp.all(jnp.abs(step) <= 1)
            idx = jnp.clip(step + 1, 0, 2).astype(jnp.int32)
            lq = jnp.sum(jnp.take_along_axis(logp[i], idx[:, None], -1))
            return jnp.where(ok, lq, -jnp.inf)

        ii, jj = np.meshgrid(np.arange(len(states)), np.arange(len(states)), indexing="ij")
        fwd = jax.vmap(jax.vmap(log_q))(ii, jj)
        log_a = jnp.minimum(0.0, -(E[None, :] - E[:, None]) / tau + fwd.T - fwd)
        K = jnp.where(jnp.isfinite(fwd), jnp.exp(fwd + log_a), 0.0)
        np.testing.assert_allclose(np.exp(np.asarray(fwd)).sum(1), 1.0, atol=1e-12)
        assert_boltzmann_invariant(K, E, tau)


def test_metropolised_kernel_samples_the_target():
    """The jitted "learned-mh" kernel's final states over 4096 chains follow pi_tau."""
    n, tau, lam = 3, 0.8, 1.0
    d = milp.energy_data(_tiny(n, seed=3))
    prop = _random_head(milp.LearnedProposal(8, 2, rngs=nnx.Rngs(1)), seed=2)
    gd, params = nnx.split(prop)
    T = 400  # the lazy proposal moves about 0.08 columns per step: a few hundred steps mix
    state, info = milp.run_langevin(
        jax.random.key(0), d, jnp.zeros((4096, n)), temperatures=jnp.full(T, tau),
        penalties=jnp.full(T, lam), rule="learned-mh", proposal_fn=milp.gnn_bias_fn(gd),
        proposal_params=params)
    states = np.asarray(list(itertools.product((0, 1), repeat=n)), np.float32)
    E = np.asarray(jax.vmap(lambda z: milp.energy(d, z, penalty=lam))(jnp.asarray(states)))
    pi = np.exp(-(E - E.min()) / tau)
    pi /= pi.sum()
    z = np.asarray(state.z)
    freq = np.array([(z == s).all(1).mean() for s in states])
    assert 0.5 * np.abs(freq - pi).sum() < 0.03
    assert 0.05 < float(np.asarray(info.accepted).mean()) < 1.0


def test_untrained_proposal_is_a_lazy_walk_and_checks_its_arguments():
    d = milp.pad_energy_data(milp.energy_data(milp.set_cover(0, n_rows=15, n_cols=30)), 32, 16)
    prop = milp.LearnedProposal(8, 2, rngs=nnx.Rngs(0))
    z = jnp.zeros(32)
    out = prop(d, z, jnp.zeros(32))
    assert out.shape == (32, 2)
    logp = np.asarray(milp.move_log_probs(out, d, z))
    assert np.all(np.isneginf(logp[:, 0]))  # at the lower bound nothing moves down
    assert np.all(logp[30:, 1] == 0.0)  # padded columns stay
    np.testing.assert_allclose(np.exp(logp[:30, 2]), jax.nn.sigmoid(-3.0), rtol=1e-5)
    gd, params = nnx.split(prop)
    t, pn = milp.annealing_schedule(5)
    with pytest.raises(ValueError, match="proposal_fn"):
        milp.run_langevin(jax.random.key(0), d, jnp.zeros((2, 32)), temperatures=t,
                          penalties=pn, rule="learned")
    with pytest.raises(ValueError, match="proposal_fn"):
        milp.build_kernel("rld", proposal_fn=milp.gnn_bias_fn(gd))
    with pytest.raises(ValueError, match="rollout_steps"):
        milp.train_proposal(jax.random.key(0), [milp.set_cover(0, n_rows=5, n_cols=8)],
                            num_samples=1)


def _best_objective(proposal, problems, key, steps=150, chains=8):
    """Mean over ``problems`` of the best row-feasible objective (units of S) that the learned
    sampler finds from random box states."""
    gd, params = nnx.split(proposal)
    fn = milp.gnn_bias_fn(gd)
    t, pn = milp.annealing_schedule(steps, penalty=(1.0, 10.0))
    data = milp.stack_for_proposal(problems)
    best = []
    for i in range(len(problems)):
        d = jax.tree.map(lambda a, i=i: a[i], data)
        keys = jax.random.split(jax.random.fold_in(key, i), chains)
        z0 = jax.vmap(milp.random_box_state, in_axes=(0, None))(keys, d)
        st, _ = milp.run_langevin(key, d, z0, temperatures=t, penalties=pn, rule="learned",
                                  proposal_fn=fn, proposal_params=params)
        best.append(float(np.min(np.asarray(st.best_objective))))
    return float(np.mean(best))


def test_on_policy_training_beats_its_untrained_start_on_held_out_instances(tmp_path):
    """(T.3), 3 seeds: every trained proposal beats the untrained one by more than the seeds'
    spread, on held-out set-cover instances; the saved proposal loads and acts the same."""
    train = [milp.set_cover(s, n_rows=12, n_cols=24) for s in range(60)]
    held_out = [milp.set_cover(1000 + s, n_rows=12, n_cols=24) for s in range(4)]
    key = jax.random.key(7)
    untrained = _best_objective(milp.LearnedProposal(16, 2, rngs=nnx.Rngs(0)), held_out, key)
    trained = []
    for seed in range(3):
        prop, losses = milp.train_proposal(jax.random.key(seed), train, hidden=16, num_layers=2,
                                           steps=300, num_chains=16, rollout_steps=50)
        assert losses.shape == (300,) and np.isfinite(losses).all()
        trained.append(_best_objective(prop, held_out, key))
    trained = np.asarray(trained)
    spread = trained.max() - trained.min()
    assert untrained - trained.max() > max(spread, 0.05 * untrained), (untrained, trained)

    path = milp.save_proposal(tmp_path / "sc", prop, {"family": "set_cover"})
    loaded = milp.load_proposal(path)
    assert _best_objective(loaded, held_out, key) == trained[-1]
    cfg = json.loads((path / "proposal.json").read_text())
    assert cfg["meta"] == {"family": "set_cover"}
    cfg["config"]["var_features"] += 2  # a proposal of another feature size
    (path / "proposal.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="var_features"):
        milp.load_proposal(path)
    with pytest.raises(FileNotFoundError, match="proposal"):
        milp.load_proposal(tmp_path / "missing")


def test_proposal_training_resumes_exactly(tmp_path):
    """The on-policy chains are checkpointed with the parameters: 6 steps, or 3 and a resumed
    3, give the same losses and parameters."""
    train = [milp.capacitated_facility_location(s, n_customers=4, n_facilities=3)
             for s in range(3)]  # a mixed family: the LP value enters through its cuts
    kw = dict(hidden=8, num_layers=1, num_chains=4, rollout_steps=4, num_cuts=4)
    full, lf = milp.train_proposal(jax.random.key(0), train, steps=6, **kw)
    milp.train_proposal(jax.random.key(0), train, steps=3, checkpoint_dir=tmp_path, **kw)
    resumed, lr = milp.train_proposal(jax.random.key(0), train, steps=6,
                                      checkpoint_dir=tmp_path, **kw)
    np.testing.assert_allclose(lr, lf[3:], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(nnx.state(full)), jax.tree.leaves(nnx.state(resumed))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_milp_train_command_saves_a_loadable_proposal(tmp_path, capsys):
    from jaxlib_ext import cli

    out = tmp_path / "sc"
    argv = ["milp-train", "--family", "setcover", "--param", "n_rows=8", "--param", "n_cols=16",
            "--instances", "4", "--steps", "4", "--chains", "4", "--rollout-steps", "2",
            "--hidden", "8", "--layers", "1", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    assert "saved the proposal" in capsys.readouterr().out
    loaded = milp.load_proposal(out)
    assert loaded.hidden == 8 and loaded.num_layers == 1
    assert json.loads((out / "proposal.json").read_text())["meta"]["family"] == "setcover"
    for bad, match in ((["--family", "knapsack"], "--family"),
                       (["--param", "n_rows"], "--param"),
                       (["--param", "width=3"], "--param")):
        assert cli.main(["milp-train", "--out", str(tmp_path / "x"), "--family", "setcover",
                         *bad, "--no-progress"]) == 2
        assert match in capsys.readouterr().err
