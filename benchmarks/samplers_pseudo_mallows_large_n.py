"""Pseudo-Mallows (arXiv 2205.13911) vs the Mallows MCMC at many items (n = 50, 100, 200).

The paper's claim is that Pseudo-Mallows is much faster than MCMC at similar accuracy, in
particular for many items. This script tests it on simulated complete rankings.

**Data.** For each cell (n items, N assessors) and seed: a uniformly random true consensus
``rho0`` and N rankings from the footrule Mallows model ``P(R) ∝ exp(-(alpha0/n) d_F(R, rho0))``
with ``alpha0 = 3`` (the paper's simulation setting). There is no exact sampler for the footrule
Mallows model in the library, so each ranking is the final state of its own long leap-and-shift
chain of the library's MCMC (``mallows_mcmc.build_kernel``, leap size ``max(1, n // 5)``) that
targets Mallows(identity, alpha0) -- the posterior of ``rho`` given the single ranking
"identity" -- started from a random permutation and run for ``sim_steps`` (default ``200 n``)
proposals; its draw ``sigma`` is mapped to ``R_i = sigma_{rho0_i}``. As a check the script prints
the mean footrule distance of the simulated rankings to ``rho0`` next to its exact expectation
under the model (from ``mallows_mcmc.footrule_distance_log_counts``).

**Posterior.** Bayesian Mallows with uniform prior on ``rho`` and ``alpha`` fixed at the true
``alpha0`` for both methods: ``P(rho | R) ∝ exp(-(alpha0/n) sum_i D[i, rho_i - 1])``.

* Pseudo-Mallows: data matrix ``D``, V order (``pseudo_mallows.v_order`` of the mean ranks),
  exact draws from ``PseudoMallows(alpha0, D, order)`` in batches of 1000; its default here is
  10,000 draws. The local-search order (``local_search_order``) is *not* used: one sweep costs
  ``n(n-1)/2`` objective evaluations of O(S n^2) each (about 10^11 operations per sweep at n =
  200 with S = 256), far beyond this benchmark's budget.
* MCMC: 4 vectorised leap-and-shift chains (``mallows_mcmc.build_kernel``, leap size
  ``max(1, n // 5)``, one proposal per iteration), all started at the mean-rank consensus (the
  information the V order uses too), run in chunks of ``5 n`` iterations; the first chunk is
  burn-in (its time counts, its draws do not). Every iteration is kept.
* Gold: a long MCMC run, 8 chains from uniformly random permutations (so that the gold does
  not share the timed MCMC's start), ``gold_iters`` iterations per chain after a
  ``gold_iters / 10`` burn-in (default ``gold_iters = 5000 n``, i.e. 10^6 per
  chain at n = 200). Its own noise is printed: the top-10 error between chains 0-3 and 4-7.

**Metrics.**

* consensus error: footrule distance between the consensus estimate (ranks of the posterior
  mean ranks) and the true ``rho0``, divided by the maximum footrule ``2 floor(n^2/4)``;
* top-10 error: ``0.5 sum_i |p_i - g_i| / 10`` with ``p_i = P(rho_i <= 10)`` of the method and
  ``g_i`` of the gold run (a total variation distance; 0 = equal, 1 = disjoint).

**Comparisons** (per cell, every seed printed, then mean ± sd over seeds):

* equal wall time: the budget is the wall time of Pseudo-Mallows with its default 10,000 draws
  (D, V order and sampling; compilation excluded: every jitted function is called once on the
  same shapes before timing). MCMC gets the same budget (the last checkpoint within it).
* equal accuracy: the target is the top-10 error of Pseudo-Mallows at 10,000 draws; MCMC runs
  chunk by chunk (increasing iteration counts) until its error first falls to the target or
  a time cap (``mcmc_cap`` seconds) passes; reported: its time and iterations, and the ratio
  to the Pseudo-Mallows time. The time has the resolution of one chunk (the first checkpoint
  comes after burn-in plus one chunk), so it is an upper bound.

MCMC iteration counts are per chain and include the burn-in chunk.

**Oracle check.** The gold is the same MCMC kernel as the timed baseline, so on one small data
set (n = 16, N = 20) the script also scores the gold run and Pseudo-Mallows (top-5 marginals)
against the exact posterior (``pseudo_mallows.exact_posterior_marginals``, a DP over rank sets).

Timing is wall time on whatever CPU runs it; another process sharing the cores inflates both
methods' times (the ratios are less affected).

    python -m benchmarks.samplers_pseudo_mallows_large_n          # full run, < 20 min, 2 cores
    python -m benchmarks.samplers_pseudo_mallows_large_n --fast   # smoke run, < 1 min
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.samplers import mallows_mcmc as mm
from jaxlib_ext.samplers import pseudo_mallows as pm
from jaxlib_ext.samplers import rankings as rk

TOP = 10
PM_BATCH = 1000


def block(x):
    return jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a,
                        x)


# --------------------------------------------------------------------------- MCMC drivers


@functools.cache
def mcmc_fns(n: int):
    """Jitted ``advance(chains, steps)`` and ``chunk(chains, length)`` for vectorised chains of
    the library's leap-and-shift kernel (alpha fixed); ``chains = (state, keys)``, the batched
    :class:`~jaxlib_ext.samplers.mallows_mcmc.MallowsState` and one key per chain. The data
    live in ``state.D``, so one compilation serves every data set of the same shape. ``chunk``
    returns per-chain sums of the ranks and of the top-10 indicators over its iterations."""
    kernel = jax.vmap(mm.build_kernel(num_assessors=1, leap_size=max(1, n // 5)))

    def step(chains):
        state, keys = chains
        split = jax.vmap(jax.random.split)(keys)
        state, _ = kernel(split[:, 1], state)
        return state, split[:, 0]

    @jax.jit
    def advance(chains, steps):
        return jax.lax.fori_loop(0, steps, lambda _, c: step(c), chains)

    @functools.partial(jax.jit, static_argnums=1)
    def chunk(chains, length):
        C = chains[0].rho.shape[0]

        def body(carry, _):
            c, sr, st = carry
            c = step(c)
            rho = c[0].rho
            return (c, sr + rho, st + (rho <= TOP)), None

        z = jnp.zeros((C, n), jnp.int32)
        (c, sr, st), _ = jax.lax.scan(body, (chains, z, z), None, length=length)
        return c, sr, st

    return advance, chunk


def init_chains(key, D, alpha, num_chains, rho0=None):
    """``(state, keys)`` of ``num_chains`` chains at ``rho0`` or at random permutations."""
    n = D.shape[0]
    k_rho, k_run = jax.random.split(key)
    if rho0 is None:
        rho = jax.vmap(lambda k: jax.random.permutation(k, n).astype(jnp.int32) + 1)(
            jax.random.split(k_rho, num_chains))
    else:
        rho = jnp.tile(jnp.asarray(rho0, jnp.int32), (num_chains, 1))
    state = jax.vmap(lambda r: mm.init({"rho": r, "alpha": alpha}, D))(rho)
    return state, jax.random.split(k_run, num_chains)


def mean_rank_consensus(D):
    return np.argsort(np.argsort(np.asarray(D)[:, 0], kind="stable"), kind="stable") + 1


# --------------------------------------------------------------------------- data


def simulate(key, n, N, alpha0, steps):
    """``(rho0, R [N, n])``: N Mallows(rho0, alpha0) rankings (module docstring)."""
    k0, k1 = jax.random.split(key)
    rho0 = np.asarray(jax.random.permutation(k0, n)) + 1
    ids = jnp.arange(1, n + 1)
    D_id = jnp.abs(ids[:, None] - ids[None, :]).astype(jnp.float32)  # data = one identity
    advance, _ = mcmc_fns(n)
    state, _ = block(advance(init_chains(k1, D_id, alpha0, N), steps))
    sigma = np.asarray(state.rho)
    return rho0, sigma[:, rho0 - 1]


def exact_mean_footrule(n, alpha0):
    d, lc = mm.footrule_distance_log_counts(n)
    lw = lc - alpha0 / n * d
    w = np.exp(lw - lw.max())
    return float((w * d).sum() / w.sum())


# --------------------------------------------------------------------------- metrics


def top_error(p, g):
    return float(0.5 * np.abs(p - g).sum() / TOP)


def consensus_error(mean_rank, rho0):
    n = len(rho0)
    est = np.argsort(np.argsort(mean_rank, kind="stable"), kind="stable") + 1
    return float(np.abs(est - rho0).sum() / (2 * (n * n // 4)))


# --------------------------------------------------------------------------- methods


def gold_run(key, D, alpha, iters):
    n = D.shape[0]
    _, chunk = mcmc_fns(n)
    st = init_chains(key, D, alpha, 8)  # random starts, independent of the timed MCMC's start
    length = 50 * n
    num = max(1, iters // length)
    burn = max(1, num // 10)
    sr = np.zeros((8, n))
    stp = np.zeros((8, n))
    t0 = time.perf_counter()
    for c in range(burn + num):
        st, a, b = block(chunk(st, length))
        if c >= burn:
            sr += np.asarray(a)
            stp += np.asarray(b)
    tot = num * length
    g = stp.sum(0) / (8 * tot)
    noise = top_error(stp[:4].sum(0) / (4 * tot), stp[4:].sum(0) / (4 * tot))
    return g, sr.sum(0) / (8 * tot), noise, time.perf_counter() - t0, tot


def pm_run(key, R, alpha, num_samples):
    """Pseudo-Mallows (V order): ``[(seconds, draws, top-10 probs, mean ranks)]`` per batch."""
    n = R.shape[1]

    def setup(Rj):
        D = rk.footrule_data_matrix(Rj)
        return D, pm.v_order(D[:, 0])

    setup_j = jax.jit(setup)
    Rj = jnp.asarray(R)
    D, o = block(setup_j(Rj))  # compile
    block(pm.PseudoMallows(alpha, D, o).sample(jax.random.fold_in(key, 99), (PM_BATCH,)))
    t0 = time.perf_counter()
    D, o = block(setup_j(Rj))
    dist = pm.PseudoMallows(alpha, D, o)
    sr, stp, out = np.zeros(n), np.zeros(n), []
    for b in range(num_samples // PM_BATCH):
        x = np.asarray(dist.sample(jax.random.fold_in(key, b), (PM_BATCH,)))
        sr += x.sum(0)
        stp += (x <= TOP).sum(0)
        m = (b + 1) * PM_BATCH
        out.append((time.perf_counter() - t0, m, stp / m, sr / m))
    return out


def mcmc_run(key, D, alpha, *, cap, stop_at=None, gold=None, min_time=0.0):
    """MCMC from the mean-rank consensus, 4 chains, chunks of 5n iterations (first = burn-in).
    ``[(seconds, iterations per chain, top-10 probs, mean ranks)]`` per chunk; stops once the
    top-10 error vs ``gold`` is <= ``stop_at`` and ``min_time`` has passed, or after ``cap``."""
    n = D.shape[0]
    C, length = 4, 5 * n
    _, chunk = mcmc_fns(n)
    rho_start = mean_rank_consensus(D)
    block(chunk(init_chains(jax.random.fold_in(key, 1), D, alpha, C, rho_start), length))
    t0 = time.perf_counter()
    st = init_chains(key, D, alpha, C, rho_start)
    sr, stp, out, c = np.zeros(n), np.zeros(n), [], 0
    while True:
        st, a, b = block(chunk(st, length))
        c += 1
        if c > 1:
            sr += np.asarray(a).sum(0)
            stp += np.asarray(b).sum(0)
            m = (c - 1) * length * C
            p = stp / m
            t = time.perf_counter() - t0
            out.append((t, c * length, p, sr / m))
            reached = stop_at is not None and top_error(p, gold) <= stop_at
            if (reached and t >= min_time) or t > cap:
                return out


def at_budget(trace, budget):
    """Last checkpoint within ``budget`` seconds (the first one if none is)."""
    ok = [x for x in trace if x[0] <= budget]
    return ok[-1] if ok else trace[0]


def first_reaching(trace, gold, target):
    for x in trace:
        if top_error(x[2], gold) <= target:
            return x
    return None


# --------------------------------------------------------------------------- benchmark


def oracle_check(a, n, N=20, top=5):
    """At small n the exact posterior marginals (``pseudo_mallows.exact_posterior_marginals``,
    a DP over rank sets) are available: top-``top`` errors of the gold MCMC and of
    Pseudo-Mallows against them, on one simulated data set."""
    global TOP
    rho0, R = simulate(jax.random.key(1000 + n), n, N, a.alpha, a.sim_mult * n)
    D = np.asarray(rk.footrule_data_matrix(jnp.asarray(R)), np.float64)
    exact = pm.exact_posterior_marginals(a.alpha, D)[:, :top].sum(1)
    old, TOP = TOP, top
    try:
        g, _, noise, _, it = gold_run(jax.random.key(1), jnp.asarray(D, jnp.float32), a.alpha,
                                      a.gold_mult * n)
        p = pm_run(jax.random.key(2), R, a.alpha, a.pm_samples)[-1][2]
        return (f"| {n} | {N} | {a.alpha:g} | top-{top} | {top_error(g, exact):.4f} ({it} it x 8,"
                f" half vs half {noise:.4f}) | {top_error(p, exact):.4f} ({a.pm_samples} draws) |")
    finally:
        TOP = old



def run_cell(a, n, N, seed, log):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), n), N)
    ks, kg, kp, km = jax.random.split(key, 4)
    rho0, R = simulate(ks, n, N, a.alpha, a.sim_mult * n)
    D = rk.footrule_data_matrix(jnp.asarray(R))
    sim_d = float(np.abs(R - rho0[None]).sum(1).mean())
    g, g_mean, g_noise, t_gold, g_it = gold_run(kg, D, a.alpha, a.gold_mult * n)
    g_cons = consensus_error(g_mean, rho0)

    pm_tr = pm_run(kp, R, a.alpha, a.pm_samples)
    t_pm, _, p_pm, m_pm = pm_tr[-1]
    e_pm, c_pm = top_error(p_pm, g), consensus_error(m_pm, rho0)
    e_pm1 = top_error(pm_tr[0][2], g)  # after the first batch: bias vs Monte-Carlo noise

    mc_tr = mcmc_run(km, D, a.alpha, cap=a.mcmc_cap, stop_at=e_pm, gold=g, min_time=t_pm)
    t_b, it_b, p_b, m_b = at_budget(mc_tr, t_pm)
    e_b, c_b = top_error(p_b, g), consensus_error(m_b, rho0)
    hit = first_reaching(mc_tr, g, e_pm)
    t_hit, it_hit = (hit[0], hit[1]) if hit else (None, None)
    t_last, it_last, p_last, _ = mc_tr[-1]
    r = dict(seed=seed, sim_d=sim_d, g_noise=g_noise, g_cons=g_cons, t_gold=t_gold, g_it=g_it,
             t_pm=t_pm, e_pm=e_pm, e_pm1=e_pm1, c_pm=c_pm, t_b=t_b, it_b=it_b, e_b=e_b, c_b=c_b,
             t_hit=t_hit, it_hit=it_hit, t_last=t_last, it_last=it_last,
             e_last=top_error(p_last, g))
    hit_s = (f"{t_hit:.2f} s ({it_hit} it)" if t_hit is not None
             else f"not reached in {t_last:.1f} s ({it_last} it, err {r['e_last']:.4f})")
    log.append(
        f"| {n} | {N} | {seed} | {sim_d:.0f} | {g_it} x 8 ({t_gold:.0f} s) | {g_noise:.4f} | "
        f"{g_cons:.4f} | {t_pm:.3f} s | {e_pm1:.4f} | {e_pm:.4f} | {c_pm:.4f} | {it_b} | "
        f"{e_b:.4f} | {c_b:.4f} | {hit_s} |"
    )
    print(log[-1], flush=True)
    return r


def ms(xs, f="{:.4f}"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return (f + " ± " + f).format(np.mean(xs), np.std(xs, ddof=1) if len(xs) > 1 else 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fast", action="store_true", help="tiny smoke run (< 1 min)")
    ap.add_argument("--alpha", type=float, default=3.0, help="true (and fixed) alpha")
    ap.add_argument("--ns", type=int, nargs="+", default=None, help="item counts")
    ap.add_argument("--Ns", type=int, nargs="+", default=None, help="assessor counts")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="data-set seeds")
    ap.add_argument("--gold-mult", type=int, default=None, help="gold iterations / n")
    a = ap.parse_args()
    if a.fast:
        ns, Ns, seeds = [20, 40], [20], [0, 1]
        a.sim_mult, gold_mult, a.pm_samples, a.mcmc_cap = 100, 200, 2000, 2.0
    else:
        ns, Ns, seeds = [50, 100, 200], [20, 100], [0, 1, 2]
        a.sim_mult, gold_mult, a.pm_samples, a.mcmc_cap = 200, 5000, 10_000, 12.0
    a.oracle_n = 12 if a.fast else 16
    a.ns, a.Ns, a.seeds = a.ns or ns, a.Ns or Ns, a.seeds or seeds
    a.gold_mult = a.gold_mult or gold_mult

    print(f"# Pseudo-Mallows vs MCMC at many items ({time.strftime('%Y-%m-%d %H:%M')}, "
          f"{platform.platform()}, {platform.processor() or 'cpu'}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}, jax {jax.__version__}, numpy {np.__version__}, "
          f"backend {jax.default_backend()})\n")
    print(f"alpha0 = alpha = {a.alpha:g} (true and fixed), top-{TOP} marginals, PM default "
          f"{a.pm_samples} draws (V order), MCMC 4 chains, gold 8 chains x {a.gold_mult} n it, "
          f"MCMC time cap {a.mcmc_cap:g} s, seeds {a.seeds}\n")
    print("## Every seed\n")
    head = ("| n | N | seed | mean d_F(R, rho0) sim | gold it x chains (time) | gold noise "
            "(top-10, half vs half) | gold consensus err | PM time (= budget) | "
            f"PM top-10 err at {PM_BATCH} draws | PM top-10 err | "
            "PM consensus err | MCMC it per chain at budget (incl. burn-in) | "
            "MCMC top-10 err at budget | "
            "MCMC consensus err at budget | MCMC time to PM's top-10 err |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1), flush=True)
    t_all = time.perf_counter()
    log, res = [], {}
    for n in a.ns:
        exp_d = exact_mean_footrule(n, a.alpha)
        for N in a.Ns:
            res[n, N] = [run_cell(a, n, N, s, log) for s in a.seeds]
            res[n, N][0]["exp_d"] = exp_d

    print("\n## Oracle check at small n: error against the exact posterior (DP over rank sets)\n")
    print("| n | N | alpha | marginal | gold MCMC err vs exact | Pseudo-Mallows err vs exact |")
    print("|---|---|---|---|---|---|")
    print(oracle_check(a, a.oracle_n))

    print("\n## Simulation check: mean footrule distance of the simulated rankings to rho0\n")
    print("| n | N | simulated (mean ± sd over seeds) | exact E[d_F] under Mallows |")
    print("|---|---|---|---|")
    for (n, N), rs in res.items():
        print(f"| {n} | {N} | {ms([r['sim_d'] for r in rs], '{:.1f}')} | "
              f"{rs[0]['exp_d']:.1f} |")

    print("\n## Summary (mean ± sd over seeds)\n")
    print("| n | N | comparison | method | wall time | iterations / draws | top-10 err vs gold |"
          " consensus err | MCMC time / PM time |")
    print("|---|---|---|---|---|---|---|---|---|")
    verdict = []
    for (n, N), rs in res.items():
        k = len(rs)
        t_pm = ms([r["t_pm"] for r in rs], "{:.3f}")
        print(f"| {n} | {N} | equal wall time | Pseudo-Mallows V order | {t_pm} s | "
              f"{a.pm_samples} draws | {ms([r['e_pm'] for r in rs])} "
              f"({ms([r['e_pm1'] for r in rs])} at {PM_BATCH}) | "
              f"{ms([r['c_pm'] for r in rs])} | - |")
        print(f"| {n} | {N} | equal wall time | MCMC, same budget | {t_pm} s | "
              f"{ms([r['it_b'] for r in rs], '{:.0f}')} it x 4 | {ms([r['e_b'] for r in rs])} | "
              f"{ms([r['c_b'] for r in rs])} | 1 |")
        hits = [r for r in rs if r["t_hit"] is not None]
        ratios = [r["t_hit"] / r["t_pm"] for r in hits]
        t_hit = ms([r["t_hit"] for r in hits], "{:.2f}") + " s" if hits else "-"
        print(f"| {n} | {N} | equal accuracy (PM's top-10 err) | MCMC | {t_hit} "
              f"(reached {len(hits)}/{k}, cap {a.mcmc_cap:g} s) | "
              f"{ms([r['it_hit'] for r in hits], '{:.0f}')} it x 4 | <= PM's | - | "
              f"{ms(ratios, '{:.3f}')} |")
        print(f"| {n} | {N} | reference | gold MCMC | {ms([r['t_gold'] for r in rs], '{:.0f}')} s"
              f" | {rs[0]['g_it']} it x 8 | {ms([r['g_noise'] for r in rs])} (half vs half) | "
              f"{ms([r['g_cons'] for r in rs])} | - |")
        wins_t = sum(r["e_pm"] < r["e_b"] for r in rs)
        wins_a = sum(r["t_hit"] is None or r["t_hit"] > r["t_pm"] for r in rs)
        reached = "" if len(hits) == k else f" ({len(hits)}/{k} reached)"
        verdict.append(f"| {n} | {N} | {wins_t}/{k} | {wins_a}/{k} | "
                       f"{ms([r['e_b'] / r['e_pm'] for r in rs], '{:.2f}')} | "
                       f"{ms(ratios, '{:.3f}')}{reached} |")
    print("\n## Who wins (per seed)\n")
    print("| n | N | PM lower top-10 err at equal time | PM faster to PM's own err | "
          "MCMC err / PM err at equal time | MCMC time / PM time at equal accuracy |")
    print("|---|---|---|---|---|---|")
    print("\n".join(verdict))
    print(f"\ntotal benchmark time {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
