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
# # Langevin sampling for mixed-integer programs
#
# The integer variables are sampled by an annealed discrete Langevin sampler whose energy adds
# a constraint-violation penalty to the objective; the continuous variables are completed by an
# exact LP (HiGHS), whose value reaches the sampler as cuts from its duals. The learned sampler
# is a bipartite variable-constraint graph network whose outputs *are* the move probabilities
# of every integer variable, trained without labels on its own rollouts over instances of the
# family. Every solution is re-checked in float64 before it is reported.
#
# Here: a capacitated facility-location instance (binary "open" variables, continuous
# assignments), a short on-policy training run of the learned proposal, the objective-vs-time
# traces of the learned sampler, the oracle-gain flip rule and HiGHS, the feasibility
# certificate, and a final check against the exact optimum.

# %%
# On Colab, `%pip install "jaxlib-ext[milp]"` from PyPI; elsewhere this cell does nothing.
import sys

if "google.colab" in sys.modules:
    from IPython import get_ipython

    get_ipython().run_line_magic("pip", 'install "jaxlib-ext[milp]"')

# %%
import os

import jax
import matplotlib.pyplot as plt
import numpy as np

from jaxlib_ext.samplers import milp

FAST = os.environ.get("FAST") == "1"
SIZE = dict(n_customers=15, n_facilities=8) if FAST else dict(n_customers=30, n_facilities=15)
TRAIN_STEPS = 100 if FAST else 1000
TIME_LIMIT = 2.0 if FAST else 5.0

# %% [markdown]
# ## An instance
#
# Cornuejols-style capacitated facility location: open facility `j` at a fixed cost, serve each
# customer's demand from open facilities within their capacities, pay transport per unit.

# %%
problem = milp.capacitated_facility_location(seed=7, **SIZE)
print(problem)
nf = SIZE["n_facilities"]
print("integer columns:", problem.integer_index.size, " continuous:",
      problem.continuous_index.size, " rows:", problem.num_rows)

# %% [markdown]
# ## Exact LP completion
#
# For any choice of open facilities the assignment is an LP; HiGHS solves it or proves it
# infeasible (too little capacity open).

# %%
Z = np.stack([np.ones(nf), np.zeros(nf), (np.arange(nf) % 2 == 0).astype(float)])
comp = milp.complete(problem, Z)
for z, ok, obj in zip(Z, comp.feasible, comp.objective):
    print(f"open {int(z.sum()):2d} facilities: feasible={ok}, objective={obj:.1f}")

# %% [markdown]
# ## Training the learned proposal on its own rollouts (no labels)
#
# Chains on other instances of the family start from random states and move by the network's
# own proposal; REINFORCE rewards each sampled move by the decrease of the unified energy
# (objective, annealed penalty, and the LP value through cuts). No solver label is used.

# %%
train = [milp.capacitated_facility_location(seed=100 + i, **SIZE)
         for i in range(20 if FAST else 200)]
proposal, losses = milp.train_proposal(jax.random.key(0), train, steps=TRAIN_STEPS,
                                       hidden=32, num_layers=2, num_chains=16,
                                       rollout_steps=300, progress=not FAST)
window = max(1, len(losses) // 20)
plt.figure(figsize=(5, 3))
plt.plot(np.convolve(losses, np.ones(window) / window, mode="valid"), lw=0.8)
plt.xlabel("Adam step")
plt.ylabel("-(one-step energy decrease) + move term")
plt.title("on-policy training (T.3), running mean")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Sampler vs HiGHS: objective against time

# %%
learned = milp.solve(problem, time_limit=TIME_LIMIT, proposal=proposal, seed=0,
                     steps_per_round=300)
plain = milp.solve(problem, time_limit=TIME_LIMIT, seed=0, steps_per_round=300)
highs = milp.solve_highs(problem, time_limit=TIME_LIMIT)
exact = milp.solve_highs(problem, time_limit=120.0)

plt.figure(figsize=(6, 3.5))
for name, trace in [("learned proposal", learned.trace), ("oracle-gain flip rule", plain.trace),
                    ("HiGHS", highs.trace)]:
    if trace:
        t, f = zip(*trace)
        plt.step(t, f, where="post", marker="o", ms=3, label=name)
plt.axhline(exact.objective, color="k", ls="--", lw=0.8, label="optimum")
plt.xscale("log")
plt.xlabel("seconds")
plt.ylabel("best objective")
plt.legend()
plt.tight_layout()
plt.show()
for name, r in [("learned", learned), ("rld", plain)]:
    print(f"{name:8s} objective {r.objective:.2f} in {r.seconds:.2f}s")
print(f"HiGHS    objective {highs.objective:.2f} in {highs.seconds:.2f}s ({highs.status})")

# %% [markdown]
# ## The feasibility certificate
#
# Every returned `x` is measured on the host in float64: all rows and bounds within `1e-6`,
# integer columns exactly integral.

# %%
best = learned if learned.objective <= plain.objective else plain
chk = milp.check_solution(problem, best.x)
print(best)
print("open facilities:", np.flatnonzero(best.x[:nf]).tolist())
print("row activity range vs bounds: max violation", chk.max_violation)

# %% [markdown]
# ## Final check against the exact optimum

# %%
gap = 100 * abs(best.objective - exact.objective) / abs(exact.objective)
print(f"sampler {best.objective:.3f} vs optimum {exact.objective:.3f}: gap {gap:.3f}%")
assert best.feasible and chk.feasible and chk.integrality_violation == 0.0
assert best.objective >= exact.objective - 1e-6
assert gap < 5.0
print("checks passed")
