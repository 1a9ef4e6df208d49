"""One conformance test for every sampler kernel (BlackJAX's shared sampling tests in spirit).

A kernel joins with one line in ``CASES``: a name and a zero-argument factory that returns
``(algorithm, initial_state)``, where ``algorithm`` is a
:class:`jaxlib_ext.samplers.base.SamplingAlgorithm` with ``step(rng_key, state)`` and
``initial_state(rng_key)`` builds one chain's state. Every case is checked for:

- ``jit``: the compiled step runs and returns ``(State, Info)`` NamedTuples of arrays;
- key determinism: the same key gives the same draw, another key another draw;
- ``vmap`` over chains: a batched step equals the per-chain steps;
- the five-line ``lax.scan`` loop of the README.

Exact invariance on a tiny target is checked per family, where the kernel claims it
(``tests/samplers/_markov.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.samplers.base import SamplingAlgorithm, scan_kernel
from tests.samplers import _smc_mallows_cases as smc_mallows

# --- cases: smc and mallows ---------------------------------------------------------------

SMC_MALLOWS_CASES: dict[str, Callable] = {
    "smc.sosmc": smc_mallows.sosmc,
    "smc.sosmc_ula": lambda: smc_mallows.sosmc(variant="ula"),
    "smc.impdiff": smc_mallows.impdiff,
    "smc.soul": smc_mallows.soul,
    "smc.moves.ula": lambda: smc_mallows.move("ula"),
    "smc.moves.mala": lambda: smc_mallows.move("mala"),
    "smc.moves.rwm": lambda: smc_mallows.move("rwm"),
    "smc.moves.hmc": lambda: smc_mallows.move("hmc"),
    "mallows_mcmc.mallows_mh": smc_mallows.mallows,
}

# --- cases: energy prior ------------------------------------------------------------------

ENERGY_CASES: dict[str, Callable] = {
    # the factories build tiny closed-form Gaussian targets: tests/samplers/test_energy_kernels.py
    "energy.mala": (_energy := __import__("tests.samplers.test_energy_kernels",
                                          fromlist=["mala_case"])).mala_case,
    "energy.ula": _energy.ula_case,
    "energy.pc_mala_predictor_first": _energy.pc_mala_case,
    "energy.pc_corrector_first": _energy.pc_corrector_first_case,
    "energy.adaptive_per_entry": _energy.adaptive_per_entry_case,
    "energy.adaptive_per_level": _energy.adaptive_per_level_case,
    "energy.dps": _energy.dps_case,
}

# --- cases: mclc and milp -----------------------------------------------------------------

MCLC_MILP_CASES: dict[str, Callable] = {
    # tiny problems: tests/samplers/test_mclc_kernels.py and tests/samplers/test_milp_kernels.py
    "mclc.latent_dps": (_mclc := __import__("tests.samplers.test_mclc_kernels",
                                            fromlist=["latent_dps_case"])).latent_dps_case,
    "mclc.psld": _mclc.psld_case,
    "mclc.corrector": _mclc.corrector_case,
    "milp.learned": (_milp := __import__("tests.samplers.test_milp_kernels",
                                         fromlist=["learned_case"])).learned_case,
    "milp.learned_mh": lambda: _milp.learned_case(metropolis=True),
    "milp.dlp": lambda: _milp.rule_case("dlp"),
    "milp.dmala": lambda: _milp.rule_case("dmala"),
    "milp.rld": lambda: _milp.rule_case("rld"),
}

CASES: dict[str, Callable] = {**SMC_MALLOWS_CASES, **ENERGY_CASES, **MCLC_MILP_CASES}


def _is_namedtuple_of_arrays(x) -> bool:
    if not (isinstance(x, tuple) and hasattr(x, "_fields")):
        return False
    return all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(x))


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    algorithm, initial_state = CASES[request.param]()
    assert isinstance(algorithm, SamplingAlgorithm)
    return request.param, algorithm, initial_state, jax.jit(algorithm.step)


def _close(a, b, rtol=1e-5, atol=1e-6):
    jax.tree.map(lambda u, v: np.testing.assert_allclose(np.asarray(u), np.asarray(v),
                                                         rtol=rtol, atol=atol), a, b)


def test_step_is_jittable_and_returns_state_and_info(case):
    _, _, initial_state, step = case
    state = initial_state(jax.random.key(0))
    new_state, info = step(jax.random.key(1), state)
    assert _is_namedtuple_of_arrays(new_state), type(new_state)
    assert _is_namedtuple_of_arrays(info), type(info)
    assert jax.tree.structure(new_state) == jax.tree.structure(state)


def test_same_key_same_draw(case):
    _, _, initial_state, step = case
    state = initial_state(jax.random.key(0))
    a, _ = step(jax.random.key(1), state)
    b, _ = step(jax.random.key(1), state)
    c, _ = step(jax.random.key(2), state)
    _close(a, b)
    leaves_a, leaves_c = jax.tree.leaves(a), jax.tree.leaves(c)
    assert any(not np.array_equal(np.asarray(u), np.asarray(v))
               for u, v in zip(leaves_a, leaves_c, strict=True))


def test_vmap_over_chains_equals_each_chain(case):
    _, _, initial_state, step = case
    states = jax.vmap(initial_state)(jax.random.split(jax.random.key(0), 2))
    keys = jax.random.split(jax.random.key(1), 2)
    batched, _ = jax.jit(jax.vmap(step))(keys, states)
    for i in range(2):
        one, _ = step(keys[i], jax.tree.map(lambda x, i=i: x[i], states))
        # batching changes XLA's fusions and reduction orders (and they differ between CPU
        # families): equal to float32 round-off accumulated over one step, not bit for bit
        _close(jax.tree.map(lambda x, i=i: x[i], batched), one, rtol=1e-4, atol=2e-5)


def test_scan_loop(case):
    _, algorithm, initial_state, _ = case
    state = initial_state(jax.random.key(0))
    final, infos = jax.jit(lambda k, s: scan_kernel(algorithm.step, k, s, 3))(
        jax.random.key(1), state)
    assert jax.tree.structure(final) == jax.tree.structure(state)
    assert all(jnp.shape(leaf)[0] == 3 for leaf in jax.tree.leaves(infos))
