"""SMET (arXiv 2606.00888): Adam reduction, warm-up arithmetic, topology invariants, no leaks."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlib_ext.optim import (
    SparseSlots,
    active_masks,
    keep_inactive_zero,
    scale_by_smet,
    smet,
    sparsify,
    topology_update_slots,
)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


SHAPES = {"w": (12, 8), "conv": (3, 4, 6), "bias": (8,)}


def problem(seed, steps, dtype=np.float64):
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s).astype(dtype) for k, s in SHAPES.items()}
    grads = [
        {k: rng.standard_normal(s).astype(dtype) for k, s in SHAPES.items()} for _ in range(steps)
    ]
    return params, grads


def run(opt, params, grads):
    state = opt.init(params)

    @jax.jit
    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    for g in grads:
        params, state = step(params, state, g)
    return params, state


@pytest.mark.parametrize("block_size", [1, 2])
def test_density_one_equals_adam_float64(block_size):
    with jax.enable_x64(True):
        params, grads = problem(0, 7)
        opt = smet(1e-2, 0.9, 0.99, 1e-7, density=1.0, total_steps=100, update_every=3,
                   optimizer_warmup_steps=0, block_size=block_size, key=jax.random.key(0))
        got, state = run(opt, params, grads)
        ref, _ = run(optax.adam(1e-2, 0.9, 0.99, 1e-7), params, grads)
        assert state[0].idx["conv"].shape == (72 // block_size,)  # "conv" is sparse (ndim 3)
        for k in ref:
            assert got[k].dtype == jnp.float64
            assert rel(got[k], ref[k]) < 1e-13, k


def _first_update_after_regrowth(mode):
    """Regrowth at a large global count; returns update/lr at the regrown entries."""
    lr, big = 1e-3, 30_000
    rng = np.random.default_rng(1)
    params = {"w": jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)}
    opt = smet(lr, density=0.5, total_steps=10 * big, update_every=big,
               optimizer_warmup_steps=100, lr_density_power=0.0, warmup_mode=mode,
               key=jax.random.key(3))
    state = opt.init(params)
    params = sparsify(params, state)
    inner = state[0]
    # pretend the active slots have been trained for `big` steps (b2**big ~ 1e-13)
    inner = inner._replace(count=jnp.asarray(big, jnp.int32),
                           step={"w": jnp.full_like(inner.step["w"], big)})
    state = (inner, *state[1:])
    g = {"w": jnp.asarray(rng.choice([-1.0, 1.0], size=(16, 8)) * 0.7, jnp.float32)}
    u, new_state = jax.jit(opt.update)(g, state, params)
    old, new = np.asarray(inner.idx["w"]), np.asarray(new_state[0].idx["w"])
    regrown_blocks = new[old != new]
    assert regrown_blocks.size > 0
    flat_u = np.asarray(u["w"]).reshape(-1)[regrown_blocks]
    flat_g = np.asarray(g["w"]).reshape(-1)[regrown_blocks]
    return -flat_u / lr / np.sign(flat_g)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("none", 0.1 / np.sqrt(0.001)),  # 3.162: naive DST cold start
        ("reset", 1.0),
        ("code", (0.1 * 2 / 100 / 0.19) / np.sqrt(0.001 / (1 - 0.999**2))),  # 0.0149
    ],
)
def test_first_update_magnitudes_after_regrowth(mode, expected):
    mags = _first_update_after_regrowth(mode)
    np.testing.assert_allclose(mags, expected, rtol=1e-4)
    approx = {"none": 3.162, "reset": 1.0, "code": 0.0149}[mode]
    np.testing.assert_allclose(mags, approx, rtol=2e-3)


def test_topology_update_pure_invariants():
    rng = np.random.default_rng(2)
    nb, bs, k = 40, 3, 12
    blocks = jnp.asarray(rng.standard_normal((nb, bs)), jnp.float32)
    idx = jnp.asarray(rng.choice(nb, k, replace=False), jnp.int32)
    slots = SparseSlots(
        idx=idx,
        step=jnp.asarray(rng.integers(5, 50, k), jnp.int32),
        mu=jnp.asarray(rng.standard_normal((k, bs)), jnp.float32),
        nu=jnp.asarray(rng.random((k, bs)), jnp.float32),
    )
    key = jax.random.key(7)
    new = topology_update_slots(slots, blocks, key, 0.3, 60, "code")
    again = topology_update_slots(slots, blocks, key, 0.3, 60, "code")
    other = topology_update_slots(slots, blocks, jax.random.key(8), 0.3, 60, "code")
    old_i, new_i = np.asarray(idx), np.asarray(new.idx)
    changed = old_i != new_i
    # (i) same number of distinct active blocks
    assert new_i.shape == (k,) and len(set(new_i.tolist())) == k
    # prune count: K - max(1, floor(K * 0.7)) = 12 - 8 = 4, the four smallest-L1 blocks
    assert changed.sum() == 4
    scores = np.abs(np.asarray(blocks)[old_i]).sum(-1)
    assert set(np.where(changed)[0]) == set(np.argsort(scores)[:4])
    # (iii) regrown blocks were inactive before the update (no pruned block regrows)
    assert not set(new_i[changed].tolist()) & set(old_i.tolist())
    # (iv) regrown slots: zero moments, reset step (1 in "code" mode)
    assert np.all(np.asarray(new.mu)[changed] == 0) and np.all(np.asarray(new.nu)[changed] == 0)
    assert np.all(np.asarray(new.step)[changed] == 1)
    # (v) untouched slots keep their state bit for bit
    for a, b in zip(new, slots):
        np.testing.assert_array_equal(np.asarray(a)[~changed], np.asarray(b)[~changed])
    # (vi) deterministic for a fixed key, different for another key
    for a, b in zip(new, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(np.asarray(other.idx), new_i)


def test_invariants_after_every_topology_update_end_to_end():
    rng = np.random.default_rng(4)
    params = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in SHAPES.items()}
    opt = smet(1e-2, density=0.3, total_steps=40, update_every=3, block_size=2,
               optimizer_warmup_steps=10, key=jax.random.key(5))
    state = opt.init(params)
    update = jax.jit(opt.update)
    seen_update = 0
    for t in range(13):
        g = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in SHAPES.items()}
        u, new_state = update(g, state, params)
        params = optax.apply_updates(params, u)
        masks = active_masks(new_state, params)
        for name in ("w", "conv"):
            # (ii) inactive entries exactly zero after every step
            assert np.all(np.asarray(params[name])[~np.asarray(masks[name])] == 0.0)
        assert masks["bias"] is None
        for name in ("conv", "w"):
            old, new = (SparseSlots(s[0].idx[name], s[0].step[name], s[0].mu[name],
                                    s[0].nu[name]) for s in (state, new_state))
            assert new.idx.shape == old.idx.shape  # (i)
            assert len(set(np.asarray(new.idx).tolist())) == new.idx.shape[0]
            changed = np.asarray(old.idx) != np.asarray(new.idx)
            if t > 0 and t % 3 == 0:
                seen_update += int(changed.any())
                # (iii) regrown blocks were not active before
                assert not set(np.asarray(new.idx)[changed].tolist()) & set(
                    np.asarray(old.idx).tolist()
                )
                # (iv) regrown slots had m = v = 0 and step 1, then this step: step 2, and m is
                # one fresh EMA step scaled by the warm-up 2/10
                gb = np.asarray(g[name]).reshape(-1, 2)[np.asarray(new.idx)[changed]]
                assert np.all(np.asarray(new.step)[changed] == 2)
                np.testing.assert_allclose(
                    np.asarray(new.mu)[changed], 0.1 * gb * 0.2, rtol=1e-6
                )
                np.testing.assert_allclose(np.asarray(new.nu)[changed], 0.001 * gb**2, rtol=1e-5)
                # (v) untouched slots advanced by exactly one step
                np.testing.assert_array_equal(
                    np.asarray(new.step)[~changed], np.asarray(old.step)[~changed] + 1
                )
            else:
                assert not changed.any()
        state = new_state
    assert seen_update >= 4


def test_inactive_gradients_cannot_change_state_or_updates():
    rng = np.random.default_rng(6)
    params = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in SHAPES.items()}
    opt = smet(1e-2, density=0.4, total_steps=50, update_every=2, key=jax.random.key(1))
    state = opt.init(params)
    update = jax.jit(opt.update)
    for _ in range(5):
        g = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in SHAPES.items()}
        masks = active_masks(state, params)
        # after a topology update the active set is the new one; perturb what stays inactive
        g_pert = {
            k: v if masks[k] is None else jnp.where(masks[k], v, v + 100.0 * rng.standard_normal(
                v.shape).astype(np.float32))
            for k, v in g.items()
        }
        u1, s1 = update(g, state, params)
        u2, s2 = update(g_pert, state, params)
        new_masks = active_masks(s1, params)
        for k in ("w", "conv"):
            # entries active both before and after: updates identical, state identical
            both = np.asarray(masks[k]) & np.asarray(new_masks[k])
            np.testing.assert_array_equal(np.asarray(u1[k])[both], np.asarray(u2[k])[both])
        if not any(
            (np.asarray(a) != np.asarray(b)).any()
            for a, b in zip(jax.tree.leaves(state[0].idx), jax.tree.leaves(s1[0].idx))
        ):
            for a, b in zip(jax.tree.leaves(s1), jax.tree.leaves(s2)):
                np.testing.assert_array_equal(a, b)
            for k in u1:
                np.testing.assert_array_equal(u1[k], u2[k])
        params = optax.apply_updates(params, u1)
        state = s1


def test_step_counter_saturates():
    from jaxlib_ext.optim.smet import STEP_MAX

    params = {"w": jnp.ones((4, 4))}
    opt = smet(1e-3, density=0.5, total_steps=10, key=jax.random.key(0))
    st = opt.init(params)
    step = st[0].step["w"]
    assert step.dtype == jnp.int16
    st = (st[0]._replace(step={"w": jnp.full_like(step, STEP_MAX)}), *st[1:])
    _, st = jax.jit(opt.update)(params, st, params)
    assert np.all(np.asarray(st[0].step["w"]) == STEP_MAX)


def test_state_is_compact():
    params = {"w": jnp.zeros((64, 32)), "emb": {"embedding": jnp.zeros((50, 32))}}
    for bs, d in [(1, 0.5), (4, 0.1), (16, 0.5)]:
        st = smet(1e-3, density=d, total_steps=10, block_size=bs, key=jax.random.key(0)).init(
            params
        )
        k = round(d * 64 * 32 / bs)
        assert st[0].idx["w"].shape == (k,) and st[0].step["w"].shape == (k,)
        assert st[0].mu["w"].shape == (k, bs) and st[0].nu["w"].shape == (k, bs)
        assert st[0].mu["emb"]["embedding"].shape == (50, 32)  # embedding stays dense


def test_keep_inactive_zero_around_a_custom_chain():
    """``keep_inactive_zero`` wraps any chain holding a ScaleBySmetState; the state helpers find
    it inside enclosing states."""
    rng = np.random.default_rng(8)
    params = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in SHAPES.items()}
    kw = dict(density=0.5, total_steps=20, update_every=2, key=jax.random.key(0))
    opt = optax.chain(optax.clip_by_global_norm(1.0), keep_inactive_zero(optax.chain(
        scale_by_smet(**kw), optax.add_decayed_weights(0.1), optax.scale_by_learning_rate(0.05))))
    state = opt.init(params)
    step = jax.jit(opt.update)
    for _ in range(5):
        g = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in SHAPES.items()}
        u, state = step(g, state, params)
        params = optax.apply_updates(params, u)
        masks = active_masks(state, params)
        for name in ("w", "conv"):
            assert np.all(np.asarray(params[name])[~np.asarray(masks[name])] == 0.0)
    chex.assert_trees_all_equal(sparsify(params, state), params)
    with pytest.raises(ValueError, match="ScaleBySmetState"):
        active_masks(optax.adam(1e-3).init(params), params)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(density=0.0), "density"),
        (dict(density=1.5), "density"),
        (dict(block_size=0), "block_size"),
        (dict(warmup_mode="linear"), "warmup_mode"),
        (dict(learning_rate="1e-3"), "learning_rate"),
        (dict(learning_rate=(1e-3,)), "learning_rate"),
        (dict(key=1.5), "key"),
        (dict(key=jnp.zeros(3, jnp.uint32)), "key"),
        (dict(prune_rate=1.5), "prune_rate"),
        (dict(total_steps=0), "total_steps"),
    ],
)
def test_bad_arguments(kwargs, match):
    kw = dict(learning_rate=1e-3, density=0.5, total_steps=100, key=jax.random.key(0))
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        smet(**kw)


def test_bad_block_size_and_mask():
    params = {"w": jnp.zeros((5, 3)), "b": jnp.zeros(3)}
    with pytest.raises(ValueError, match="block_size"):
        smet(1e-3, density=0.5, total_steps=10, block_size=4, key=jax.random.key(0)).init(params)
    with pytest.raises(ValueError, match="sparse_mask"):
        smet(1e-3, density=0.5, total_steps=10, sparse_mask={"w": True},
             key=jax.random.key(0)).init(params)
    with pytest.raises(ValueError, match="params"):
        opt = smet(1e-3, density=0.5, total_steps=10, key=jax.random.key(0))
        opt.update(params, opt.init(params))


def test_numpy_params_are_accepted_like_optax():
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((8, 6)).astype(np.float32)}
    tx = smet(1e-2, density=0.5, total_steps=10, key=jax.random.key(0))
    state = tx.init(params)
    grads = {"w": rng.standard_normal((8, 6)).astype(np.float32)}
    updates, _ = tx.update(grads, state, params)
    new = optax.apply_updates(params, updates)
    assert int(np.sum(np.asarray(new["w"]) != 0)) == 24  # exactly K = density * size active


def test_topology_update_ranks_near_ties_by_block_index():
    """Weights that differ only in their last bits (a data-parallel run sums gradients in
    another order) prune the same blocks: scores equal to ``RANK_BITS`` bits are ranked by
    block index."""
    from jaxlib_ext.optim.smet import RANK_BITS

    rng = np.random.default_rng(3)
    nb, bs, k = 40, 4, 12
    idx = np.asarray(rng.choice(nb, k, replace=False), np.int32)
    blocks = np.full((nb, bs), 2.0, np.float32)
    tied = idx[:8]  # eight active blocks of L1 exactly 1.0, the four others larger
    blocks[tied] = 0.25
    slots = SparseSlots(idx=jnp.asarray(idx), step=jnp.ones((k,), jnp.int32),
                        mu=jnp.zeros((k, bs)), nu=jnp.zeros((k, bs)))
    pruned = []
    for seed in range(4):
        noise = 1 + 1e-6 * np.random.default_rng(seed).standard_normal(blocks.shape)
        new = topology_update_slots(slots, jnp.asarray(blocks * noise, jnp.float32),
                                    jax.random.key(7), 0.3, 60, "code")
        pruned.append(np.asarray(idx)[np.asarray(new.idx) != idx])
    assert RANK_BITS < 20  # the 1e-6 noise lies below the resolution
    for p in pruned:  # 12 - floor(12 * 0.7) = 4: the tied blocks of smallest index
        np.testing.assert_array_equal(np.sort(p), np.sort(tied)[:4])


def test_key_forms_agree():
    """An int seed, its ``jax.random.key`` and its raw ``uint32[2]`` key draw the same masks."""
    params = {"w": jnp.ones((8, 6)), "b": jnp.zeros(6)}
    states = [smet(1e-3, density=0.5, total_steps=10, key=k).init(params)
              for k in (4, jax.random.key(4), jax.random.PRNGKey(4))]
    for state in states[1:]:
        chex.assert_trees_all_equal(state, states[0])
