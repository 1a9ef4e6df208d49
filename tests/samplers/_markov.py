"""Helper shared by the sampler tests: exact invariance of a full transition matrix.

Imported as ``tests.samplers._markov`` (pytest's importlib mode names test modules from the root
directory, so sibling modules import by that name).
"""

from __future__ import annotations

import numpy as np


def assert_boltzmann_invariant(moves, energies, temperature, atol=1e-10):
    """``pi K = pi`` for ``pi ∝ exp(-E / tau)``, where ``K`` is ``moves`` (the probabilities of
    every move to another state; the diagonal is ignored) with the rejected mass put back on the
    diagonal."""
    K = np.array(moves, np.float64)
    np.fill_diagonal(K, 0.0)
    K[np.diag_indices_from(K)] = 1.0 - K.sum(1)
    assert K.min() >= -1e-12
    E = np.asarray(energies, np.float64)
    pi = np.exp(-(E - E.min()) / temperature)
    pi /= pi.sum()
    np.testing.assert_allclose(pi @ K, pi, rtol=0, atol=atol)
