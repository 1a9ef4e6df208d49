"""Langevin MILP: the learned proposal vs the oracle-gain rule, DMALA, Neural Diving and HiGHS.

Per family (set cover, combinatorial auction, capacitated facility location, independent set;
``jaxlib_ext.samplers.milp.generators``) at two sizes, on unseen instances (test seeds never used
for training or validation), and on the MIPLIB 3 instances p0033 and p0201:

* ``learned``: the learned proposal (P.1; the network is the proposal), trained per family and
  size by ``train_proposal`` on its own rollouts (on-policy REINFORCE, no labels);
* ``rld``: the regularised flip rule with exact single-move gains (the oracle-gain baseline:
  regularised Langevin with the energy's exact gains, untrained);
* ``dmala``: plain discrete Langevin with the MH test (gradient proposal, untrained);
* ``neural-diving``: the same network size trained on HiGHS-optimal labels; predict, fix,
  complete with HiGHS;
* ``highs``: HiGHS branch-and-cut, one thread.

The two trained methods follow the ``_comparison`` rule: the same learning-rate grid, seeds and
training budget, each method's rate picked by its mean validation gap at equal wall time, the
test figures reported at that rate over the 3 seeds. The untrained samplers run with the same 3
sampler seeds. Two budgets:

* equal wall time: every method gets ``--time-limit`` seconds per instance, compilation included
  (each shape is compiled once before timing, so the limit buys sampling, not compiling);
* equal sampler steps: the samplers run ``--rounds`` annealing rounds of ``--steps-per-round``
  steps with the same chains and start states, without a time limit.

Metrics: feasibility rate (a certified point found), mean primal gap to the HiGHS optimum
``100 |f - f*| / max(|f*|, 1)`` (an instance without a solution counts as 100 %), and the time to
the first feasible point. For MIPLIB no family matches; the learned models are the set-cover
ones of the smaller size (transfer).

Scaling: time per sampler step (flip rule with exact gains, DMALA) vs integer variables.

    python -m benchmarks.samplers_milp              # all families, about 45 min on 2 CPU cores
    python -m benchmarks.samplers_milp --families setcover --sizes 0
    python -m benchmarks.samplers_milp --fast       # smoke run
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import types

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
SAMPLERS = ("learned", "rld", "dmala")
METHODS = (*SAMPLERS, "neural-diving", "highs")
TRAIN_SEED0, VAL_SEED0 = 10_000, 20_000
LRS = (3e-4, 1e-3, 3e-3)
SEEDS = (0, 1, 2)


def size_name(kw):
    return "x".join(str(v) for v in kw.values())


def gap(obj, ref):
    return 100.0 * abs(obj - ref) / max(abs(ref), 1.0)


def score(results, refs):
    """(feasible %, mean gap % with 100 for a miss, mean seconds to the first feasible point)."""
    feas = [r.feasible for r in results]
    gaps = [gap(r.objective, f) if r.feasible else 100.0 for r, f in zip(results, refs)]
    first = [r.trace[0][0] for r in results if r.feasible and r.trace]
    return (100.0 * float(np.mean(feas)), float(np.mean(gaps)),
            float(np.mean(first)) if first else float("nan"))


class Bench:
    """One (family, size): instances, references, and the solver calls of every method."""

    def __init__(self, family, kw, args):
        gen = milp.FAMILIES[family]
        self.name = f"{family} {size_name(kw)}"
        self.args = args
        self.train = [gen(TRAIN_SEED0 + i, **kw) for i in range(args.train)]
        self.val = [gen(VAL_SEED0 + i, **kw) for i in range(args.val)]
        self.test = [gen(i, **kw) for i in range(args.instances)]
        self.refs = {id(p): milp.solve_highs(p, time_limit=120.0).objective
                     for p in self.val + self.test}
        self.pad = (max(int(p.integrality.sum()) for p in self.val + self.test),
                    max(p.num_rows for p in self.val + self.test))
        self._labels = None

    def labels(self):
        if self._labels is None:
            self._labels = [milp.solve_highs(p, time_limit=30.0).x for p in self.train]
        return self._labels

    def sampler(self, rule, proposal=None, seed=0, budget="time"):
        a = self.args
        kw = dict(pad_to=self.pad, seed=seed, num_chains=a.chains,
                  steps_per_round=a.steps_per_round)
        if rule == "learned":
            kw["proposal"] = proposal
        else:
            kw["rule"] = rule
        if budget == "time":
            return lambda p: milp.solve(p, time_limit=a.time_limit, **kw)
        return lambda p: milp.solve(p, time_limit=1e9, max_rounds=a.rounds, **kw)

    def warm(self, solver):
        solver(self.val[0] if self.val else self.test[0])  # compile the padded shape

    def scores(self, solver, problems):
        return score([solver(p) for p in problems], [self.refs[id(p)] for p in problems])


def train_learned(bench, lr, seed, args):
    proposal, _ = milp.train_proposal(jax.random.key(seed), bench.train, hidden=args.hidden,
                                      num_layers=args.layers, steps=args.train_steps,
                                      learning_rate=lr, num_chains=args.train_chains,
                                      rollout_steps=args.steps_per_round)
    return proposal


def train_diving(bench, lr, seed, args):
    model, _ = milp.train_supervised(jax.random.key(seed), bench.train, solutions=bench.labels(),
                                     hidden=args.hidden, num_layers=args.layers,
                                     steps=args.train_steps, learning_rate=lr)
    return model


def bench_size(family, kw, args, rows, models):
    from _comparison import Comparison, run_comparison

    t0 = time.perf_counter()
    b = Bench(family, kw, args)
    spec = Comparison(methods=("neural-diving", "learned"), lrs=LRS, seeds=SEEDS,
                      budget=f"{args.train_steps} Adam steps on {len(b.train)} {b.name} "
                             f"instances, GNN {args.hidden} x {args.layers}")
    print(f"\n## {b.name}\n\n{spec.describe()}", flush=True)
    extra = {}

    def run(method, lr, seed):
        if method == "learned":
            proposal = train_learned(b, lr, seed, args)
            solver = b.sampler("learned", proposal, seed)
            b.warm(solver)
            steps_solver = b.sampler("learned", proposal, seed, budget="steps")
            extra[method, lr, seed] = (proposal, b.scores(steps_solver, b.test))
        else:
            model = train_diving(b, lr, seed, args)
            solver = lambda p: milp.neural_diving(  # noqa: E731
                p, model, time_limit=args.time_limit, pad_to=b.pad)
            b.warm(solver)
            extra[method, lr, seed] = (model, None)
        val, test = b.scores(solver, b.val), b.scores(solver, b.test)
        extra[method, lr, seed] += (test,)
        return {"val": val[1], "test": test[1]}

    result = run_comparison(spec, run, metric="gap %")
    print("\n" + result.grid_table(fmt=".3f"))
    print("\n" + result.summary_table(baseline="neural-diving", fmt=".3f"))
    print("\n" + result.verdict("learned", "neural-diving", fmt=".3f"), flush=True)
    best = {m: result.best_lr(m) for m in spec.methods}
    table = {}
    for m in spec.methods:
        table[m, "time"] = [extra[m, best[m], s][2] for s in SEEDS]
        if m == "learned":
            table[m, "steps"] = [extra[m, best[m], s][1] for s in SEEDS]
    models[b.name] = {m: extra[m, best[m], SEEDS[0]][0] for m in spec.methods}
    for m in ("rld", "dmala"):
        for budget in ("time", "steps"):
            solvers = [b.sampler(m, seed=s, budget=budget) for s in SEEDS]
            b.warm(solvers[0])
            table[m, budget] = [b.scores(sv, b.test) for sv in solvers]
    h = [milp.solve_highs(p, time_limit=args.time_limit) for p in b.test]
    table["highs", "time"] = [score([_highs_result(p, r) for p, r in zip(b.test, h)],
                                    [b.refs[id(p)] for p in b.test])]
    rows.append((b.name, len(b.test), table, best))
    print(f"{b.name}: {time.perf_counter() - t0:.0f}s", flush=True)


def _highs_result(p, r):
    """HiGHS's answer as the fields :func:`score` reads; its first-feasible time is its solve
    time (HiGHS reports only the final incumbent here)."""
    feasible = r.x is not None and milp.check_solution(p, r.x).feasible
    return types.SimpleNamespace(feasible=feasible, objective=r.objective,
                                 trace=[(r.seconds, r.objective)] if feasible else [])


def bench_miplib(args, rows, models):
    learned = models.get(f"setcover {size_name(SIZES['setcover'][0])}", {})
    for name, ref in (("p0033", 3089.0), ("p0201", 7615.0)):
        p = milp.read_mps(milp.miplib_path(name))
        table = {}
        for m in SAMPLERS:
            if m == "learned" and "learned" not in learned:
                continue
            for budget in ("time", "steps"):
                res = []
                for s in SEEDS:
                    kw = dict(seed=s, num_chains=args.chains, steps_per_round=args.steps_per_round)
                    kw.update(proposal=learned["learned"]) if m == "learned" else kw.update(
                        rule=m)
                    if budget == "time":
                        milp.solve(p, time_limit=1e9, max_rounds=1, **kw)  # compile
                        res.append(milp.solve(p, time_limit=args.time_limit, **kw))
                    else:
                        res.append(milp.solve(p, time_limit=1e9, max_rounds=args.rounds, **kw))
                table[m, budget] = [score([r], [ref]) for r in res]
        if "neural-diving" in learned:
            r = milp.neural_diving(p, learned["neural-diving"], time_limit=args.time_limit)
            table["neural-diving", "time"] = [score([r], [ref])]
        h = milp.solve_highs(p, time_limit=args.time_limit)
        table["highs", "time"] = [score([_highs_result(p, h)], [ref])]
        rows.append((f"{name} (3 seeds)", 1, table, {}))


def _pm(col):
    col = col[np.isfinite(col)]
    if not col.size:
        return "-"
    return f"{col.mean():.2f}" + (f" ± {col.std(ddof=1):.2f}" if col.size > 1 else "")


def print_tables(rows):
    for budget, title in (("time", "Equal wall time"), ("steps", "Equal sampler steps")):
        print(f"\n### {title}: feasibility, primal gap to the HiGHS optimum, time to first "
              "feasible point (mean ± std over 3 seeds)\n")
        print("| instances | n | method | lr | feasible % | gap % | first feasible s |")
        print("|---|---|---|---|---|---|---|")
        for name, count, table, best in rows:
            for m in METHODS:
                if (m, budget) not in table:
                    continue
                v = np.asarray(table[m, budget], float)
                lr = f"{best[m]:g}" if m in best else "-"
                cells = " | ".join(_pm(v[:, j]) for j in range(3))
                print(f"| {name} | {count} | {m} | {lr} | {cells} |")


def bench_scaling(args):
    print("\n### Time per sampler step (ms), set cover, rows = columns / 2\n")
    print("| method | n (integer vars) | chains | ms / step | ms / step / chain |")
    print("|---|---|---|---|---|")
    steps = 50
    temps, pens = milp.annealing_schedule(steps)
    for rule in ("rld", "dmala"):
        for n in args.scaling_n:
            d = milp.energy_data(milp.set_cover(0, n_rows=n // 2, n_cols=n))
            for k in args.scaling_chains:
                z0 = jnp.zeros((k, n))
                kw = dict(temperatures=temps, penalties=pens, rule=rule, step_size=0.1)
                jax.block_until_ready(milp.run_langevin(jax.random.key(0), d, z0, **kw))
                t = time.perf_counter()
                jax.block_until_ready(milp.run_langevin(jax.random.key(1), d, z0, **kw))
                ms = 1e3 * (time.perf_counter() - t) / steps
                print(f"| {rule} | {n} | {k} | {ms:.3f} | {ms / k:.4f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fast", action="store_true", help="smoke run")
    ap.add_argument("--families", default=",".join(SIZES))
    ap.add_argument("--sizes", default="0,1", help="which of each family's two sizes")
    ap.add_argument("--instances", type=int, default=10, help="test instances per size")
    ap.add_argument("--val", type=int, default=5, help="validation instances per size")
    ap.add_argument("--train", type=int, default=200, help="training instances per size")
    ap.add_argument("--train-steps", type=int, default=1000)
    ap.add_argument("--train-chains", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=0.5)
    ap.add_argument("--chains", type=int, default=16)
    ap.add_argument("--steps-per-round", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the equal-steps budget")
    ap.add_argument("--no-scaling", action="store_true")
    args = ap.parse_args()
    args.scaling_n = (100, 200, 400, 800)
    args.scaling_chains = (1, 4, 16, 64)
    if args.fast:
        args.instances, args.val, args.train, args.train_steps = 2, 2, 4, 10
        args.steps_per_round, args.rounds = 50, 1
        args.scaling_n, args.scaling_chains = (100,), (1, 4)
    print(f"# Langevin MILP benchmark ({time.strftime('%Y-%m-%d')}, "
          f"{platform.processor() or 'cpu'}, {os.cpu_count()} CPUs, jax {jax.__version__}, "
          f"backend {jax.default_backend()}, highspy {_highs_version()})")
    print(f"equal wall time {args.time_limit}s per instance; equal steps {args.rounds} x "
          f"{args.steps_per_round}; {args.chains} chains; {args.train} training, {args.val} "
          f"validation, {args.instances} test instances per size; GNN {args.hidden} x "
          f"{args.layers}, {args.train_steps} Adam steps")
    t0 = time.perf_counter()
    rows, models = [], {}
    sizes = [int(i) for i in args.sizes.split(",")]
    for family in args.families.split(","):
        for i in sizes:
            bench_size(family, SIZES[family][i], args, rows, models)
    bench_miplib(args, rows, models)
    print_tables(rows)
    if not args.no_scaling:
        bench_scaling(args)
    print(f"\ntotal {time.perf_counter() - t0:.0f}s")


def _highs_version():
    from importlib.metadata import version

    return version("highspy")


if __name__ == "__main__":
    main()
