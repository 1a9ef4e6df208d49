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
# # LatentMoE and orthogonal growth of mixture-of-experts models
#
# * **LatentMoE** (arXiv 2601.18089, the MoE layer of Nemotron 3 Super/Ultra): the router sees
#   the full-width token, the routed experts run in a latent width `l < d` behind one shared
#   down-projection and one up-projection; the saving is reinvested in more experts and a
#   larger top-k. A sigmoid router with a selection-only correction bias balances the experts
#   without an auxiliary loss.
# * **Orthogonal growth** (arXiv 2510.08008): a trained MoE grows in depth (every block copied
#   right after itself) and in width (every expert duplicated, with noise on the copies).
#
# Both are in `jaxlib_ext.models`: `LatentMoE` is the feed-forward part `"latent_moe"` (or
# `"moe"`) of the composable language model `build_lm`, and `models.growth` grows its
# checkpoints.

# %%
# On Colab, `%pip install jaxlib-ext` from PyPI; elsewhere this cell does nothing.
import sys

if "google.colab" in sys.modules:
    from IPython import get_ipython

    get_ipython().run_line_magic("pip", "install jaxlib-ext")

# %%
import os
import tempfile

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

from jaxlib_ext.core import data as data_lib
from jaxlib_ext.core import sharding, train
from jaxlib_ext.models import LMConfig, build_lm
from jaxlib_ext.models.accounting import NEMOTRON_3_SUPER, hybrid_cost, moe_cost
from jaxlib_ext.models.growth import grow_model
from jaxlib_ext.models.latent_moe import LatentMoE, LatentMoEConfig
from jaxlib_ext.optim import build_optimizer

FAST = os.environ.get("FAST") == "1"
print("FAST mode" if FAST else "full mode", "| jax", jax.__version__)

corpus = data_lib.load_corpus()
mesh = sharding.make_mesh(None, devices=jax.devices()[:1])
STEPS, BATCH, SEQ = (15, 4, 32) if FAST else (200, 16, 64)
D = 64 if FAST else 128


def fit(model, steps, lr=6e-3, seed=0):
    """Trains ``model`` with AdamW; returns the train result (history, final state)."""
    tx = build_optimizer("adamw", lr, steps=steps, key=seed)
    with tempfile.TemporaryDirectory() as out:
        cfg = train.TrainConfig(steps=steps, batch_size=BATCH, seq_len=SEQ, seed=seed,
                                eval_every=steps, eval_batches=1, log_every=1,
                                checkpoint_every=10 * steps, out_dir=out, progress=False)
        result = train.fit(model, tx, corpus, cfg, mesh)
    nnx.update(model, result.state.params, result.state.model_state)  # the trained model
    return result


# %% [markdown]
# ## 1. Expert load with and without the correction bias
#
# The same tiny LatentMoE language model trained twice, once with the aux-loss-free balancing
# step after every training forward pass (`b_e += rate * sign(mean load - load_e)`) and once
# with `rate = 0`. After training, the tokens of one held-out batch are counted per expert
# (`layer.expert_load`); a balanced router gives every expert the same count. The rate (0.05)
# is large because the run is short: the router's logits grow quickly at this learning rate,
# and a bias step of 1e-3 (the layer's default) would not keep up within a few hundred steps.

# %%
base = LMConfig.from_flat("attention", "latent_moe", vocab_size=corpus.vocab_size, d_model=D,
                          n_layers=1, n_heads=2, head_dim=32, max_seq_len=SEQ, num_experts=16,
                          top_k=4, expert_dim=64, latent_dim=D // 4, router_bias_rate=5e-2)
batch = jnp.asarray(np.stack([corpus.eval[i:i + SEQ] for i in range(0, 16 * SEQ, SEQ)]))
loads = {}
for label, rate in (("with correction bias", 5e-2), ("without (rate 0)", 0.0)):
    model = build_lm(base.replace(router_bias_rate=rate), rngs=nnx.Rngs(0))
    fit(model, STEPS)
    _, metrics = model.logits_and_metrics(batch)
    loads[label] = np.asarray(model.blocks[0].mlp.expert_load[...])
    print(f"{label}: max/mean load {float(metrics['moe_load_max']):.2f}, "
          f"cv {float(metrics['moe_load_cv']):.2f}")

fig, axes = plt.subplots(1, 2, figsize=(10, 3), sharey=True)
for ax, (label, counts) in zip(axes, loads.items(), strict=True):
    ax.bar(np.arange(counts.size), counts / counts.mean())
    ax.axhline(1.0, ls="--", c="gray")
    ax.set(title=label, xlabel="expert", ylabel="load / mean load")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 2. FLOPs per token: LatentMoE vs a standard MoE
#
# Per-token forward FLOPs of one MoE layer by component (`models.accounting.moe_cost`), at
# Nemotron 3 Super's width (d = 4096): its LatentMoE (l = 1024, 512 experts, top-22, expert
# width 2688) against a standard MoE with the same expert width at d whose routed FLOPs are
# close (128 experts, top-6). The latent layer runs 22 experts for about the routed FLOPs of 6.

# %%
layers = {
    "MoE (128 experts, top-6)": moe_cost(4096, num_experts=128, top_k=6, expert_dim=2688,
                                         shared_expert_dim=5376),
    "LatentMoE (512, top-22, l=1024)": moe_cost(4096, num_experts=512, top_k=22,
                                                expert_dim=2688, latent_dim=1024,
                                                shared_expert_dim=5376),
}
parts = ["routed", "latent", "shared", "router"]
fig, ax = plt.subplots(figsize=(7, 3.5))
bottom = np.zeros(len(layers))
for part in parts:
    vals = np.array([c[part].flops / 1e9 if part in c else 0.0 for c in layers.values()])
    ax.bar(list(layers), vals, bottom=bottom, label=part)
    bottom += vals
ax.set(ylabel="GFLOPs / token (forward, one layer)")
ax.legend()
fig.tight_layout()
plt.show()
for name, c in layers.items():
    print(f"{name}: {sum(v.flops for v in c.values()) / 1e9:.3f} GFLOPs/token, "
          f"{sum(v.params for v in c.values()) / 1e9:.2f}B params")
acc = hybrid_cost(NEMOTRON_3_SUPER)
print(f"Nemotron 3 Super: {acc.params / 1e9:.1f}B params, {acc.active_params / 1e9:.1f}B active")

# %% [markdown]
# ## 3. Growth: a grown MoE vs the large shape from scratch
#
# A small standard MoE is trained (the parent), then grown by interposition (2x depth) and
# expert duplication (2x experts, top-k doubled, noise 0.01 x each expert matrix's std) and
# trained further; the large shape is trained from scratch for the same number of steps.

# %%
small = LMConfig.from_flat("attention", "moe", vocab_size=corpus.vocab_size, d_model=D,
                           n_layers=1, n_heads=2, head_dim=32, max_seq_len=SEQ, num_experts=4,
                           top_k=1, expert_dim=64)
parent = build_lm(small, rngs=nnx.Rngs(0))
parent_run = fit(parent, STEPS)
grown = grow_model(parent, noise_scale=0.01, key=jax.random.key(0))
nnx.update(grown, jax.tree.map(jnp.copy, nnx.state(grown)))  # own buffers (fit donates)
grown_run = fit(grown, STEPS, seed=1)
scratch_run = fit(build_lm(grown.cfg, rngs=nnx.Rngs(1)), STEPS, seed=1)

fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(range(1, STEPS + 1), parent_run.losses, label="parent (small)")
ax.plot(range(STEPS + 1, 2 * STEPS + 1), grown_run.losses, label="grown, continued")
ax.plot(range(STEPS + 1, 2 * STEPS + 1), scratch_run.losses, label="large, from scratch")
ax.set(xlabel="step", ylabel="train loss (nats/token)")
ax.legend()
fig.tight_layout()
plt.show()
print(f"after {STEPS} more steps: grown {grown_run.eval_losses[-1][1]:.3f}, "
      f"scratch {scratch_run.eval_losses[-1][1]:.3f} eval loss (one seed, one lr)")

# %% [markdown]
# ## 4. Check: the sorted grouped-matmul dispatch equals the dense reference
#
# The dropless `method="xla"` dispatch (tokens sorted by expert, `jax.lax.ragged_dot`) against
# `method="reference"` (every expert on every token, masked), same parameters, float32.

# %%
layer = LatentMoE(64, LatentMoEConfig(num_experts=8, top_k=3, expert_dim=32, latent_dim=16,
                                      shared_expert_dim=32, routed_scaling=2.5),
                  rngs=nnx.Rngs(0))
x = jax.random.normal(jax.random.key(1), (4, 33, 64))
y_xla, _ = layer(x)
layer.method = "reference"
y_reference, _ = layer(x)
err = float(jnp.linalg.norm(y_xla - y_reference) / jnp.linalg.norm(y_reference))
print(f"xla vs reference: relative error {err:.1e}")
assert err < 1e-5
assert all(np.isfinite(r.losses).all() for r in (parent_run, grown_run, scratch_run))
print("OK")
