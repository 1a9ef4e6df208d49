"""``python -m jaxlib_ext milp-train --family F --out DIR``: train a learned MILP proposal.

Generates ``--instances`` instances of one family (:data:`jaxlib_ext.samplers.milp.FAMILIES`,
seeds ``--seed0 ..``, generator arguments from ``--param name=value``), trains the learned
proposal (P.1) on its own rollouts by :func:`jaxlib_ext.samplers.milp.train_proposal` with a
progress bar and resumable checkpoints in ``DIR/run``, and saves the result with
:func:`jaxlib_ext.samplers.milp.save_proposal` to ``DIR``, for ``python -m jaxlib_ext milp FILE
--proposal DIR`` or :func:`jaxlib_ext.samplers.milp.load_proposal`. Exit status 0 on success, 2
on bad input.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxlib_ext milp-train",
                                description="train the learned Langevin MILP proposal on "
                                            "generated instances of one family, without labels")
    p.add_argument("--family", required=True,
                   help="setcover, cauction, facility or indset")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a generator argument, e.g. --param n_rows=50 (repeatable)")
    p.add_argument("--instances", type=int, default=200, help="training instances (200)")
    p.add_argument("--seed0", type=int, default=0, help="the first instance's seed")
    p.add_argument("--out", required=True, help="the proposal's folder")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--chains", type=int, default=32, help="on-policy chains (32)")
    p.add_argument("--rollout-steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0, help="the training run's PRNG seed")
    p.add_argument("--checkpoint-every", type=int, default=500)
    p.add_argument("--no-resume", action="store_true", help="start over in an existing folder")
    p.add_argument("--no-progress", action="store_true")
    return p


def _params(items: list[str]) -> dict:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--param: expected NAME=VALUE, got {item!r}")
        try:
            out[name] = int(value)
        except ValueError:
            try:
                out[name] = float(value)
            except ValueError:
                raise ValueError(f"--param {name}: expected a number, got {value!r}") from None
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    import jax

    from jaxlib_ext.samplers import milp

    try:
        if args.family not in milp.FAMILIES:
            raise ValueError(f"--family: expected one of {sorted(milp.FAMILIES)}, got "
                             f"{args.family!r}")
        if args.instances < 1:
            raise ValueError(f"--instances: expected >= 1, got {args.instances}")
        kwargs = _params(args.param)
        gen = milp.FAMILIES[args.family]
        try:
            problems = [gen(args.seed0 + i, **kwargs) for i in range(args.instances)]
        except TypeError as e:
            raise ValueError(f"--param: {e}") from None
        out = pathlib.Path(args.out)
        proposal, losses = milp.train_proposal(
            jax.random.key(args.seed), problems, hidden=args.hidden, num_layers=args.layers,
            steps=args.steps, learning_rate=args.lr, num_chains=args.chains,
            rollout_steps=args.rollout_steps, progress=not args.no_progress,
            checkpoint_dir=out / "run", checkpoint_every=args.checkpoint_every,
            resume=not args.no_resume)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    milp.save_proposal(out, proposal, {"family": args.family, "params": kwargs,
                                       "instances": args.instances, "seed0": args.seed0,
                                       "steps": args.steps, "seed": args.seed})
    if losses.size:
        k = max(1, losses.size // 10)
        print(f"loss (minus the mean one-step energy decrease, plus the move term): "
              f"{losses[:k].mean():.4g} (first {k} steps) -> {losses[-k:].mean():.4g} "
              f"(last {k})")
    print(f"saved the proposal to {out}")
    return 0
