"""The bipartite GNN, its unsupervised and supervised training, the learned sampler and the
Neural Diving baseline."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.core.schedule import ScheduleMismatchError
from jaxlib_ext.samplers import milp


@pytest.fixture(scope="module")
def family():
    return [milp.set_cover(200 + i, n_rows=15, n_cols=30) for i in range(4)]


def test_gnn_shapes_zero_head_and_padding(family):
    d = milp.pad_energy_data(milp.energy_data(family[0]), 32, 32)
    model = milp.BipartiteGNN(hidden=8, num_layers=2, rngs=nnx.Rngs(0))
    z = jnp.zeros(32)
    g = jax.grad(lambda z: milp.energy(d, z))(z)
    out = nnx.jit(lambda m, d, z, g: m(d, z, g))(model, d, z, g)
    assert out.shape == (32,) and np.all(np.asarray(out) == 0.0)  # zero-initialised head
    var_x, con_x = jax.jit(milp.node_features)(d, z, g)
    assert var_x.shape == (32, 7) and con_x.shape == (32, 5)
    assert np.all(np.asarray(var_x[30:]) == 0.0)  # padded columns carry nothing
    with pytest.raises(ValueError, match="hidden"):
        milp.BipartiteGNN(hidden=0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="max_logit"):
        milp.BipartiteGNN(max_logit=0.0, rngs=nnx.Rngs(0))


def test_gnn_bias_inside_jitted_sampler(family):
    d = milp.energy_data(family[0])
    model = milp.BipartiteGNN(hidden=8, rngs=nnx.Rngs(1))
    graphdef, params = nnx.split(model)
    fn = milp.gnn_bias_fn(graphdef)
    assert milp.gnn_bias_fn(graphdef) is fn  # cached: one compilation per graphdef
    t, pn = milp.annealing_schedule(10)
    state, _ = milp.run_langevin(jax.random.key(0), d, jnp.zeros((3, 30)), temperatures=t,
                                 penalties=pn, bias_fn=fn, bias_params=params)
    plain, _ = milp.run_langevin(jax.random.key(0), d, jnp.zeros((3, 30)), temperatures=t,
                                 penalties=pn)
    # an untrained network adds zero logits: the learned sampler starts as the plain one
    np.testing.assert_array_equal(np.asarray(state.z), np.asarray(plain.z))


def test_unsupervised_training_and_learned_solve(family):
    model, losses = milp.train_unsupervised(jax.random.key(0), family, hidden=8, steps=10,
                                            batch_size=8, num_chains=4, num_steps=40,
                                            snapshots=2, num_samples=4)
    assert losses.shape == (10,) and np.isfinite(losses).all()
    assert np.abs(np.asarray(nnx.state(model.head)["kernel"][...])).max() > 0  # it trained
    p = milp.set_cover(9, n_rows=15, n_cols=30)
    r = milp.solve(p, time_limit=60.0, num_chains=4, max_rounds=1, model=model,
                   steps_per_round=100)
    assert r.feasible and milp.check_solution(p, r.x).feasible
    assert r.rule == "langevin-rld+gnn"
    with pytest.raises(ValueError, match="model"):
        milp.solve(p, model=model, rule="dmala")
    with pytest.raises(ValueError, match="objective"):
        milp.train_unsupervised(jax.random.key(0), family, objective="mse")


def test_supervised_training_fits_labels_and_dives(family):
    model, losses = milp.train_supervised(jax.random.key(0), family, hidden=16, steps=60,
                                          batch_size=4, learning_rate=3e-3)
    assert losses[:5].mean() > losses[-5:].mean() + 0.05  # the BCE falls on the training set
    p = family[0]
    z_hat, conf = milp.predict_assignment(p, model)
    assert z_hat.shape == (30,) and np.all((z_hat == 0) | (z_hat == 1))
    assert np.all((conf >= 0) & (conf <= 0.5))
    r = milp.neural_diving(p, model, time_limit=30.0)
    assert r.feasible and milp.check_solution(p, r.x).feasible and r.rule == "neural-diving"
    assert r.objective >= milp.solve_highs(p).objective - 1e-9
    with pytest.raises(ValueError, match="coverage"):
        milp.neural_diving(p, model, coverage=1.5)
    with pytest.raises(ValueError, match="solutions"):
        milp.train_supervised(jax.random.key(0), family, solutions=[None])


# the default run checks this trainer's resume (bit-equal to one run) and its refusal of another
# schedule in tests/runtime/test_trainers.py
@pytest.mark.slow
def test_supervised_training_resumes_from_its_checkpoint(family, tmp_path):
    """Two steps, then a resume to four, end where four steps in one go end; another learning
    rate on the same folder is refused."""
    labels = [milp.solve_highs(p).x for p in family]
    kw = dict(solutions=labels, hidden=4, num_layers=1, batch_size=2, learning_rate=1e-2)
    whole, lw = milp.train_supervised(jax.random.key(0), family, steps=4, **kw)
    ck = tmp_path / "ck"
    _, l1 = milp.train_supervised(jax.random.key(0), family, steps=2, checkpoint_dir=ck,
                                  checkpoint_every=1, **kw)
    part, l2 = milp.train_supervised(jax.random.key(0), family, steps=4, checkpoint_dir=ck,
                                     **kw)
    assert l1.shape == (2,) and l2.shape == (2,)
    np.testing.assert_array_equal(np.concatenate([l1, l2]), lw)
    for a, b in zip(jax.tree.leaves(nnx.state(whole, nnx.Param)),
                    jax.tree.leaves(nnx.state(part, nnx.Param))):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ScheduleMismatchError):
        milp.train_supervised(jax.random.key(0), family, steps=4, checkpoint_dir=ck,
                              **{**kw, "learning_rate": 2e-2})


def test_stack_problems_pads_to_common_shape(family):
    stacked = milp.stack_problems(family + [milp.set_cover(1, n_rows=10, n_cols=20)])
    assert stacked.c.shape == (5, 32) and stacked.A.shape[0] == 5
    assert float(stacked.var_mask[4].sum()) == 20
    with pytest.raises(ValueError, match="problems"):
        milp.stack_problems([])
