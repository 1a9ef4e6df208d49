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
# # Momentum DeltaNet: recall, stability, and the chunkwise op
#
# Momentum DeltaNet (Huang et al., arXiv 2605.05838) adds a momentum state `M` to the gated
# delta rule:
#
# ```
# w_t = S_{t-1}^T p_t - v_t,   M_t = mu_t M_{t-1} + eta_t k_t w_t^T,
# S_t = alpha_t S_{t-1} - beta_t M_t,   o_t = S_t^T q_t
# ```
#
# This notebook
# 1. trains tiny MDN and Gated DeltaNet (GDN) language models on multi-query associative recall
#    (MQAR) and plots recall accuracy over training,
# 2. draws the stable region of the gates from the eigenvalues of the per-direction 2x2 system,
#    with the gates the layer actually emits on top,
# 3. checks the chunkwise-parallel op against the step-by-step recurrence.
#
# `FAST=1` shrinks everything so the notebook runs in under a minute on one CPU core.

# %%
# On Colab, `%pip install jaxlib-ext` from PyPI; elsewhere this cell does nothing.
import sys

if "google.colab" in sys.modules:
    from IPython import get_ipython

    get_ipython().run_line_magic("pip", "install jaxlib-ext")

# %%
import os
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from flax import nnx

from jaxlib_ext.core import sharding as sharding_lib
from jaxlib_ext.core import train as train_lib
from jaxlib_ext.models import (
    build_gdn,
    build_mdn,
    l2_normalize,
    momentum_eigenvalues,
)
from jaxlib_ext.models import mqar as tasks
from jaxlib_ext.pallas_kernels.mdn import momentum_delta_rule

FAST = os.environ.get("FAST") == "1"
jax.config.update("jax_default_matmul_precision", "highest")

# %% [markdown]
# ## 1. Multi-query associative recall
#
# A sequence lists `n_pairs` key-value pairs, then asks for `n_queries` of the keys again; after
# each query key the model must emit the value stored with it. Keys and values come from
# disjoint halves of the vocabulary, pairs are reshuffled in every sequence, so the only way to
# answer is to store the pairs in the recurrent state and read them back.
#
# Each model trains at its own best learning rate, picked on a grid of 3 rates x 3 seeds by
# `benchmarks/models_mdn_mqar.py`: one rate shared by both can decide the comparison by itself.
# The curves below are one seed and illustrate; the verdict, with the spread over seeds, the
# Transformer and the plateau-escape steps, is that script's table in BENCHMARKS.md.

# %%
N_KEYS = 32  # keys are tokens [0, N_KEYS); values are [N_KEYS, 2 N_KEYS)
N_PAIRS = 6 if FAST else 12
N_QUERIES = N_PAIRS
SEQ = 2 * N_PAIRS + 2 * N_QUERIES
STEPS = 30 if FAST else 600
BATCH = 32


def mqar_batch(key, batch=BATCH):
    """Tokens [B, SEQ] and a mask of the positions whose next token is an answer."""
    return tasks.mqar_batch(key, batch=batch, n_keys=N_KEYS, n_pairs=N_PAIRS,
                            n_queries=N_QUERIES)


tokens, mask = mqar_batch(jax.random.key(0), 2)
print("example:", np.asarray(tokens[0]))

# %%
# At these short lengths the step-by-step recurrence (`method="reference"`) is the cheaper path
# on CPU (and exact); section 3 checks that the chunkwise path (`"xla"`) computes the same thing.
SMALL = dict(d_model=64, n_layers=1 if FAST else 2, n_heads=2, head_dim=16, mlp_multiple_of=32,
             max_seq_len=SEQ, method="reference")


#: each model's best learning rate on the grid {1e-4, 3e-4, 1e-3, 3e-3} x 3 seeds of
#: benchmarks/models_mdn_mqar.py (this task, 600 steps of 32 sequences)
BEST_LR = {"MDN": 1e-3, "GDN": 3e-4}


def mqar_loss_fn(graphdef, rest):
    """Cross-entropy and recall accuracy on the answer positions only (`mask`): the LM loss of
    every position would mostly score the random keys and values."""

    def loss_fn(params, batch):
        tokens, mask = batch
        logits = nnx.merge(graphdef, params, rest)(tokens[:, :-1]).astype(jnp.float32)
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
        acc = (logits.argmax(-1) == tokens[:, 1:])
        # (loss, (metrics, model state)): the form the library's train step takes
        return (nll * mask).sum() / mask.sum(), ({"accuracy": (acc * mask).sum() / mask.sum()},
                                                 None)

    return loss_fn


def train_mqar(build, lr, seed=0):
    model = build("tiny", vocab_size=2 * N_KEYS, rngs=nnx.Rngs(seed), **SMALL)
    tx = optax.adamw(lr, weight_decay=0.0)
    # the library's step factory (`jaxlib_ext.core.train`); only the loss is MQAR's
    graphdef, rest, state = train_lib.init_state(model, tx, seed)
    mesh = sharding_lib.make_mesh("data=1", jax.devices()[:1])
    state_sh = train_lib.train_state_shardings(state, mesh)
    step = train_lib.make_train_step(tx, mqar_loss_fn(graphdef, rest), state_sh,
                                     sharding_lib.batch_sharding(mesh))
    # the step donates the state: copies, so that no buffer is donated twice
    state = jax.device_put(jax.tree.map(jnp.copy, state), state_sh)

    accs = []
    for i in range(STEPS):
        state, metrics = step(state, mqar_batch(jax.random.fold_in(jax.random.key(seed + 1), i)))
        accs.append(float(metrics["accuracy"]))
    return nnx.merge(graphdef, state.params, rest), np.array(accs)


t0 = time.perf_counter()
curves = {}
for name, build in (("MDN", build_mdn), ("GDN", build_gdn)):
    _, curves[name] = train_mqar(build, BEST_LR[name])
    print(f"{name}: final recall accuracy {curves[name][-20:].mean():.3f}")
print(f"training took {time.perf_counter() - t0:.1f} s")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
window = 5 if FAST else 20
for name, acc in curves.items():
    smooth = np.convolve(acc, np.ones(window) / window, mode="valid")
    ax.plot(np.arange(len(smooth)) + window - 1, smooth, label=name)
ax.axhline(1 / N_KEYS, color="gray", ls=":", label="chance")
ax.set(xlabel="training step", ylabel="MQAR recall accuracy",
       title=f"MQAR, {N_PAIRS} pairs, {N_QUERIES} queries")
ax.legend()
plt.show()

# %% [markdown]
# ## 2. Where the gates are stable
#
# Along a unit key `k` with `p = alpha k`, the memory and momentum components `s = k^T S` and
# `m = k^T M` follow a 2x2 linear system
#
# ```
# [s_t]   [alpha (1 - beta eta)  -beta mu] [s_{t-1}]
# [m_t] = [alpha eta                  mu ] [m_{t-1}]
# ```
#
# with characteristic polynomial `lambda^2 - (alpha (1 - beta eta) + mu) lambda + alpha mu`. The
# heatmap shows its spectral radius over `alpha` and the effective step `beta eta`; the white
# contour is `rho = 1`. The dots are gates the MDN layer emits (random layer, random inputs,
# random parameter drift): the `theta = arctan(eta exp(log_factor))` constraint keeps
# `alpha beta eta <= eta / 4 < 1/2`, far from the boundary.

# %%
alpha_grid = np.linspace(0.01, 1.0, 200)
step_grid = np.linspace(0.0, 6.0, 240)
A, X = np.meshgrid(alpha_grid, step_grid)


def radius(alpha, beta_eta, mu):
    tr = alpha * (1 - beta_eta) + mu
    root = np.sqrt((tr**2 - 4 * alpha * mu).astype(complex))
    return np.maximum(np.abs((tr + root) / 2), np.abs((tr - root) / 2))


layer_model = build_mdn("tiny", vocab_size=64, rngs=nnx.Rngs(3), n_heads=64, head_dim=2,
                        expand_v=1, n_layers=1)
layer = layer_model.blocks[0].attn
drift = jax.random.normal(jax.random.key(4), (3, 64)) * 0.5
layer.dt_bias[...] = layer.dt_bias[...] + drift[0]
layer.mu_bias[...] = layer.mu_bias[...] + drift[1]
layer.log_factor[...] = layer.log_factor[...] + drift[2]
gates = layer.gates(3.0 * jax.random.normal(jax.random.key(5), (4, 64, layer.cfg.d_model)))
g_alpha = np.exp(np.asarray(gates.log_alpha)).ravel()
g_mu = np.exp(np.asarray(gates.log_mu)).ravel()
g_step = (np.asarray(gates.beta) * np.asarray(gates.eta)).ravel()
g_rho = np.abs(np.asarray(momentum_eigenvalues(*gates))).max(-1).ravel()

fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
for ax, mu in zip(axes, (0.5, 0.95), strict=True):
    rho = radius(A, X, mu)
    im = ax.pcolormesh(A, X, np.minimum(rho, 1.5), shading="auto", cmap="viridis")
    ax.contour(A, X, rho, levels=[1.0], colors="white")
    near = np.abs(g_mu - mu) < 0.1
    ax.scatter(g_alpha[near], g_step[near], s=2, c="red", alpha=0.4, label="layer gates")
    ax.set(xlabel="alpha", title=f"spectral radius, mu = {mu}")
    ax.legend(loc="upper right")
axes[0].set_ylabel("beta * eta")
fig.colorbar(im, ax=axes, label="rho (clipped at 1.5)")
plt.show()
print(f"largest spectral radius over {g_rho.size} emitted gates: {g_rho.max():.4f}")

# %% [markdown]
# ## 3. Check: the chunkwise op equals the recurrence
#
# The op `momentum_delta_rule(..., method="xla")` is the paper's chunkwise-parallel algorithm
# (log-space cumulative gates, a unit-lower-triangular solve for the pseudo-values, a scan over
# chunks). On fresh inputs, with an odd length and a nonzero initial state, it must match the
# step-by-step reference (`method="reference"`).

# %%
B, T, H, K, V = 2, 45 if FAST else 203, 3, 16, 32
ks = jax.random.split(jax.random.key(42), 9)
q = l2_normalize(jax.random.normal(ks[0], (B, T, H, K)))
k = l2_normalize(jax.random.normal(ks[1], (B, T, H, K)))
v = jax.random.normal(ks[2], (B, T, H, V))
log_alpha = jax.nn.log_sigmoid(jax.random.uniform(ks[3], (B, T, H))) / 4
log_mu = jax.nn.log_sigmoid(jax.random.uniform(ks[4], (B, T, H))) / 2
beta = 0.5 * jax.nn.sigmoid(jax.random.normal(ks[5], (B, T, H)))
eta = 1.0 + jnp.tanh(jax.random.normal(ks[6], (B, T, H)))
p = jnp.exp(log_alpha)[..., None] * k
h0 = 0.1 * jax.random.normal(ks[7], (2, B, H, K, V))
args = (q, k, v, p, log_alpha, log_mu, beta, eta)
o_rec, s_rec = momentum_delta_rule(*args, initial_state=h0, output_final_state=True,
                                   method="reference")
o_chk, s_chk = momentum_delta_rule(*args, initial_state=h0, output_final_state=True,
                                   method="xla", chunk_size=16)


def rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


print(f"xla (chunk) vs reference: outputs {rel(o_chk, o_rec):.2e}, states {rel(s_chk, s_rec):.2e}")
assert rel(o_chk, o_rec) < 1e-4 and rel(s_chk, s_rec) < 1e-4
assert g_rho.max() < 1.0
assert all(np.isfinite(c).all() for c in curves.values())
