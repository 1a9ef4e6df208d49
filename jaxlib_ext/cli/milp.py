"""``python -m jaxlib_ext milp FILE.mps [--time-limit S] ...``: solve a MILP file.

Reads an MPS/LP file through HiGHS, runs :func:`jaxlib_ext.samplers.milp.solve` (annealed
discrete Langevin sampling with exact LP completion) with a progress bar of the best objective,
and prints the certified result (status, objective, violations); ``--compare-highs`` also runs
HiGHS under the same time limit, ``--solution FILE`` writes ``name value`` lines. Exit status 0
when a certified feasible solution (or a proof of infeasibility/unboundedness) is reported, 1
when none was found in time, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from jaxlib_ext.samplers.milp.langevin import METHODS

    p = argparse.ArgumentParser(prog="python -m jaxlib_ext milp",
                                description="solve a MILP (MPS/LP file) by learned Langevin "
                                            "sampling with exact LP completion (HiGHS)")
    p.add_argument("file", help="MPS (free or fixed) or CPLEX LP file")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds (default 60)")
    p.add_argument("--chains", type=int, default=16, help="parallel chains (default 16)")
    p.add_argument("--method", default="rld", choices=METHODS,
                   help="sampler: regularised flip rule (default), DLP, or DLP with MH")
    p.add_argument("--steps-per-round", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare-highs", action="store_true",
                   help="also run HiGHS with the same time limit")
    p.add_argument("--solution", default=None, help="write the solution here (name value)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    from jaxlib_ext.samplers import milp

    try:
        if not args.time_limit > 0:
            raise ValueError(f"--time-limit: expected > 0, got {args.time_limit}")
        if args.chains < 1:
            raise ValueError(f"--chains: expected >= 1, got {args.chains}")
        problem = milp.read_mps(args.file)
        print(f"problem: {problem.name}: {problem.num_vars} columns "
              f"({int(problem.integrality.sum())} integer), {problem.num_rows} rows, "
              f"{'minimise' if problem.sense == 1 else 'maximise'}")
        result = milp.solve(problem, time_limit=args.time_limit, num_chains=args.chains,
                            method=args.method, steps_per_round=args.steps_per_round,
                            seed=args.seed, progress=not args.no_progress)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result)
    for t, obj in result.trace:
        print(f"  t={t:8.3f}s  best={obj:.10g}")
    if args.compare_highs:
        h = milp.solve_highs(problem, time_limit=args.time_limit)
        print(f"highs: status {h.status}, objective {h.objective:.10g}, bound {h.bound:.10g}, "
              f"{h.seconds:.3f}s")
    if args.solution and result.feasible:
        with open(args.solution, "w") as f:
            for name, v in zip(problem.col_names, result.x):
                f.write(f"{name} {v:.17g}\n")
    if result.feasible or result.status in ("infeasible", "unbounded",
                                            "unbounded_or_infeasible"):
        return 0
    return 1
