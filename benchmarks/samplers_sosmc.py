"""SOSMC (arXiv 2601.22003) vs ImpDiff and SOUL: objective reached against wall time.

Problems (``jaxlib_ext.samplers.smc.problems``): the Gaussian MMLE toy, PPCA maximum marginal
likelihood on scikit-learn's wine data, reward tuning of the 2-D hexagonal mixture (hard
reward, KL weight 0.1) and of a Gaussian-mixture EBM on scikit-learn's 8x8 digits toward a
classifier's P(digit = 3). Every loss is evaluated exactly (MMLE) or with fixed draws (reward
problems: ``-J = -(E[r] - lam KL)``), the same yardstick for every method.

Methods, main rows in the SOSMC authors' settings (their reward-tuning notebook,
``reward_tuning/langevin_processes/experiments.ipynb``): SOSMC with the invariant variant
(MALA move) and with the ULA variant, both with multinomial resampling and the step-size rule
at ``c = 1.01`` (their experiment configuration); ImpDiff (one unweighted ULA step per
parameter step, the gradient at the moved particles); SOUL (one ULA chain, ``N`` steps per
parameter step, the first ``N / 2`` dropped, the gradient over the rest of the path). Variant
rows, ours: ``/ours`` SOSMC with systematic resampling and a fixed ``h`` (``c = 1``);
``impdiff/grad-first`` (the gradient before the move); ``soul/persistent`` (``N`` persistent
chains, ``--soul-inner`` steps each per parameter step, no burn-in). Same particle count
``N``, same move step size ``h`` (the problem's), and the same budget of moves, ``K N`` in
all (``K`` moves per particle): SOSMC, ImpDiff and SOUL take ``K`` parameter steps,
soul/persistent ``K / soul_inner``. Adam; each method gets the same learning-rate grid and its
best rate is picked by the mean final loss over seeds (``benchmarks/_comparison.py``; the
losses are the objective itself, so validation and test are the same number). Seeds run
together as one vmapped program; its wall time (compilation excluded: every program runs once
before timing) is what the curves and tables show.

"Time to target": the first checkpoint at which the mean loss over seeds reaches the best final
mean loss of the two baselines (ImpDiff, SOUL), each method at its best learning rate.

    python -m benchmarks.samplers_sosmc            # full run
    python -m benchmarks.samplers_sosmc --main-only  # the authors' settings only
    python -m benchmarks.samplers_sosmc --fast     # smoke run
    python -m benchmarks.samplers_sosmc --plot curves.png
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks._comparison import Comparison, ComparisonResult, format_pm
from jaxlib_ext.samplers import smc

MAIN = ("sosmc-mala", "sosmc-ula", "impdiff", "soul")
VARIANTS = ("sosmc-mala/ours", "sosmc-ula/ours", "impdiff/grad-first", "soul/persistent")
BASELINES = ("impdiff", "soul")

# name -> (constructor, particles, moves per particle, lr grid)
SETUPS = {
    "gaussian-mmle": (smc.gaussian_mmle, 256, 1000, (0.003, 0.01, 0.03, 0.1)),
    "ppca-wine": (smc.ppca_mmle, 64, 1000, (0.001, 0.003, 0.01, 0.03)),
    "mixture2d-hard": (lambda: smc.mixture2d_reward("hard", kl_weight=0.1), 512, 1000,
                       (0.003, 0.01, 0.03, 0.1)),
    "digits-3": (lambda: smc.digits_reward(3, kl_weight=0.2), 256, 600,
                 (0.003, 0.01, 0.03, 0.1)),
}


def outer_steps(method, moves, soul_inner):
    """Parameter steps for a budget of ``moves`` moves per particle (``moves * N`` in all)."""
    return moves // soul_inner if method == "soul/persistent" else moves


def build(method, problem, lr, n, soul_inner):
    """The algorithm and the leading axis of its particles."""
    h = dict(step_size=problem.step_size, objective_grad=problem.objective_grad)
    common = dict(num_particles=n, **h)
    opt = optax.adam(lr)
    base, _, tag = method.partition("/")
    if base.startswith("sosmc"):
        ours = tag == "ours"
        alg = smc.sosmc(problem.potential, opt, variant="invariant" if base == "sosmc-mala"
                        else "ula", move="mala", adapt_factor=1.0 if ours else 1.01,
                        resampling="systematic" if ours else "multinomial",
                        step_size_bounds=problem.step_size_bounds, **common)
        return alg, n
    if base == "impdiff":
        order = "grad_first" if tag == "grad-first" else "move_first"
        return smc.impdiff(problem.potential, opt, order=order, **common), n
    if tag == "persistent":
        return smc.soul(problem.potential, opt, num_inner_steps=soul_inner, num_chains=n,
                        **h), n
    return smc.soul(problem.potential, opt, num_inner_steps=n, burn_in=n // 2, **h), 1


def block(x):
    return jax.tree.map(lambda a: a.block_until_ready(), x)


class Runner:
    """Runs (method, lr) for all seeds at once and caches the curves."""

    def __init__(self, problem, n, moves, seeds, checkpoints, soul_inner):
        self.p, self.n, self.moves, self.seeds = problem, n, moves, seeds
        self.checkpoints, self.soul_inner = checkpoints, soul_inner
        self.cache, self.programs = {}, {}

    def program(self, method):
        if method not in self.programs:
            outer = outer_steps(method, self.moves, self.soul_inner)
            chunk = max(1, outer // self.checkpoints)
            p, n, si = self.p, self.n, self.soul_inner

            def start(lr, keys):
                alg, c = build(method, p, lr, n, si)
                return jax.vmap(lambda k: alg.init((p.params0, p.sample_initial(k, c))))(keys)

            def advance(lr, states, keys):
                alg, _ = build(method, p, lr, n, si)
                def run(k, s):
                    out = smc.run(k, alg, s, chunk, raise_on_nonfinite=False)
                    return out.state, out.infos

                states, infos = jax.vmap(run)(keys, states)
                return states, (infos.ess.mean(1), infos.resampled.mean(1),
                                infos.finite.all(1))

            self.programs[method] = (jax.jit(start), jax.jit(advance), chunk)
        return self.programs[method]

    def curve(self, method, lr):
        key = (method, lr)
        if key in self.cache:
            return self.cache[key]
        start, advance, chunk = self.program(method)
        lr_a = jnp.asarray(lr, jnp.float32)
        keys0 = jnp.stack([jax.random.key(s) for s in self.seeds])
        keys = jax.vmap(lambda k: jax.random.split(k, self.checkpoints + 1))(keys0)
        states = block(start(lr_a, keys[:, 0]))
        block(advance(lr_a, states, keys[:, 1]))  # compile and warm up; not timed
        times, params, ess, finite = [], [], [], []
        t0 = time.perf_counter()
        for c in range(self.checkpoints):
            states, (e, _, ok) = block(advance(lr_a, states, keys[:, c + 1]))
            times.append(time.perf_counter() - t0)
            params.append(states.params)
            ess.append(e)
            finite.append(ok)
        losses = np.stack([np.asarray(jax.vmap(self.p.loss)(pp)) for pp in params])  # (C, S)
        ok = np.stack([np.asarray(f) for f in finite]).all(0)
        losses[:, ~ok] = np.nan
        out = {"times": np.array(times), "losses": losses, "chunk": chunk,
               "ess": np.stack([np.asarray(e) for e in ess]) / self.n}
        self.cache[key] = out
        return out

    def run(self, method, lr, seed):
        c = self.curve(method, lr)
        i = self.seeds.index(seed)
        final = float(c["losses"][-1, i])
        return {"val": final, "test": final, "wall": float(c["times"][-1])}


def reference_optimum(problem, steps=3000):
    """The loss minimised directly (the reward problems' loss is a smooth function of the
    logits with fixed draws): Adam, lr 0.05, ``steps`` steps from ``params0``."""
    opt = optax.adam(0.05)

    def body(carry, _):
        th, st = carry
        g = jax.grad(problem.loss)(th)
        up, st = opt.update(g, st, th)
        return (optax.apply_updates(th, up), st), None

    (th, _), _ = jax.jit(lambda t: jax.lax.scan(body, (t, opt.init(t)), None, length=steps))(
        problem.params0)
    return float(problem.loss(th))


def time_to(curve, target):
    mean = np.nanmean(curve["losses"], 1) if np.isfinite(curve["losses"]).any() else None
    if mean is None:
        return None
    hit = np.nonzero(mean <= target)[0]
    return float(curve["times"][hit[0]]) if hit.size else None


def bench_problem(name, args, plots):
    make, n, moves, lrs = SETUPS[name]
    if args.fast:
        n, moves, lrs = max(16, n // 4), moves // 5, lrs
    problem = make()
    seeds = tuple(range(args.seeds))
    methods = MAIN if args.main_only else MAIN + VARIANTS
    spec = Comparison(methods=methods, lrs=lrs, seeds=seeds,
                      budget=f"{n} particles x {moves} moves per particle (h = "
                             f"{problem.step_size:g}); SOUL one chain x {n} moves per "
                             f"parameter step (burn-in {n // 2}); soul/persistent "
                             f"{args.soul_inner} moves per parameter step")
    runner = Runner(problem, n, moves, list(seeds), args.checkpoints, args.soul_inner)
    records, seconds = {}, {}
    for m in methods:
        for lr in spec.lrs:
            t0 = time.perf_counter()
            for s in seeds:
                records[m, lr, s] = runner.run(m, lr, s)
            seconds[m, lr, seeds[0]] = time.perf_counter() - t0
            for s in seeds[1:]:
                seconds[m, lr, s] = 0.0
            v = [records[m, lr, s]["val"] for s in seeds]
            print(f"  {name} {m} lr {lr:g}: final loss {format_pm(v)}", flush=True)
    res = ComparisonResult(spec, records, seconds, higher_is_better=False, metric="loss")
    if problem.optimum is not None:
        opt = f"; optimum {problem.optimum:.4f} (closed form)"
    else:
        opt = f"; optimum about {reference_optimum(problem):.4f} (Adam on the fixed-draw loss)"
    print(f"\n## {name}\n\n{spec.describe()}{opt}\n")
    print(res.grid_table())
    print()
    print(res.summary_table(baseline="impdiff", extras=(("wall s (3 seeds)", "wall", ".1f"),)))
    best = {m: runner.curve(m, res.best_lr(m)) for m in methods}
    target = min(np.nanmean(best[b]["losses"][-1]) for b in BASELINES)
    print(f"\nTime to reach the baselines' best final mean loss ({target:.4f}), each method at "
          f"its best lr:\n")
    print("| method | best lr | time to target (s) | total wall (s) | final loss | "
          "mean ESS / N |")
    print("|---|---|---|---|---|---|")
    for m in methods:
        c = best[m]
        t = time_to(c, target)
        tt = f"{t:.2f}" if t is not None else "not reached"
        ess = f"{np.mean(c['ess']):.2f}" if m.startswith("sosmc") else "-"
        print(f"| {m} | {res.best_lr(m):g} | {tt} | {c['times'][-1]:.2f} | "
              f"{format_pm(c['losses'][-1])} | {ess} |")
    print("\nMean loss at 25/50/75/100% of the budget (wall s in brackets):\n")
    print("| method | 25% | 50% | 75% | 100% |\n|---|---|---|---|---|")
    for m in methods:
        c = best[m]
        k = len(c["times"])
        cells = [f"{np.nanmean(c['losses'][i]):.4f} ({c['times'][i]:.2f})"
                 for i in (k // 4 - 1, k // 2 - 1, 3 * k // 4 - 1, k - 1)]
        print(f"| {m} | " + " | ".join(cells) + " |")
    print(flush=True)
    plots[name] = (best, problem.optimum)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fast", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--checkpoints", type=int, default=20)
    ap.add_argument("--soul-inner", type=int, default=10)
    ap.add_argument("--only", choices=sorted(SETUPS), default=None)
    ap.add_argument("--main-only", action="store_true",
                    help="only the authors' settings (no variant rows)")
    ap.add_argument("--plot", default=None, help="save loss-vs-wall-time curves to this path")
    args = ap.parse_args()
    if args.seeds < 3:
        ap.error("--seeds: at least 3")
    print(f"# SOSMC benchmark ({time.strftime('%Y-%m-%d')}, {platform.processor() or 'cpu'}, "
          f"{os.cpu_count()} CPUs, jax {jax.__version__}, backend {jax.default_backend()})\n")
    t_all = time.perf_counter()
    plots = {}
    for name in SETUPS:
        if args.only in (None, name):
            bench_problem(name, args, plots)
    if args.plot:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(plots), figsize=(4.2 * len(plots), 3.4))
        for ax, (name, (best, optimum)) in zip(np.atleast_1d(axes), plots.items()):
            for m, c in best.items():
                ax.plot(c["times"], np.nanmean(c["losses"], 1), marker=".", label=m)
            if optimum is not None:
                ax.axhline(optimum, color="k", lw=0.8, ls=":", label="optimum")
            ax.set(title=name, xlabel="wall time (s)", ylabel="loss (mean over seeds)")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        np.atleast_1d(axes)[0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"saved {args.plot}")
    print(f"\ntotal benchmark time {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
