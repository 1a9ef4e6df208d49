"""Checkpoints of state pytrees: the round trip, the metadata record, zero-size leaves, readers
beside a writer."""

import chex
import jax
import jax.numpy as jnp
import pytest

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


def test_a_reader_leaves_a_killed_save_to_the_writer(tmp_path):
    # A run killed mid-save leaves a temporary step folder. Readers opened before the resumed
    # writer must not start a second cleanup of it: two at once race on the same paths.
    tree = {"w": jnp.arange(3.0)}
    with Checkpointer(tmp_path, async_save=False) as ckpt:
        ckpt.save(2, tree)
    leftover = tmp_path / "4.orbax-checkpoint-tmp"
    (leftover / "state").mkdir(parents=True)
    for _ in range(3):
        with Checkpointer(tmp_path, read_only=True) as reader:
            assert reader.latest_step() == 2
    assert leftover.exists()
    with pytest.raises(PermissionError, match="save: .*read_only"):
        reader.save(4, tree)
    with Checkpointer(tmp_path, async_save=False) as writer:
        writer.save(4, tree)
        assert writer.all_steps() == [2, 4]
    assert not leftover.exists()
