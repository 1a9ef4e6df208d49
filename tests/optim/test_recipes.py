"""The AdamW / FOAM / SMET / POET-X recipes: what each name builds, overrides and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlib_ext.optim import (
    OPTIMIZER_NAMES,
    clip_by_global_norm_merge_warmup,
    decay_mask,
    foam,
    make_optimizer,
    poet_x,
    recipe_defaults,
    smet,
)

PARAMS = {"w": jnp.linspace(-1.0, 1.0, 24).reshape(8, 3), "b": jnp.linspace(0.0, 1.0, 3)}
STEPS = 24


def _hand_built(name, lr, wd):
    """The recipes written out by hand: clipping first, then each optimizer's own decay."""
    clip = optax.clip_by_global_norm(1.0)
    if name == "adamw":
        return optax.chain(clip, optax.adamw(lr, weight_decay=wd, mask=decay_mask))
    if name == "foam":
        return optax.chain(clip, foam(lr, b1=0.9, b2=0.95, weight_decay=wd, level=2))
    if name == "poet_x":  # the authors' clipping warm-up after each merge
        warm = clip_by_global_norm_merge_warmup(1.0, merge_every=200, until=2000)
        return optax.chain(warm, poet_x(lr, weight_decay=wd, base_learning_rate=lambda c: 2 * lr(c),
                                        key=jax.random.key(3)))
    every = max(1, min(100, STEPS // 6))
    tx = smet(lr, density=0.5, total_steps=STEPS, update_every=every,
              optimizer_warmup_steps=every, key=jax.random.PRNGKey(3))
    decay = [optax.add_decayed_weights(wd)] if wd else []
    return optax.chain(clip, *decay, tx)


def _run(tx, steps=8):
    def step(carry, t):
        params, state = carry
        g = jax.tree.map(lambda p: jnp.cos(p * (t + 1.0)), params)
        u, state = tx.update(g, state, params)
        return (optax.apply_updates(params, u), state), None

    run = jax.jit(lambda p: jax.lax.scan(step, (p, tx.init(p)), jnp.arange(steps))[0])
    return run(PARAMS)


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_recipe_equals_hand_built_chain(name, wd):
    lr = optax.warmup_cosine_decay_schedule(0.0, 3e-2, 2, STEPS, 3e-3)
    got_p, got_s = _run(make_optimizer(name, lr, total_steps=STEPS, key=3, weight_decay=wd))
    ref_p, ref_s = _run(_hand_built(name, lr, wd))
    assert jax.tree.structure(got_s) == jax.tree.structure(ref_s)
    jax.tree.map(np.testing.assert_array_equal, got_p, ref_p)


def test_overrides_and_no_clipping():
    tx = make_optimizer("foam", 1e-2, total_steps=STEPS, clip_norm=None, level=1, b2=0.99)
    ref = foam(1e-2, b1=0.9, b2=0.99, level=1)
    got_p, got_s = _run(tx)
    ref_p, _ = _run(ref)
    assert got_s[0].mu["w"].shape == (4, 3)
    jax.tree.map(np.testing.assert_array_equal, got_p, ref_p)


def test_smet_warmup_follows_overridden_update_every():
    got = make_optimizer("smet", 1e-2, total_steps=STEPS, clip_norm=None, update_every=3)
    ref = smet(1e-2, density=0.5, total_steps=STEPS, update_every=3, optimizer_warmup_steps=3,
               key=jax.random.key(0))
    jax.tree.map(np.testing.assert_array_equal, _run(got)[0], _run(ref)[0])


def test_defaults_are_overridable_keys():
    for name in OPTIMIZER_NAMES:
        defaults = recipe_defaults(name, total_steps=600)
        assert all(isinstance(v, (int, float, str)) for v in defaults.values())
        make_optimizer(name, 1e-3, total_steps=600, **defaults)
    assert recipe_defaults("smet", total_steps=600)["update_every"] == 100
    assert recipe_defaults("smet", total_steps=60)["optimizer_warmup_steps"] == 10
    assert recipe_defaults("foam")["level"] == 2


def test_errors_name_the_key_the_optimizer_and_the_choices():
    with pytest.raises(ValueError, match=r"'levle'.*'foam'.*'level'"):
        make_optimizer("foam", 1e-3, total_steps=10, levle=3)
    with pytest.raises(ValueError, match=r"'sgd'.*adamw"):
        make_optimizer("sgd", 1e-3, total_steps=10)
    with pytest.raises(ValueError, match="density"):
        make_optimizer("smet", 1e-3, total_steps=10, density=1.5)
    with pytest.raises(ValueError, match="key"):
        make_optimizer("smet", 1e-3, total_steps=10, key=0.5)


def test_decay_mask_reads_nnx_metadata():
    from flax import nnx

    params = {"w": nnx.Param(jnp.ones((2, 2))), "b": nnx.Param(jnp.ones(2)),
              "g": nnx.Param(jnp.ones((2, 2)), weight_decay=False)}
    assert decay_mask(params) == {"w": True, "g": False, "b": False}
    assert decay_mask({"w": jnp.ones((2, 2)), "b": jnp.ones(2)}) == {"w": True, "b": False}
