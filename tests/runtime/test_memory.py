import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.core import memory


def test_tree_bytes_concrete_and_abstract():
    tree = {"a": jnp.zeros((3, 4), jnp.float32), "b": [np.zeros(5, np.int8)], "c": 1.5}
    assert memory.tree_bytes(tree) == 48 + 5
    abstract = jax.eval_shape(lambda: jnp.zeros((1000, 1000), jnp.bfloat16))
    assert memory.tree_bytes(abstract) == 2_000_000


def test_compiled_memory_reports_a_peak():
    f = jax.jit(lambda x: (x @ x.T).sum())
    stats = memory.compiled_memory(f.lower(jnp.ones((64, 32))).compile())
    assert stats["argument"] == 64 * 32 * 4
    assert stats["peak"] >= stats["argument"]


def test_device_stats_and_formatting():
    assert isinstance(memory.device_memory_stats(), dict)  # {} on CPU
    assert memory.format_bytes(512) == "512 B"
    assert memory.format_bytes(3 * 2**20) == "3.0 MiB"
