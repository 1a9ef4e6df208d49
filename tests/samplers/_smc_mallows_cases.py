"""Tiny targets of the SMC and Mallows kernels for the shared kernel test
(``tests/samplers/test_kernels.py``): each factory returns ``(algorithm, initial_state)``.

Imported as ``tests.samplers._smc_mallows_cases`` (see ``_markov.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlib_ext.samplers import mallows_mcmc as mm
from jaxlib_ext.samplers import smc

NUM_PARTICLES = 8
#: six complete rankings of five items, near one consensus
RANKINGS5 = np.array([[1, 2, 3, 4, 5], [2, 1, 3, 4, 5], [1, 3, 2, 4, 5], [1, 2, 4, 3, 5],
                      [1, 2, 3, 5, 4], [2, 1, 3, 5, 4]])


def gaussian(theta, x):
    """``U_theta(x) = |x - theta|^2 / 2``: ``pi_theta = N(theta, I)`` in 2-D."""
    return 0.5 * jnp.sum((x - theta) ** 2)


def _particle_system(algorithm, num):
    def initial_state(rng_key):
        return algorithm.init((jnp.zeros(2), jax.random.normal(rng_key, (num, 2))))

    return algorithm, initial_state


def sosmc(**kwargs):
    """SOSMC on the Gaussian, 8 particles, SGD."""
    alg = smc.sosmc(gaussian, optax.sgd(0.1), num_particles=NUM_PARTICLES, step_size=0.3,
                    **kwargs)
    return _particle_system(alg, NUM_PARTICLES)


def impdiff():
    alg = smc.impdiff(gaussian, optax.sgd(0.1), num_particles=NUM_PARTICLES, step_size=0.3)
    return _particle_system(alg, NUM_PARTICLES)


def soul():
    alg = smc.soul(gaussian, optax.sgd(0.1), num_inner_steps=4, burn_in=1, step_size=0.3)
    return _particle_system(alg, 1)


def move(name):
    """One move of :mod:`jaxlib_ext.samplers.smc.moves` as a chain on ``N(0, I)``."""
    alg = smc.move_algorithm(name, gaussian, jnp.zeros(2), 0.3)
    return alg, lambda rng_key: alg.init(jax.random.normal(rng_key, (2,)))


def mallows(**kwargs):
    """Leap-and-shift MH on six rankings of five items, alpha updated."""
    alg = mm.mallows_mh(RANKINGS5, alpha=2.0, leap_size=2, update_alpha=True, sigma_alpha=0.5,
                        rho_steps=3, **kwargs)
    return alg, lambda rng_key: alg.init(
        {"rho": jax.random.permutation(rng_key, 5).astype(jnp.int32) + 1})
