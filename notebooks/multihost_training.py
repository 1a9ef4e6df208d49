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
# # Sharded training on 8 simulated devices
#
# `jaxlib_ext` trains with `jax.jit` and explicit shardings: parameters carry logical axis
# names (`embed`, `mlp`, `vocab`, ...), a rule table maps them onto mesh axes
# (`data`, `fsdp`, `tensor`), and XLA inserts the collectives. Here 8 CPU devices stand in
# for a pod slice; on several hosts the same code runs after `jaxlib_ext.core.distributed.initialize`.

# %%
# On Colab, `%pip install jaxlib-ext` from PyPI; elsewhere this cell does nothing.
import sys

if "google.colab" in sys.modules:
    from IPython import get_ipython

    get_ipython().run_line_magic("pip", "install jaxlib-ext")

# %%
import os

# Must be set before JAX starts: 8 simulated CPU devices (ignored on GPU/TPU hosts).
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
FAST = os.environ.get("FAST") == "1"

import jax
import matplotlib.pyplot as plt
import optax
from flax import nnx

from jaxlib_ext.core import data, memory, schedule, sharding, train
from jaxlib_ext.models import build_transformer

print(jax.devices())

# %% [markdown]
# ## The mesh and where a parameter lives
# `data=2,fsdp=4`: the batch is split 8 ways (over `data` and `fsdp`), and every parameter
# whose logical axis is `embed` is split 4 ways over `fsdp` (ZeRO-3 style).

# %%
n = len(jax.devices())
mesh = sharding.make_mesh("data=2,fsdp=4" if n == 8 else None)
model = build_transformer("tiny", vocab_size=256, rngs=nnx.Rngs(0))
params = nnx.state(model, nnx.Param)
shardings = sharding.param_shardings(params, mesh)
placed = jax.device_put(params, shardings)
kernel = placed["blocks"][0]["mlp"]["gate"]["kernel"].get_value()
print(kernel.shape, kernel.sharding.spec)
jax.debug.visualize_array_sharding(kernel)

# %%
print("parameters:", memory.format_bytes(memory.tree_bytes(params)))
shard = kernel.addressable_shards[0]
print(f"gate kernel {kernel.shape}: device {shard.device} holds {shard.data.shape}")

# %% [markdown]
# ## A short run
# `train.fit` builds the sharded state, compiles one step with donation, and logs metrics,
# a loss plot and Orbax checkpoints under `out_dir`. The learning-rate schedule is a
# `schedule.WarmupCosine` record: every checkpoint carries it, and a resumed run
# (`resume=True`) with another schedule stops with `ScheduleMismatchError`.

# %%
corpus = data.load_corpus()
steps = 40 if FAST else 200
lr = schedule.warmup_cosine(3e-3, steps, warmup=10)  # recorded with every checkpoint
cfg = train.TrainConfig(
    steps=steps, batch_size=16, seq_len=64 if FAST else 128,
    eval_every=20 if FAST else 50, eval_batches=2, log_every=5, checkpoint_every=100,
    out_dir="runs/notebook_multihost", progress=not FAST, schedule=lr,
)
tx = optax.adamw(lr.to_optax())
result = train.fit(model, tx, corpus, cfg, mesh)

# %%
entropy = data.unigram_entropy(corpus.train, 256)
steps, losses = zip(*[(r["step"], r["loss"]) for r in result.history if "loss" in r], strict=True)
plt.plot(steps, losses, label="train")
plt.plot(*zip(*result.eval_losses, strict=True), "o-", label="eval")
plt.axhline(entropy, ls="--", c="gray", label="unigram entropy")
plt.xlabel("step")
plt.ylabel("nats / byte")
plt.legend()
plt.show()

# %% [markdown]
# ## Check: the run learned more than byte frequencies, with params still sharded

# %%
final = result.eval_losses[-1][1]
print(f"eval loss {final:.3f} vs unigram entropy {entropy:.3f}")
assert final < entropy, "training should beat the unigram model"
spec = result.state.params["blocks"][0]["mlp"]["gate"]["kernel"].get_value().sharding.spec
assert n != 8 or spec == jax.P("fsdp", None), spec
