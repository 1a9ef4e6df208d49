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
# # Pseudo-Mallows vs Bayesian Mallows MCMC on the potato data
#
# Pseudo-Mallows (arXiv 2205.13911) approximates the Mallows posterior of the consensus ranking
# `rho` by a product of sequential, exactly normalised factors, so it samples exactly and fast.
# The baseline is the Metropolis-Hastings sampler with leap-and-shift proposals (Vitelli et al.
# 2018). Data: 12 assessors rank 20 potatoes by weight, judging by eye (BayesMallows, GPL-3).

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
import matplotlib.pyplot as plt
import numpy as np

from jaxlib_ext.samplers import mallows_augment as ma
from jaxlib_ext.samplers import mallows_mcmc as mm
from jaxlib_ext.samplers import pseudo_mallows as pm
from jaxlib_ext.samplers import rankings as rk

FAST = os.environ.get("FAST") == "1"
N_PM = 2_000 if FAST else 20_000
N_MCMC = 1_000 if FAST else 20_000
LS_SAMPLES = 32 if FAST else 256

# %% [markdown]
# ## Data and the data matrix `D[i, r] = sum_j |R_ji - r|`

# %%
R = rk.load_potato("visual")
truth = rk.load_potato_true_ranking()
n = R.shape[1]
D = rk.footrule_data_matrix(R)
# close to the posterior mean of alpha for these data (benchmarks/samplers_pseudo_mallows.py)
alpha = 10.0
print(R.shape, "assessors x potatoes")

# %% [markdown]
# ## Pseudo-Mallows: V order, then a local search over orders (KL objective (PM.3))

# %%
t0 = time.perf_counter()
order_v = pm.v_order(D[:, 0])
order, hist = pm.local_search_order(jax.random.key(0), alpha, D, order_v,
                                    num_samples=LS_SAMPLES, max_sweeps=5 if FAST else 20)
q = pm.PseudoMallows(alpha, D, order)
samples = q.sample(jax.random.key(1), (N_PM,))
marg_pm = np.asarray(rk.rank_marginals(samples, n))
t_pm = time.perf_counter() - t0
print(f"Pseudo-Mallows: {t_pm:.2f} s (incl. compile), objective {hist[0]:.2f} -> {hist[-1]:.2f}")
print("exact KL: V order", round(pm.exact_kl(alpha, D, order_v), 2),
      " searched order", round(pm.exact_kl(alpha, D, order), 2))

# %% [markdown]
# ## MCMC baseline (4 vectorised chains) and the exact marginals (DP over rank sets)

# %%
t0 = time.perf_counter()
res = mm.run_mallows_mcmc(jax.random.key(2), R, alpha=alpha, leap_size=4, num_chains=4,
                          num_samples=N_MCMC, num_warmup=N_MCMC // 5)
marg_mc = np.asarray(rk.rank_marginals(res.rho, n))
t_mc = time.perf_counter() - t0
r_hat, ess = mm.rank_diagnostics(res.rho)
print(f"MCMC: {t_mc:.2f} s (incl. compile), acceptance {float(res.rho_acceptance_rate):.2f}, "
      f"max R-hat {r_hat.max():.3f}, min ESS {ess.min():.0f}")
exact = pm.exact_posterior_marginals(alpha, np.asarray(D, np.float64))


def tv(a, b):
    return 0.5 * np.abs(a - b).sum(1).mean()


print(f"TV to exact marginals: Pseudo-Mallows {tv(marg_pm, exact):.3f}, MCMC {tv(marg_mc, exact):.3f}")

# %% [markdown]
# ## Posterior heatmaps: item (sorted by true weight rank) x rank

# %%
idx = np.argsort(truth)
fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
for ax, m, title in zip(axes, (marg_pm, marg_mc, exact),
                        (f"Pseudo-Mallows ({t_pm:.1f} s)", f"MCMC ({t_mc:.1f} s)", "exact")):
    ax.imshow(m[idx], vmin=0, vmax=1, cmap="viridis")
    ax.set_title(title)
    ax.set_xlabel("rank")
axes[0].set_ylabel("potato (by true rank)")
plt.tight_layout()
plt.show()

# %%
plt.figure(figsize=(4, 3))
plt.bar(["Pseudo-Mallows", "MCMC"], [t_pm, t_mc])
plt.ylabel("wall time (s, incl. compile)")
plt.show()

# %% [markdown]
# ## Recommendations for one user
# Assessor A1 only tells us their five heaviest potatoes (as clicks, no order); the other
# eleven assessors give full rankings. Data augmentation fills in A1's latent ranking; we
# recommend the two potatoes most likely to come next (ranks 6-7).

# %%
clicked = np.zeros((1, n), bool)
clicked[0] = R[0] <= 5
b_user = rk.blocks_from_clicks(clicked)
b_rest = rk.blocks_from_partial(R[1:])
blocks = rk.Blocks(np.concatenate([b_user.item_block, b_rest.item_block + 2]),
                   np.concatenate([b_user.rank_block, b_rest.rank_block + 2]))
R0 = np.asarray(rk.initial_rankings_from_blocks(jax.random.key(3), blocks))
fit = pm.fit_augmented(jax.random.key(4), R0, alpha, num_iter=200 if FAST else 2000,
                       blocks=blocks)
items, probs = ma.top_k_recommendations(fit.user_rank_probs[:1], clicked, 2)
for i, p in zip(np.asarray(items[0]), np.asarray(probs[0])):
    print(f"recommend P{i + 1}: P(in ranks 6-7) = {p:.2f}; A1's own rank {R[0, i]}")

# %% [markdown]
# ## Exactness check (n = 5, by enumeration)

# %%
jax.config.update("jax_enable_x64", True)
R5 = rk.load_potato()[:, :5].argsort(1).argsort(1) + 1
D5 = rk.footrule_data_matrix(R5)
perms = rk.all_permutations(5)
q5 = pm.PseudoMallows(3.0, D5, pm.v_order(D5[:, 0]))
lq = np.asarray(q5.log_prob(perms))
e = -(3.0 / 5) * np.asarray(D5)[np.arange(5), perms - 1].sum(-1)
lp = e - np.logaddexp.reduce(e)
kl_enum = float(np.sum(np.exp(lq) * (lq - lp)))
assert abs(np.exp(lq).sum() - 1) < 1e-9
assert abs(pm.exact_kl(3.0, D5, q5.order) - kl_enum) < 1e-9
assert tv(marg_mc, exact) < (0.1 if FAST else 0.05)
print("checks passed: sum q = 1, DP KL = enumerated KL =", round(kl_enum, 4))
