"""jaxlib_ext.models.mqar: the MQAR batch answers its queries from its own context."""

import jax
import numpy as np
import pytest

from jaxlib_ext.models.mqar import mqar_batch, mqar_length


def test_mqar_queries_are_answered_by_the_context():
    tokens, mask = mqar_batch(jax.random.key(0), batch=5, n_keys=16, n_pairs=6, n_queries=4)
    tokens, mask = np.asarray(tokens), np.asarray(mask)
    length = mqar_length(6, 4)
    assert tokens.shape == (5, length) and tokens.dtype == np.int32
    assert mask.shape == (5, length - 1) and mask.sum() == 5 * 4
    for row, m in zip(tokens, mask, strict=True):
        keys, values = row[:12:2], row[1:12:2]
        assert len(set(keys)) == 6 and keys.max() < 16 and values.min() >= 16
        stored = dict(zip(keys, values, strict=True))
        for t in np.flatnonzero(m):  # position t holds a query key, t + 1 its answer
            assert t >= 12 and row[t + 1] == stored[row[t]]


def test_mqar_is_a_pure_function_of_the_key():
    a = mqar_batch(jax.random.key(3), batch=2)
    b = mqar_batch(jax.random.key(3), batch=2)
    np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch=0), "batch"),
    (dict(batch=2, n_keys=4, n_pairs=5), "n_pairs"),
    (dict(batch=2, n_pairs=3, n_queries=4), "n_queries"),
])
def test_mqar_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mqar_batch(jax.random.key(0), **kwargs)
