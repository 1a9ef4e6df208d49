"""Pseudo-Mallows (arXiv 2205.13911) vs the Bayesian Mallows MCMC baseline (leap-and-shift).

Prints markdown tables:

1. Real data (potato n=20/12 assessors, sushi n=10/5000, beach pairwise n=15/60): posterior
   marginals ``P(rho_i = r)`` from Pseudo-Mallows vs the gold standard, their total-variation
   distance (mean over items of ``0.5 sum_r |p - q|``), the wall time of each method, and the
   wall time the MCMC needs to reach the same distance. Gold: the exact marginals (a DP over
   rank sets, n <= 20) for complete data, where the long MCMC run is also scored against them;
   a long MCMC run for beach (pairwise data, augmentation). alpha is fixed for both methods at
   the posterior mean of a short MCMC run with alpha updates (Exponential(0.1) prior).
2. Exhaustive order study (n <= 7): exact KL of the V order and the local-search order minus
   the best order's, on random item subsets of the potato data.
3. Simulated clicks (n=50 items, 50 users, alpha=3, Poisson(5) clicks): top-2 accuracy and
   wall time, Pseudo-Mallows with augmentation vs MCMC with augmentation.

Wall times exclude compilation (every jitted function is called once before timing).

    python -m benchmarks.samplers_pseudo_mallows          # full run, ~10 min on 2 CPU cores
    python -m benchmarks.samplers_pseudo_mallows --fast   # smoke run
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.samplers import mallows_augment as ma
from jaxlib_ext.samplers import mallows_mcmc as mm
from jaxlib_ext.samplers import pseudo_mallows as pm
from jaxlib_ext.samplers import rankings as rk


def tv(p, q):
    return float(0.5 * np.abs(np.asarray(p) - np.asarray(q)).sum(axis=1).mean())


def block(x):
    return jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a,
                        x)


def estimate_alpha(key, R, *, blocks=None, prefer=None, iters=2000):
    n = R.shape[1]
    res = mm.run_mallows_mcmc(
        key, R, alpha=1.0, update_alpha=True, sigma_alpha=0.15, alpha_rate=0.1,
        leap_size=max(1, n // 5), num_chains=4, num_samples=iters, num_warmup=iters,
        blocks=blocks, prefer=prefer,
    )
    return float(res.alpha.mean())


def mcmc_trace(key, R, alpha, gold, *, chunk, max_chunks, time_cap, num_chains=4,
               blocks=None, prefer=None, leap_size=None):
    """Run vectorised MCMC chunk by chunk (compiled once, before timing): a list of
    (elapsed seconds, TV vs gold or nan, iterations) after each chunk, the rho marginals and the
    per-user rank probabilities (augmented data). The first chunk is burn-in (its time counts,
    its draws do not)."""
    n = R.shape[1]
    L = max(1, n // 5) if leap_size is None else leap_size
    mh = mm.MallowsMH(R, alpha=alpha, leap_size=L, blocks=blocks, prefer=prefer)
    aug = blocks is not None or prefer is not None

    def init(keys, rho0):  # vectorised chains, each carrying its key
        return mh.init(keys, 0, {"rho": rho0}, (), {})

    @jax.jit
    def run_chunk(state):
        def body(s, _):
            s = mh.sample(s, (), {})
            c = jax.nn.one_hot(s.chain.rho - 1, n, dtype=jnp.float32).sum(0)
            u = (jax.nn.one_hot(s.chain.rankings - 1, n, dtype=jnp.float32).sum(0) if aug
                 else 0.0)
            return s, (c, u)

        s, (c, u) = jax.lax.scan(body, state, None, length=chunk)
        return s, c.sum(0), (u.sum(0) if aug else 0.0)

    # All chains start at the mean-rank consensus (ranks of D[:, 0]): from random starts some
    # chains stay trapped in local modes on peaked posteriors (sushi) for 10^5+ iterations.
    D0 = np.abs(np.asarray(R)[:, :, None] - np.arange(1, n + 1)[None, None]).sum(0)[:, 0]
    rho0 = jnp.tile(jnp.asarray(np.argsort(np.argsort(D0, kind="stable")) + 1), (num_chains, 1))
    keys = jax.random.split(key, num_chains)
    warm = init(jax.random.split(jax.random.fold_in(key, 1), num_chains), rho0)
    block(run_chunk(run_chunk(warm)[0]))  # compile (also for the post-step state's types)
    state = init(keys, rho0)
    counts, ucounts = jnp.zeros((n, n)), 0.0
    out, t0 = [], time.perf_counter()
    for c in range(max_chunks):
        state, cc, uc = block(run_chunk(state))
        if c > 0:
            counts, ucounts = counts + cc, ucounts + uc
            marg = counts / counts.sum(1, keepdims=True)
            d = tv(marg, gold) if gold is not None else float("nan")
            out.append((time.perf_counter() - t0, d, (c + 1) * chunk))
        if time.perf_counter() - t0 > time_cap:
            break
    marg = np.asarray(counts / counts.sum(1, keepdims=True))
    uprob = ucounts / ucounts.sum(-1, keepdims=True) if aug else None
    return out, marg, uprob


def time_to_reach(trace, target):
    for t, d, it in trace:
        if d <= target:
            return t, it
    return None, None


def pm_complete(key, R, alpha, num_samples, local):
    """Pseudo-Mallows for complete data: D, V order (+ local search), samples -> marginals."""
    n = R.shape[1]
    sample = jax.jit(lambda k, D, o: jax.vmap(
        lambda kk: pm.pseudo_mallows_sample(kk, alpha, D, o)[0])(jax.random.split(k, num_samples)))

    def go(k):
        D = rk.footrule_data_matrix(jnp.asarray(R))
        o = pm.v_order(D[:, 0])
        if local:
            o, _ = pm.local_search_order(jax.random.fold_in(k, 7), alpha, D, o, num_samples=256)
        return rk.rank_marginals(sample(k, D, o), n), o

    block(go(jax.random.fold_in(key, 99)))  # compile
    t0 = time.perf_counter()
    marg, o = block(go(key))
    return np.asarray(marg), time.perf_counter() - t0, np.asarray(o)


def pm_aug(key, R0, alpha, num_iter, local, **data):
    """Pseudo-Mallows + augmentation; with ``local``: a short V-order run, a local search for
    the order on the augmented data, then the main run with that order fixed. Timed after a
    warm-up call of the whole pipeline (compilation excluded)."""

    def go(k):
        k1, k2, k3 = jax.random.split(k, 3)
        if not local:
            return pm.fit_augmented(k1, R0, alpha, num_iter=num_iter, **data)
        pre = pm.fit_augmented(k1, R0, alpha, num_iter=200, **data)
        D = rk.footrule_data_matrix(pre.rankings)
        o, _ = pm.local_search_order(k2, alpha, D, pm.v_order(D[:, 0]), num_samples=128)
        return pm.fit_augmented(k3, pre.rankings, alpha, num_iter=num_iter, order=o, **data)

    block(go(jax.random.fold_in(key, 12345)))
    t0 = time.perf_counter()
    f = block(go(key))
    return f, time.perf_counter() - t0


def fmt_t(t):
    return "not reached" if t is None else f"{t:.2f} s"


def real_data(args, rows):
    key = jax.random.key(0)
    pot = rk.load_potato()
    sushi, _ = rk.load_sushi()
    for name, R, cap in (("potato_visual", pot, args.cap), ("sushi", sushi, args.cap / 2)):
        n = R.shape[1]
        alpha = estimate_alpha(jax.random.fold_in(key, 1), R, iters=args.alpha_iters)
        D64 = np.abs(R[:, :, None] - np.arange(1, n + 1)[None, None]).sum(0).astype(np.float64)
        t0 = time.perf_counter()
        gold = pm.exact_posterior_marginals(alpha, D64)
        t_gold = time.perf_counter() - t0
        res = {}
        for label, local in (("V order", False), ("local-search order", True)):
            marg, t, o = pm_complete(jax.random.fold_in(key, 2), R, alpha, args.pm_samples, local)
            res[label] = (tv(marg, gold), t, pm.exact_kl(alpha, D64, o))
        trace, _, _ = mcmc_trace(jax.random.fold_in(key, 3), R, alpha, gold, chunk=args.chunk,
                              max_chunks=args.max_chunks, time_cap=cap)
        t_end, d_end, it_end = trace[-1]
        for label, (d, t, kl) in res.items():
            t_mc, it_mc = time_to_reach(trace, d)
            ratio = "-" if t_mc is None else f"{t_mc / t:.1f}x"
            rows.append(
                f"| {name} | {n} | {R.shape[0]} | {alpha:.2f} | exact DP ({t_gold:.1f} s) | "
                f"PM {label} | {kl:.2f} | {d:.4f} | {t:.3f} s | {fmt_t(t_mc)}"
                f" ({it_mc or '-'} it) | {ratio} |"
            )
        rows.append(
            f"| {name} | {n} | {R.shape[0]} | {alpha:.2f} | exact DP | MCMC long run "
            f"({it_end} it x 4 chains) | - | {d_end:.4f} | {t_end:.2f} s | - | 1x |"
        )


def beach(args, rows):
    key = jax.random.key(10)
    prefs, N, n = rk.load_beach()
    P = rk.pairwise_closure(prefs, n, N)
    R0 = rk.initial_rankings_from_pairwise(P)
    alpha = estimate_alpha(jax.random.fold_in(key, 1), R0, prefer=P,
                           iters=args.alpha_iters // 2)
    # gold: a long MCMC run with augmentation (independent seed)
    t0 = time.perf_counter()
    g, gold, _ = mcmc_trace(jax.random.fold_in(key, 2), R0, alpha, None, chunk=1000,
                            max_chunks=args.beach_gold // 1000, time_cap=1e9,
                            prefer=P)
    t_gold = time.perf_counter() - t0

    trace, _, _ = mcmc_trace(jax.random.fold_in(key, 4), R0, alpha, gold, chunk=args.beach_chunk,
                             max_chunks=args.max_chunks, time_cap=args.cap, prefer=P)
    for label, local in (("V order", False), ("local-search order", True)):
        f, t_pm = pm_aug(jax.random.fold_in(key, 3), R0, alpha, args.beach_pm, local, prefer=P)
        d_pm = tv(rk.rank_marginals(f.rho, n), gold)
        t_mc, it_mc = time_to_reach(trace, d_pm)
        ratio = "-" if t_mc is None else f"{t_mc / t_pm:.1f}x"
        rows.append(
            f"| beach (pairwise) | {n} | {N} | {alpha:.2f} | MCMC {args.beach_gold} it x 4 "
            f"({t_gold:.0f} s) | PM {label} + augmentation ({args.beach_pm} it) | - | "
            f"{d_pm:.4f} | {t_pm:.2f} s | {fmt_t(t_mc)} ({it_mc or '-'} it) | {ratio} |"
        )
    t_end, d_end, it_end = trace[-1]
    rows.append(
        f"| beach (pairwise) | {n} | {N} | {alpha:.2f} | MCMC gold | MCMC ({it_end} it x 4) |"
        f" - | {d_end:.4f} | {t_end:.2f} s | - | 1x |"
    )


def exhaustive(args):
    pot = rk.load_potato()
    rng = np.random.default_rng(0)
    lines = ["| n | alpha | subsets | KL best (mean) | KL(V) - KL(best) | KL(local) - KL(best) |"
             " KL(reversed V) - KL(best) | KL(random) - KL(best) | V optimal | local optimal |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n in args.exh_n:
        for alpha in (2.0, 10.0):
            gaps_v, gaps_l, gaps_r, gaps_rv, best, vopt, lopt = [], [], [], [], [], 0, 0
            for _ in range(args.exh_subsets):
                items = rng.choice(20, n, replace=False)
                sub = np.argsort(np.argsort(pot[:, items], axis=1), axis=1) + 1
                D = np.abs(sub[:, :, None] - np.arange(1, n + 1)[None, None]).sum(0) * 1.0
                _, kl = pm.exhaustive_order_search(alpha, D)
                v = np.asarray(pm.v_order(D[:, 0]))
                lo, _ = pm.local_search_order(jax.random.key(int(rng.integers(1 << 30))), alpha,
                                              D, v, num_samples=256)
                kv, kll = pm.exact_kl(alpha, D, v), pm.exact_kl(alpha, D, np.asarray(lo))
                best.append(kl.min())
                gaps_v.append(kv - kl.min())
                gaps_l.append(kll - kl.min())
                gaps_r.append(kl.mean() - kl.min())
                gaps_rv.append(pm.exact_kl(alpha, D, v[::-1]) - kl.min())
                vopt += kv - kl.min() < 1e-6
                lopt += kll - kl.min() < 1e-6
            k = args.exh_subsets
            lines.append(
                f"| {n} | {alpha:g} | {k} | {np.mean(best):.4f} | {np.mean(gaps_v):.4f} | "
                f"{np.mean(gaps_l):.4f} | {np.mean(gaps_rv):.4f} | {np.mean(gaps_r):.4f} | "
                f"{vopt}/{k} | {lopt}/{k} |"
            )
    return lines


def clicks(args):
    n, N, alpha0, lam, K = 50, 50, 3.0, 5.0, 2
    key = jax.random.key(20)
    # True full rankings: exact Mallows(identity, alpha0) draws via long leap-and-shift chains
    # (posterior of rho given the single ranking 'identity' is Mallows around it).
    ident = np.arange(1, n + 1)[None]
    sim = mm.run_mallows_mcmc(jax.random.fold_in(key, 1), ident, alpha=alpha0, leap_size=10,
                              num_chains=N, num_samples=1, num_warmup=args.sim_steps)
    true = np.asarray(sim.rho[:, -1])
    rng = np.random.default_rng(0)
    n1 = np.clip(rng.poisson(lam, N), 1, n - K - 1)
    clicked = true <= n1[:, None]
    truth = (true > n1[:, None]) & (true <= n1[:, None] + K)
    b = rk.blocks_from_clicks(clicked)
    R0 = np.asarray(rk.initial_rankings_from_blocks(jax.random.fold_in(key, 2), b))

    def acc(probs):
        items, _ = ma.top_k_recommendations(probs, clicked, K)
        return float(np.take_along_axis(truth, np.asarray(items), 1).mean())

    lines = ["| method | iterations | top-2 accuracy | wall time | time vs PM |",
             "|---|---|---|---|---|"]
    # V order only: a local search over orders of n = 50 items costs minutes on 2 cores.
    f, t_pm = pm_aug(jax.random.fold_in(key, 3), R0, alpha0, args.click_pm, False, blocks=b)
    lines.append(f"| Pseudo-Mallows V order + augmentation | {args.click_pm} | "
                 f"{acc(f.user_rank_probs):.3f} | {t_pm:.2f} s | 1x |")
    for iters in args.click_mcmc:
        tr, _, uprob = mcmc_trace(jax.random.fold_in(key, 4), R0, alpha0, None, chunk=iters // 2,
                                  max_chunks=2, time_cap=1e9, num_chains=1, blocks=b,
                                  leap_size=10)
        t = tr[-1][0]
        lines.append(f"| MCMC + augmentation | {iters} | {acc(uprob):.3f} | "
                     f"{t:.2f} s | {t / t_pm:.1f}x |")
    # reference: recommend by the true consensus (identity): best unclicked items
    score = np.where(clicked, np.inf, np.arange(n)[None] * 1.0)
    rec = np.argsort(score, axis=1)[:, :K]
    lines.append(f"| oracle consensus (true rho) | - | "
                 f"{np.take_along_axis(truth, rec, 1).mean():.3f} | - | - |")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fast", action="store_true")
    ap.add_argument("--only", choices=["real", "orders", "clicks"], default=None)
    a = ap.parse_args()
    a.pm_samples = 10_000
    a.chunk, a.max_chunks, a.cap = (100, 30, 5.0) if a.fast else (250, 100_000, 30.0)
    a.alpha_iters = 300 if a.fast else 2000
    a.beach_gold, a.beach_pm, a.beach_chunk = (2000, 300, 200) if a.fast else (10_000, 2000, 50)
    a.exh_n, a.exh_subsets = ([5], 2) if a.fast else ([5, 6, 7], 4)
    a.sim_steps, a.click_pm = (500, 300) if a.fast else (20_000, 3000)
    a.click_mcmc = [300] if a.fast else [3000, 6000]

    print(f"# Mallows benchmark ({time.strftime('%Y-%m-%d')}, {platform.processor() or 'cpu'}, "
          f"{os.cpu_count()} CPUs, jax {jax.__version__}, backend {jax.default_backend()})\n")
    t_all = time.perf_counter()
    rows = ["| data | n | N | alpha | gold | method | KL(q‖P) | TV of marginals | wall time | "
            "MCMC time to same TV | MCMC time / method time |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    if a.only in (None, "real"):
        real_data(a, rows)
        beach(a, rows)
        print("## Real data: posterior marginals vs gold\n")
        print("\n".join(rows), flush=True)
    if a.only in (None, "orders"):
        print("\n## Exhaustive order study (potato item subsets)\n")
        print("\n".join(exhaustive(a)), flush=True)
    if a.only in (None, "clicks"):
        print("\n## Simulated clicking data (n=50, 50 users, alpha=3, Poisson(5) clicks, K=2)\n")
        print("\n".join(clicks(a)), flush=True)
    print(f"\ntotal benchmark time {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
