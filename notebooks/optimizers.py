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
# # Memory-efficient optimizers: FOAM and SMET
#
# * **FOAM** (arXiv 2512.07112) keeps Adam's moments *folded*: block means over `2**level`
#   input features, plus the current gradient's within-block residual added back each step.
# * **SMET** (arXiv 2606.00888) trains a fixed fraction of each weight matrix (dynamic sparse
#   training) and keeps Adam state only for the active entries, with an optimizer warm-up for
#   regrown weights that removes the loss spikes of naive dynamic sparse training.
#
# Both are Optax `GradientTransformation`s in `jaxlib_ext.optim`.

# %%
# On Colab, `%pip install jaxlib-ext` from PyPI; elsewhere this cell does nothing.
import sys

if "google.colab" in sys.modules:
    from IPython import get_ipython

    get_ipython().run_line_magic("pip", "install jaxlib-ext")

# %%
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from flax import nnx

from jaxlib_ext.core import data as data_lib
from jaxlib_ext.core import sharding as sharding_lib
from jaxlib_ext.core import train as train_lib
from jaxlib_ext.models.transformer import build_transformer
from jaxlib_ext.optim import foam, make_optimizer, smet

FAST = os.environ.get("FAST") == "1"
print("FAST mode" if FAST else "full mode", "| jax", jax.__version__)

# %% [markdown]
# ## 1. Optimizer-state memory on LLaMA shapes
#
# Shapes only (`jax.eval_shape`), so nothing is allocated: the actual state pytrees that `init`
# builds, summed leaf by leaf. Embeddings and the LM head keep full Adam state in both methods.

# %%
CONFIGS = {"60m": (512, 1376, 8), "130m": (768, 2048, 12), "350m": (1024, 2736, 24),
           "1b": (2048, 5461, 24)}


def llama_shapes(size, vocab=32000):
    h, f, n = CONFIGS[size]
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    blocks = {
        str(i): {"attn": {k: {"kernel": s(h, h)} for k in "qkvo"},
                 "mlp": {"gate": {"kernel": s(h, f)}, "up": {"kernel": s(h, f)},
                         "down": {"kernel": s(f, h)}},
                 "norm1": {"scale": s(h)}, "norm2": {"scale": s(h)}}
        for i in range(n)
    }
    return {"embed": {"embedding": s(vocab, h)}, "blocks": blocks,
            "lm_head": {"kernel": s(h, vocab)}}


def state_mib(opt, params):
    st = jax.eval_shape(opt.init, params)
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(st)) / 2**20


key = jax.random.key(0)
optimizers = {
    "adamw": optax.adamw(1e-3),
    "foam l=2": foam(1e-3, level=2),
    "foam l=4": foam(1e-3, level=4),
    "smet d=0.5": smet(1e-3, density=0.5, total_steps=1000, key=key),
    "smet d=0.1, bs=16": smet(1e-3, density=0.1, total_steps=1000, block_size=16, key=key),
}
sizes = ["60m", "350m"] if FAST else list(CONFIGS)
mib = {size: {n: state_mib(o, llama_shapes(size)) for n, o in optimizers.items()}
       for size in sizes}

fig, ax = plt.subplots(figsize=(8, 3.5))
width = 0.8 / len(optimizers)
for j, name in enumerate(optimizers):
    ratios = [mib[s][name] / mib[s]["adamw"] for s in sizes]
    ax.bar(np.arange(len(sizes)) + j * width, ratios, width, label=name)
ax.set_xticks(np.arange(len(sizes)) + 0.4 - width / 2, [f"LLaMA-{s}" for s in sizes])
ax.set_ylabel("optimizer state / AdamW")
ax.legend(fontsize=8)
ax.set_title("Whole-model optimizer state (embeddings and LM head stay dense)")
plt.show()

# %% [markdown]
# ## 2. Training the tiny Transformer
#
# Same init, data and schedule for AdamW, FOAM (level 2), SMET (density 0.5) and naive dynamic
# sparse training (regrown weights use the global Adam step, no warm-up). Byte tokens of the
# embedded corpus.
#
# One learning rate shared by every optimizer can decide a comparison by itself, so each one
# trains at its own best peak rate: the one picked by validation loss on the grid
# {3e-4, 1e-3, 3e-3, 1e-2} x 3 seeds of `benchmarks/optim_foam_smet_training.py`. The curves
# below are one seed and illustrate; the verdict, with its spread over seeds, is that script's
# table in BENCHMARKS.md.

# %%
corpus = data_lib.load_corpus()
STEPS, BATCH, SEQ, EVERY = (40, 4, 32, 10) if FAST else (300, 8, 64, 50)
overrides = dict(d_model=64, n_layers=1, n_heads=2, head_dim=32) if FAST else {}


# The library's recipes (`jaxlib_ext.optim.make_optimizer`), as in the training benchmark: every
# optimizer with b2 = 0.95 and no gradient clipping; naive DST is SMET with the global Adam step
# for regrown weights ("none" warm-up) and no density lr scale.
VARIANTS = {
    "adamw": ("adamw", {}),
    "foam": ("foam", {}),
    "smet": ("smet", {}),
    "naive DST": ("smet", {"warmup_mode": "none", "lr_density_power": 0.0}),
}


def make_tx(name, lr):
    recipe, hyperparams = VARIANTS[name]
    if recipe == "smet":
        hyperparams = dict(hyperparams, density=0.5, update_every=EVERY,
                           optimizer_warmup_steps=min(100, EVERY))
    return make_optimizer(recipe, lr, total_steps=STEPS, key=1, clip_norm=None, b2=0.95,
                          **hyperparams)


#: each optimizer's best peak learning rate on the benchmark's grid (tiny Transformer, 300 steps)
BEST_LR = {"adamw": 1e-3, "foam": 3e-3, "smet": 3e-3, "naive DST": 3e-3}


def train(name, lr=None, seed=0):
    lr = BEST_LR[name] if lr is None else lr
    model = build_transformer("tiny", vocab_size=corpus.vocab_size, rngs=nnx.Rngs(seed),
                              **overrides)
    tx = make_tx(name, optax.warmup_cosine_decay_schedule(0.0, lr, max(1, STEPS // 20), STEPS,
                                                          lr * 0.1))
    # the library's LM step (`jaxlib_ext.core.train`): float32 next-token cross-entropy
    graphdef, rest, state = train_lib.init_state(model, tx, seed)
    mesh = sharding_lib.make_mesh("data=1", jax.devices()[:1])
    batch_sh = sharding_lib.batch_sharding(mesh)
    state_sh = train_lib.train_state_shardings(state, mesh)
    loss_fn = train_lib.make_loss_fn(graphdef, rest)
    step = train_lib.make_train_step(tx, loss_fn, state_sh, batch_sh)
    eval_fn = train_lib.make_eval_step(loss_fn, state_sh.params, batch_sh)
    # the step donates the state: copies, so that no buffer is donated twice
    state = jax.device_put(jax.tree.map(jnp.copy, state), state_sh)

    rng = np.random.default_rng(seed)
    n = corpus.train.shape[0] - SEQ - 1
    win = lambda offs: jnp.asarray(np.stack([corpus.train[o:o + SEQ + 1] for o in offs]))  # noqa
    fixed = win(rng.integers(0, n, BATCH))
    losses, fixed_losses = [], [float(eval_fn(state.params, fixed))]
    for _ in range(STEPS):
        state, metrics = step(state, win(rng.integers(0, n, BATCH)))
        losses.append(float(metrics["loss"]))
        # the same fixed batch after every update, for section 3's topology-update jumps
        fixed_losses.append(float(eval_fn(state.params, fixed)))
    return np.array(losses), np.array(fixed_losses)


runs = {name: train(name) for name in VARIANTS}

fig, ax = plt.subplots(figsize=(8, 3.5))
for name, (losses, _) in runs.items():
    smooth = np.convolve(losses, np.ones(5) / 5, mode="valid")
    ax.plot(np.arange(len(smooth)) + 5, smooth, label=name)
ax.set_xlabel("step")
ax.set_ylabel("train loss (5-step mean)")
ax.legend()
plt.show()

# %% [markdown]
# ## 3. Loss right after topology updates
#
# Loss on one fixed batch after every step; dashed lines mark the topology updates (prune the
# smallest 20% of active weights by magnitude, regrow as many at random). The "jump" is the
# largest rise within 10 steps after an update.

# %%
topo = list(range(EVERY, STEPS, EVERY))
fig, ax = plt.subplots(figsize=(8, 3.5))
for name in ("naive DST", "smet"):
    ax.plot(runs[name][1], label=name)
for c in topo:
    ax.axvline(c, color="gray", ls="--", lw=0.8)
ax.set_xlabel("step")
ax.set_ylabel("loss on a fixed batch")
ax.legend()
plt.show()
for name in ("naive DST", "smet"):
    fl = runs[name][1]
    jumps = [max(fl[c + 1:c + 11]) - fl[c] for c in topo]
    print(f"{name:10s} jumps after updates: {np.round(jumps, 4)}")

# %% [markdown]
# ## 4. Check: both reduce to Adam
#
# FOAM with `level=0` (no folding) and `eps=0`, and SMET at density 1 without topology updates or
# warm-up, must reproduce `optax.adam` (float64).

# %%
with jax.enable_x64(True):
    rng = np.random.default_rng(0)
    p0 = {"w": rng.standard_normal((6, 4)), "b": rng.standard_normal(4)}
    gs = [{k: rng.standard_normal(v.shape) for k, v in p0.items()} for _ in range(5)]

    def run(tx):
        p, s = p0, tx.init(p0)
        for g in gs:
            u, s = tx.update(g, s, p)
            p = optax.apply_updates(p, u)
        return p

    ref = run(optax.adam(1e-2, eps=0.0))
    got_foam = run(foam(1e-2, eps=0.0, level=0))
    got_smet = run(smet(1e-2, eps=0.0, density=1.0, total_steps=10, optimizer_warmup_steps=0,
                        key=jax.random.key(0)))
    for k in ref:
        err_f = np.linalg.norm(got_foam[k] - ref[k]) / np.linalg.norm(ref[k])
        err_s = np.linalg.norm(got_smet[k] - ref[k]) / np.linalg.norm(ref[k])
        print(f"{k}: FOAM vs Adam {err_f:.1e}, SMET vs Adam {err_s:.1e}")
        assert err_f < 1e-12 and err_s < 1e-12
assert all(np.isfinite(r[0]).all() for r in runs.values())
print("OK")
