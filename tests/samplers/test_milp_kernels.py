"""The discrete Langevin rules as sampling algorithms (:func:`milp.discrete_langevin`): one chain
of the algorithm equals one chain of ``run_langevin`` at a constant schedule; bad inputs.

The factories ``rule_case`` and ``learned_case`` are the MILP lines of
``tests/samplers/test_kernels.py``: each returns ``(algorithm, initial_state)``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.samplers import milp


def _tiny_data():
    """Four general integers in a box under one packing row (as in test_milp_langevin)."""
    p = milp.make_milp([1.0, -2.0, 0.5, -1.0], [[1.0, 1.0, 1.0, 1.0]], row_upper=[7.0],
                       lower=[-2, 0, 1, 0], upper=[3, 4, 5, 2], integrality=np.ones(4, bool))
    return milp.energy_data(p)


def _random_box(algorithm, data):
    def initial_state(rng_key):
        return algorithm.init(milp.random_box_state(rng_key, data))

    return algorithm, initial_state


def rule_case(rule):
    """``rule`` ("dlp", "dmala" or "rld") on the tiny box problem at ``tau = 1``."""
    data = _tiny_data()
    return _random_box(milp.discrete_langevin(data, rule, temperature=1.0, penalty=2.0,
                                              window=2, step_size=0.5, num_flips=2), data)


def learned_case(metropolis=False):
    """An untrained :class:`milp.LearnedProposal` (hidden 8, one layer, moves likely) drawing
    the moves on the tiny box problem, with or without the MH test (P.2)."""
    from flax import nnx

    data = _tiny_data()
    graphdef, params = nnx.split(milp.LearnedProposal(8, 1, init_move_logit=0.0,
                                                      rngs=nnx.Rngs(0)))
    rule = "learned-mh" if metropolis else "learned"
    return _random_box(milp.discrete_langevin(data, rule, temperature=5.0, penalty=2.0,
                                              params=params,
                                              proposal_fn=milp.gnn_bias_fn(graphdef)), data)


@pytest.mark.parametrize("rule", ["dmala", "rld"])
def test_algorithm_chain_matches_run_langevin(rule):
    """``T`` steps of ``algorithm.step`` with ``run_langevin``'s keys (one chain, a constant
    temperature and penalty) visit the same states."""
    data = _tiny_data()
    tau, lam, steps = 0.7, 2.0, 20
    kw = dict(window=2, step_size=0.5, num_flips=2)
    z0 = jnp.tile(data.lower, (1, 1))
    state_ref, info_ref = milp.run_langevin(
        jax.random.key(0), data, z0, temperatures=np.full(steps, tau, np.float32),
        penalties=np.full(steps, lam, np.float32), rule=rule, **kw)
    algorithm = milp.discrete_langevin(data, rule, temperature=tau, penalty=lam, **kw)
    chain_key = jax.random.split(jax.random.key(0), 1)[0]

    @jax.jit
    def own_loop(z):
        def body(state, k):
            return algorithm.step(k, state)

        return jax.lax.scan(body, algorithm.init(z), jax.random.split(chain_key, steps))

    state, info = own_loop(z0[0])
    np.testing.assert_array_equal(state.z, state_ref.z[0])
    np.testing.assert_array_equal(info.num_moved, info_ref.num_moved[0])
    np.testing.assert_allclose(info.energy, info_ref.energy[0], rtol=1e-6)
    np.testing.assert_allclose(state.best_objective, state_ref.best_objective[0], rtol=1e-6)


def test_bad_algorithm_arguments():
    data = _tiny_data()
    with pytest.raises(ValueError, match="rule"):
        milp.discrete_langevin(data, "gibbs")
    with pytest.raises(ValueError, match="temperature"):
        milp.discrete_langevin(data, temperature=0.0)
    with pytest.raises(ValueError, match="penalty"):
        milp.discrete_langevin(data, penalty=-1.0)
    with pytest.raises(ValueError, match="proposal_fn"):
        milp.discrete_langevin(data, "learned")
    with pytest.raises(TypeError, match="data"):
        milp.discrete_langevin(milp.make_milp([1.0], [[1.0]], None, [1.0], 0.0, 1.0))
    with pytest.raises(ValueError, match="position"):
        milp.discrete_langevin(data).init(jnp.zeros(5))
