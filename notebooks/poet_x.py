# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # POET-X: training by orthogonal equivalence
#
# POET (arXiv 2506.08001) trains a weight as `W_eff = R_in W0 R_out`: the base weight `W0` stays
# fixed and only the block-diagonal rotations (conjugated by random permutations) are learned,
# so the singular values of every layer stay those of `W0`. POET-X (arXiv 2603.05500) applies
# the rotations to the activations instead of building `W_eff`, which makes it fast and light.
# Every `merge_every` steps the rotations are folded into `W0`, fresh permutations are drawn and
# the rotations restart from the identity (merge-then-reinitialize).
#
# In `jaxlib_ext`: the op `jaxlib_ext.pallas_kernels.poet.poet_linear`, the NNX layer
# `jaxlib_ext.optim.PoetLinear`, `poetize(model)` and the Optax transform `poet_x`.

# %%
# On Colab, `%pip install jaxlib-ext` from PyPI; elsewhere this cell does nothing.
import sys

if "google.colab" in sys.modules:
    from IPython import get_ipython

    get_ipython().run_line_magic("pip", "install jaxlib-ext")

# %%
import os
import warnings

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from flax import nnx

from jaxlib_ext.core import data as data_lib
from jaxlib_ext.core.memory import tree_bytes
from jaxlib_ext.models.transformer import build_transformer
from jaxlib_ext.optim import make_optimizer, poet_labels, poet_layers, prepare_model
from jaxlib_ext.pallas_kernels.poet import cayley_neumann, poet_linear

FAST = os.environ.get("FAST") == "1"
STEPS, MERGE = (30, 10) if FAST else (300, 50)
print("FAST mode" if FAST else "full mode", "| jax", jax.__version__)

# %% [markdown]
# ## 1. The op: rotations of the activations
#
# `poet_linear(x, w, theta_in, theta_out, perm_in, perm_out, block_size=b)` is `x @ W_eff`.
# Each block `G = I + 2Q + 2Q² + 2Q³ + Q⁴` (a 4th-order Cayley–Neumann map of the skew matrix
# `Q`) is orthogonal up to `-2Q⁴`: halving `Q` divides the error by 16.

# %%
b = 16
theta = 0.05 * jax.random.normal(jax.random.key(0), (1, b * (b - 1) // 2))
scales = 2.0 ** -np.arange(5)
errs = []
for s in scales:
    g = cayley_neumann(s * theta, b)[0]
    errs.append(float(jnp.linalg.norm(g.T @ g - jnp.eye(b))))
plt.figure(figsize=(4, 3))
plt.loglog(scales, errs, "o-")
plt.xlabel("scale of Q")
plt.ylabel("||GᵀG - I||")
plt.title("orthogonality error ∝ |Q|⁴")
plt.show()
print("error ratio per halving:", np.round(np.array(errs[:-1]) / np.array(errs[1:]), 1))

# %% [markdown]
# ## 2. Train the tiny Transformer with POET-X and with AdamW
#
# `prepare_model("poet_x", model, block_size=32)` replaces every dense layer of the tiny model
# (widths 128, 352, 384) by a POET layer; the recipe's optimizer trains the rotations (and the
# embedding, norms and LM head with AdamW). Same data, schedule and seed for both.

# %%
corpus = data_lib.load_corpus()
LAYER = "blocks.0.mlp.up"


def build(name):
    model = build_transformer("tiny", vocab_size=corpus.vocab_size, rngs=nnx.Rngs(0))
    return prepare_model(name, model, block_size=32) if name == "poet_x" else model


def layer_weight(model):
    if isinstance(dict(poet_layers(model)).get(LAYER), nnx.Module):
        return np.asarray(dict(poet_layers(model))[LAYER].effective_weight())
    return np.asarray(model.blocks[0].mlp.up.kernel[...])


def train(name, lr):
    model = build(name)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, STEPS // 20), STEPS, lr * 0.1)
    extra = {"merge_every": MERGE} if name == "poet_x" else {}
    tx = make_optimizer(name, sched, total_steps=STEPS, **extra)
    state = tx.init(params)

    def loss_fn(p, tokens):
        logits = nnx.merge(graphdef, p, rest)(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @jax.jit
    def step(p, s, tokens):
        loss, g = jax.value_and_grad(loss_fn)(p, tokens)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    rng = np.random.default_rng(0)
    n = corpus.train.shape[0] - 65
    before = layer_weight(nnx.merge(graphdef, params, rest))
    losses, theta_max = [], []
    for _ in range(STEPS):
        off = rng.integers(0, n, 8)
        tokens = jnp.asarray(np.stack([corpus.train[o:o + 65] for o in off]), jnp.int32)
        params, state, loss = step(params, state, tokens)
        losses.append(float(loss))
        if name == "poet_x":
            theta_max.append(float(jnp.abs(params["blocks"][0]["mlp"]["up"]["theta_in"][...]).max()))
    after = layer_weight(nnx.merge(graphdef, params, rest))
    return dict(losses=losses, theta=theta_max, before=before, after=after, params=params,
                state=state)


with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    runs = {"adamw": train("adamw", 1e-2), "poet_x": train("poet_x", 1e-2)}

# %% [markdown]
# ## 3. The spectrum of a weight before and after training
#
# AdamW moves the singular values of `blocks.0.mlp.up`; POET-X keeps those of its base weight
# (unit-norm neurons at conversion), up to the truncation's orthogonality error accumulated over
# the merges.

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3), sharey=True)
for ax, (name, r) in zip(axes, runs.items(), strict=True):
    ax.plot(np.linalg.svd(r["before"], compute_uv=False), label="before")
    ax.plot(np.linalg.svd(r["after"], compute_uv=False), "--", label=f"after {STEPS} steps")
    ax.set_title(f"{name}: singular values of {LAYER}")
    ax.set_xlabel("index")
    ax.legend()
plt.show()
for name, r in runs.items():
    sv0 = np.linalg.svd(r["before"], compute_uv=False)
    sv1 = np.linalg.svd(r["after"], compute_uv=False)
    print(f"{name}: max relative change of a singular value {np.max(np.abs(sv1 - sv0) / sv0):.2e}")

# %% [markdown]
# ## 4. The merge schedule
#
# `max |theta_in|` of that layer grows from zero and drops back to zero at every merge (dotted
# lines); the loss does not jump there, since a merge leaves the function unchanged.

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
for name, r in runs.items():
    ax1.plot(r["losses"], label=name)
ax1.set_xlabel("step")
ax1.set_ylabel("train loss")
ax1.legend()
ax2.plot(np.arange(1, STEPS + 1), runs["poet_x"]["theta"])
for m in range(MERGE, STEPS + 1, MERGE):
    ax2.axvline(m, ls=":", c="gray")
ax2.set_xlabel("step")
ax2.set_ylabel("max |theta_in|")
plt.show()

# %% [markdown]
# ## 5. Memory: what is trained and what the optimizer keeps
#
# Shapes only (`nnx.eval_shape`): bytes of the trained leaves and of the optimizer state for the
# tiny model (b = 32) and the 125m preset with byte vocabulary (b = 256). POET-X trains
# `(n + m)(b - 1) / 2` numbers per layer; the base weights carry no optimizer state.

# %%
rows = {}
for preset, bs in ([("tiny", 32)] if FAST else [("tiny", 32), ("125m", 256)]):
    for name in ("adamw", "poet_x"):
        def make(name=name, preset=preset, bs=bs):
            m = build_transformer(preset, vocab_size=256, rngs=nnx.Rngs(0))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return prepare_model(name, m, block_size=bs) if name == "poet_x" else m

        params = nnx.state(nnx.eval_shape(make), nnx.Param)
        labels = jax.tree.leaves(poet_labels(params))
        trained = sum(tree_bytes(p) for p, lab in zip(jax.tree.leaves(params), labels,
                                                      strict=True) if lab != "frozen")
        state = jax.eval_shape(make_optimizer(name, 1e-3, total_steps=100).init, params)
        rows[f"{preset} {name}"] = (trained / 2**20, tree_bytes(state) / 2**20)
fig, ax = plt.subplots(figsize=(7, 3))
x = np.arange(len(rows))
ax.bar(x - 0.2, [v[0] for v in rows.values()], 0.4, label="trained leaves (MiB)")
ax.bar(x + 0.2, [v[1] for v in rows.values()], 0.4, label="optimizer state (MiB)")
ax.set_xticks(x, list(rows))
ax.set_yscale("log")
ax.legend()
plt.show()
for k, (t, s) in rows.items():
    print(f"{k}: trained {t:.2f} MiB, optimizer state {s:.2f} MiB")

# %% [markdown]
# ## 6. Check: every path is `x @ W_eff`, and a merge keeps the function
#
# In float64: the input-centric XLA path, the Pallas kernels (interpreted on CPU) and the
# memory-saving backward against the dense `W_eff`; then the trained POET model's outputs before
# and after one more merge.

# %%
with jax.enable_x64(True):
    r = np.random.default_rng(0)
    n, m, bs = 32, 48, 16
    p = bs * (bs - 1) // 2
    args = (jnp.asarray(r.standard_normal((5, n))), jnp.asarray(r.standard_normal((n, m))),
            jnp.asarray(0.1 * r.standard_normal((n // bs, p))),
            jnp.asarray(0.1 * r.standard_normal((m // bs, p))),
            jnp.asarray(r.permutation(n)), jnp.asarray(r.permutation(m)))
    ref = poet_linear(*args, block_size=bs, method="reference")
    for method, memory in [("xla", False), ("pallas", False), ("xla", True), ("pallas", True)]:
        got = poet_linear(*args, block_size=bs, method=method, memory_saving=memory)
        err = float(jnp.linalg.norm(got - ref) / jnp.linalg.norm(ref))
        print(f"{method:6s} memory_saving={memory!s:5s}: relative error {err:.1e}")
        assert err < 1e-10

from jaxlib_ext.optim import merge_poet_layer  # noqa: E402

layer = dict(poet_layers(build("poet_x")))[LAYER]
theta_rng = np.random.default_rng(1)
layer.theta_in[...] = jnp.asarray(0.05 * theta_rng.standard_normal(layer.theta_in.shape),
                                  jnp.float32)
x = jax.random.normal(jax.random.key(2), (4, 128))
before = layer(x)
w, pin, pout = merge_poet_layer(layer.poet_base[...], layer.theta_in[...], layer.theta_out[...],
                                layer.perm_in[...], layer.perm_out[...], jax.random.key(3))
layer.poet_base[...], layer.perm_in[...], layer.perm_out[...] = w, pin, pout
layer.theta_in[...] = jnp.zeros_like(layer.theta_in[...])
err = float(jnp.linalg.norm(layer(x) - before) / jnp.linalg.norm(before))
print(f"merge: relative change of the layer output {err:.1e}")
assert err < 1e-5
assert all(np.isfinite(r["losses"]).all() for r in runs.values())
print("OK")
