"""``python -m jaxlib_ext milp FILE.mps [--time-limit S] ...``: solve a MILP file.

Reads an MPS/LP file through HiGHS, runs :func:`jaxlib_ext.samplers.milp.solve` (annealed
discrete Langevin sampling with exact LP completion) with a progress bar of the best objective
and the elapsed time, and prints the certified result (status, objective, violations);
``--rule`` picks the sampling rule (``rld``, ``dlp`` or ``dmala``); ``--proposal DIR`` samples
with a trained learned proposal (``proposal.save_proposal``), with ``--metropolis`` under the
Metropolis-Hastings test; ``--compare-highs`` also runs HiGHS under the
same time limit, ``--solution FILE`` writes ``name value`` lines. ``--time-limit`` bounds the whole
solve, compilation included. Exit status 0 when a certified feasible solution (or a proof of
infeasibility/unboundedness) is reported, 1 when none was found in time, 2 on bad input (including
a missing proposal or one trained for other feature sizes).
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from jaxlib_ext.samplers.milp.solve import SOLVE_RULES

    p = argparse.ArgumentParser(prog="python -m jaxlib_ext milp",
                                description="solve a MILP (MPS/LP file) by learned Langevin "
                                            "sampling with exact LP completion (HiGHS)")
    p.add_argument("file", help="MPS (free or fixed) or CPLEX LP file")
    p.add_argument("--time-limit", type=float, default=60.0,
                   help="seconds for the whole solve, compilation included (default 60)")
    p.add_argument("--chains", type=int, default=16, help="parallel chains (default 16)")
    p.add_argument("--rule", default="rld", choices=SOLVE_RULES,
                   help="sampling rule: regularised flip rule (default), DLP, or DLP with MH")
    p.add_argument("--proposal", default=None, metavar="DIR",
                   help="a trained learned proposal (saved by proposal.save_proposal) that "
                        "draws the sampler's moves; replaces --rule")
    p.add_argument("--metropolis", action="store_true",
                   help="with --proposal: accept or reject its moves by Metropolis-Hastings")
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
        if args.metropolis and args.proposal is None:
            raise ValueError("--metropolis: needs --proposal DIR (for DLP with MH use "
                             "--rule dmala)")
        if args.proposal is not None and args.rule != "rld":
            raise ValueError("--proposal, --rule: a learned proposal draws the moves itself; "
                             "give one of them")
        problem = milp.read_mps(args.file)
        proposal = None
        if args.proposal is not None:
            from jaxlib_ext.samplers.milp.proposal import load_proposal

            proposal = load_proposal(args.proposal)
        print(f"problem: {problem.name}: {problem.num_vars} columns "
              f"({int(problem.integrality.sum())} integer), {problem.num_rows} rows, "
              f"{'minimise' if problem.sense == 1 else 'maximise'}")
        result = milp.solve(problem, time_limit=args.time_limit, num_chains=args.chains,
                            rule=args.rule, steps_per_round=args.steps_per_round,
                            seed=args.seed, proposal=proposal, metropolis=args.metropolis,
                            progress=not args.no_progress)
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
