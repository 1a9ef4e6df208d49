"""Langevin MILP sampler vs the supervised Neural-Diving baseline vs HiGHS.

Per family (set cover, combinatorial auction, capacitated facility location, independent set;
``jaxlib_ext.samplers.milp.generators``) at two sizes, on unseen instances (test seeds never used
for training), and on the MIPLIB 3 instances p0033 and p0201 (several sampler seeds): feasibility
rate, mean primal gap to the HiGHS optimum ``100 |f - f*| / max(|f*|, 1)`` (over the instances
a method solved) and mean wall time for

* ``unsup-gnn``: the Langevin flip-rule sampler with the unsupervised bipartite GNN's logits,
  trained per family on generated instances of both sizes without labels;
* ``langevin``: the same sampler untrained (the GNN's head is zero at initialisation);
* ``neural-diving``: the same network trained on HiGHS-optimal labels; predict, fix, complete;
* ``highs``: HiGHS branch-and-cut, one thread, the same time limit.

Every method gets the same wall-time limit per instance. The samplers run their first annealing
round in full, so their wall time can exceed the limit; the tables show the measured times.
Compilation is excluded: each (family, size) is padded to one shape and solved once before
timing. For MIPLIB no family matches; the learned samplers use the set-cover networks (transfer).
The learned-vs-supervised comparison uses one learning rate and one training seed per family (a
short training budget on 2 CPU cores), so it is indicative, not a verdict under the
``_comparison`` rule.

``--rule FAMILY``: instead, the learned-vs-supervised comparison under the ``_comparison`` rule
on the family's smaller size: both networks on the same learning-rate grid and seeds, the same
training instances and steps, each method's rate picked by the mean validation gap (8
validation instances), the test gap reported at that rate.

Scaling: time per sampler step (flip rule with exact gains, and DMALA) vs number of integer
variables (set cover, rows = columns / 2) and chains.

    python benchmarks/samplers_milp.py              # full run, about 15 min on 2 busy CPU cores
    python benchmarks/samplers_milp.py --fast       # smoke run
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.samplers import milp

SIZES = {
    "setcover": (dict(n_rows=50, n_cols=100), dict(n_rows=100, n_cols=200)),
    "cauction": (dict(n_items=20, n_bids=50), dict(n_items=40, n_bids=100)),
    "facility": (dict(n_customers=10, n_facilities=5), dict(n_customers=20, n_facilities=10)),
    "indset": (dict(n_nodes=50), dict(n_nodes=100)),
}
METHODS = ("unsup-gnn", "langevin", "neural-diving", "highs")
TRAIN_SEED0 = 10_000


def size_name(kw):
    return "x".join(str(v) for v in kw.values())


def gap(obj, ref):
    return 100.0 * abs(obj - ref) / max(abs(ref), 1.0)


def run_methods(p, models, args, pad_to, seed=0):
    out = {}
    unsup, sup = models
    r = milp.solve(p, time_limit=args.time_limit, model=unsup, pad_to=pad_to, seed=seed,
                   num_chains=args.chains, steps_per_round=args.steps_per_round)
    out["unsup-gnn"] = (r.feasible, r.objective, r.seconds)
    r = milp.solve(p, time_limit=args.time_limit, pad_to=pad_to, seed=seed,
                   num_chains=args.chains, steps_per_round=args.steps_per_round)
    out["langevin"] = (r.feasible, r.objective, r.seconds)
    r = milp.neural_diving(p, sup, time_limit=args.time_limit, pad_to=pad_to)
    out["neural-diving"] = (r.feasible, r.objective, r.seconds)
    t = time.perf_counter()
    h = milp.solve_highs(p, time_limit=args.time_limit)
    out["highs"] = (h.x is not None, h.objective, time.perf_counter() - t)
    return out, h


def reference(p, h):
    if h.status == "optimal":
        return h.objective
    r = milp.solve_highs(p, time_limit=120.0)
    return r.objective if r.status == "optimal" else float("nan")


def summarise(rows):
    """rows: list of dicts method -> (feasible, objective, seconds, ref)."""
    res = {}
    for m in METHODS:
        feas = [r[m][0] for r in rows]
        gaps = [gap(r[m][1], r[m][3]) for r in rows if r[m][0] and np.isfinite(r[m][3])]
        secs = [r[m][2] for r in rows]
        res[m] = (100.0 * np.mean(feas), np.mean(gaps) if gaps else float("nan"),
                  np.max(gaps) if gaps else float("nan"), np.mean(secs))
    return res


def table(title, results):
    print(f"\n### {title}\n")
    print("| instances | n | method | feasible % | mean gap % | max gap % | mean s |")
    print("|---|---|---|---|---|---|---|")
    for (name, count), res in results:
        for m in METHODS:
            f, g, gmax, s = res[m]
            print(f"| {name} | {count} | {m} | {f:.0f} | {g:.2f} | {gmax:.2f} | {s:.3f} |")


def bench_family(family, args, all_results, models_out):
    gen = milp.FAMILIES[family]
    key = jax.random.key(0)
    train = [gen(TRAIN_SEED0 + i, **kw) for kw in SIZES[family] for i in range(args.train)]
    t = time.perf_counter()
    unsup, ul = milp.train_unsupervised(key, train, steps=args.train_steps,
                                        num_steps=args.train_sampler_steps, snapshots=4,
                                        learning_rate=args.lr)
    t_unsup = time.perf_counter() - t
    t = time.perf_counter()
    sup, sl = milp.train_supervised(key, train, steps=args.train_steps, learning_rate=args.lr)
    t_sup = time.perf_counter() - t
    print(f"\n{family}: {len(train)} training instances; unsupervised training {t_unsup:.1f}s "
          f"(loss {ul[:10].mean():.4g} -> {ul[-10:].mean():.4g}), supervised {t_sup:.1f}s incl. "
          f"HiGHS labels (BCE {sl[:10].mean():.4g} -> {sl[-10:].mean():.4g})", flush=True)
    models_out[family] = (unsup, sup)
    for kw in SIZES[family]:
        tests = [gen(s, **kw) for s in range(args.instances)]
        n = max(int(p.integrality.sum()) for p in tests)
        m = max(p.num_rows for p in tests)
        for model in (unsup, None):  # compile once per shape
            milp.solve(tests[0], time_limit=60.0, model=model, pad_to=(n, m), max_rounds=1,
                       num_chains=args.chains, steps_per_round=args.steps_per_round)
        milp.neural_diving(tests[0], sup, time_limit=5.0, pad_to=(n, m))
        rows = []
        t = time.perf_counter()
        for p in tests:
            out, h = run_methods(p, (unsup, sup), args, (n, m))
            ref = reference(p, h)
            rows.append({k: (*v, ref) for k, v in out.items()})
        res = summarise(rows)
        all_results.append(((f"{family} {size_name(kw)}", len(tests)), res))
        print(f"  {family} {size_name(kw)}: {len(tests)} instances in "
              f"{time.perf_counter() - t:.0f}s: " + ", ".join(
                  f"{k} feas {v[0]:.0f}% gap {v[1]:.2f}%" for k, v in res.items()), flush=True)


def bench_miplib(args, models, all_results):
    unsup, sup = models.get("setcover", (None, None))
    for name in ("p0033", "p0201"):
        p = milp.read_mps(milp.miplib_path(name))
        ref = {"p0033": 3089.0, "p0201": 7615.0}[name]
        n, m = p.num_vars, p.num_rows
        for model in (unsup, None):
            milp.solve(p, time_limit=60.0, model=model, max_rounds=1, num_chains=args.chains,
                       steps_per_round=args.steps_per_round)
        milp.neural_diving(p, sup, time_limit=5.0)
        rows = []
        for seed in range(args.miplib_seeds):
            out, _ = run_methods(p, (unsup, sup), args, (n, m), seed=seed)
            rows.append({k: (*v, ref) for k, v in out.items()})
        all_results.append(((f"{name} (seeds)", len(rows)), summarise(rows)))


def bench_scaling(args):
    print("\n### Time per sampler step (ms), set cover, rows = columns / 2\n")
    print("| method | n (integer vars) | chains | ms / step | ms / step / chain |")
    print("|---|---|---|---|---|")
    steps = 50
    temps, pens = milp.annealing_schedule(steps)
    for method in ("rld", "dmala"):
        for n in args.scaling_n:
            d = milp.energy_data(milp.set_cover(0, n_rows=n // 2, n_cols=n))
            for k in args.scaling_chains:
                z0 = jnp.zeros((k, n))
                kw = dict(temperatures=temps, penalties=pens, method=method, step_size=0.1)
                jax.block_until_ready(milp.run_langevin(jax.random.key(0), d, z0, **kw))
                t = time.perf_counter()
                jax.block_until_ready(milp.run_langevin(jax.random.key(1), d, z0, **kw))
                ms = 1e3 * (time.perf_counter() - t) / steps
                print(f"| {method} | {n} | {k} | {ms:.3f} | {ms / k:.4f} |", flush=True)


def rule_comparison(args):
    from _comparison import Comparison, run_comparison

    gen, kw = milp.FAMILIES[args.rule], SIZES[args.rule][0]
    train = [gen(TRAIN_SEED0 + i, **kw) for i in range(args.train)]
    val = [gen(20_000 + i, **kw) for i in range(8)]
    test = [gen(i, **kw) for i in range(args.instances)]
    labels = [milp.solve_highs(p, time_limit=30.0).x for p in train]
    refs = {id(p): milp.solve_highs(p, time_limit=120.0).objective for p in val + test}
    n = max(int(p.integrality.sum()) for p in val + test)
    m = max(p.num_rows for p in val + test)
    spec = Comparison(methods=("neural-diving", "unsup-gnn"), lrs=(3e-4, 1e-3, 3e-3),
                      seeds=(0, 1, 2), budget=f"{args.train_steps} Adam steps on {len(train)} "
                      f"{args.rule} {size_name(kw)} instances; {args.time_limit}s per instance")
    print(spec.describe())

    def mean_gap(solver, problems):
        gaps = []
        for p in problems:
            r = solver(p)
            gaps.append(gap(r.objective, refs[id(p)]) if r.feasible else 100.0)
        return float(np.mean(gaps))

    def run(method, lr, seed):
        key = jax.random.key(seed)
        if method == "unsup-gnn":
            model, _ = milp.train_unsupervised(key, train, steps=args.train_steps,
                                               num_steps=args.train_sampler_steps, snapshots=4,
                                               learning_rate=lr)
            milp.solve(val[0], time_limit=60.0, model=model, pad_to=(n, m), max_rounds=1,
                       num_chains=args.chains, steps_per_round=args.steps_per_round)
            solver = lambda p: milp.solve(  # noqa: E731
                p, time_limit=args.time_limit, model=model, pad_to=(n, m), seed=seed,
                num_chains=args.chains, steps_per_round=args.steps_per_round)
        else:
            model, _ = milp.train_supervised(key, train, solutions=labels,
                                             steps=args.train_steps, learning_rate=lr)
            milp.neural_diving(val[0], model, time_limit=5.0, pad_to=(n, m))
            solver = lambda p: milp.neural_diving(  # noqa: E731
                p, model, time_limit=args.time_limit, pad_to=(n, m))
        return {"val": mean_gap(solver, val), "test": mean_gap(solver, test)}

    result = run_comparison(spec, run, metric="gap %")
    print("\n" + result.grid_table(fmt=".3f"))
    print("\n" + result.summary_table(baseline="neural-diving", fmt=".3f"))
    print("\n" + result.verdict("unsup-gnn", "neural-diving", fmt=".3f"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fast", action="store_true", help="smoke run")
    ap.add_argument("--instances", type=int, default=25,
                    help="test instances per family size (two sizes: 50 per family)")
    ap.add_argument("--train", type=int, default=12, help="training instances per size")
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--train-sampler-steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--time-limit", type=float, default=0.5)
    ap.add_argument("--chains", type=int, default=16)
    ap.add_argument("--steps-per-round", type=int, default=200)
    ap.add_argument("--miplib-seeds", type=int, default=5)
    ap.add_argument("--families", default=",".join(SIZES))
    ap.add_argument("--rule", default=None, choices=tuple(SIZES),
                    help="only the learned-vs-supervised comparison under the _comparison rule")
    args = ap.parse_args()
    args.scaling_n = (100, 200, 400, 800)
    args.scaling_chains = (1, 4, 16, 64)
    if args.fast:
        args.instances, args.train, args.train_steps, args.miplib_seeds = 3, 2, 10, 1
        args.train_sampler_steps = 40
        args.scaling_n, args.scaling_chains = (100,), (1, 4)
    print(f"# Langevin MILP benchmark ({time.strftime('%Y-%m-%d')}, "
          f"{platform.processor() or 'cpu'}, {os.cpu_count()} CPUs, jax {jax.__version__}, "
          f"backend {jax.default_backend()}, highspy {_highs_version()})")
    print(f"time limit {args.time_limit}s per instance and method, {args.chains} chains, "
          f"{args.steps_per_round} steps per annealing round; GNN: {args.train} training "
          f"instances per size, {args.train_steps} Adam steps at lr {args.lr}")
    t0 = time.perf_counter()
    if args.rule:
        rule_comparison(args)
        print(f"\ntotal {time.perf_counter() - t0:.0f}s")
        return
    results, models = [], {}
    for family in args.families.split(","):
        bench_family(family, args, results, models)
    bench_miplib(args, models, results)
    table("Feasibility, primal gap to the HiGHS optimum, wall time", results)
    bench_scaling(args)
    print(f"\ntotal {time.perf_counter() - t0:.0f}s")


def _highs_version():
    from importlib.metadata import version

    return version("highspy")


if __name__ == "__main__":
    main()
