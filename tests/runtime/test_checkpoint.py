"""Checkpoints of state pytrees: the round trip, the metadata record, zero-size leaves."""

import chex
import jax
import jax.numpy as jnp

from jaxlib_ext.core.checkpoint import Checkpointer, abstract_like


def test_round_trip_keeps_zero_size_leaves_and_the_record(tmp_path):
    # Some optimizer states carry zero-size placeholders, which Orbax refuses to write.
    tree = {"w": jnp.arange(6.0).reshape(2, 3),
            "slots": (jnp.zeros((0,), jnp.int32), jnp.ones(3, jnp.bfloat16)),
            "empty": jnp.zeros((2, 0))}
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, tree, {"step": 1, "note": "x"})
        ckpt.wait()
        assert ckpt.all_steps() == [1] and ckpt.restore_meta() == {"step": 1, "note": "x"}
        target = abstract_like(tree, jax.tree.map(lambda x: x.sharding, tree))
        restored, meta = ckpt.restore(None, target)
    chex.assert_trees_all_equal_structs(restored, tree)
    chex.assert_trees_all_equal_shapes_and_dtypes(restored, tree)
    chex.assert_trees_all_equal(restored, tree)
    assert meta["note"] == "x"
