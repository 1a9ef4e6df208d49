"""``python -m jaxlib_ext grow SRC DST ...``: grows a trained LM checkpoint for a new run.

:func:`jaxlib_ext.models.growth.grow_checkpoint`: more blocks (depth) and, for a mixture of
experts, more experts (width), written to ``DST`` as step 0; a new run starts from it with
``python -m jaxlib_ext train --init-from DST``.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jaxlib_ext grow",
                                     description=__doc__.split("\n")[0].split(": ", 1)[1])
    parser.add_argument("src", help="checkpoint folder of a training run")
    parser.add_argument("dst", help="where the grown checkpoint goes (new folder)")
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("--no-depth", action="store_true", help="keep the number of blocks")
    parser.add_argument("--no-width", action="store_true", help="keep the number of experts")
    parser.add_argument("--keep-top-k", action="store_true", help="do not double top-k")
    parser.add_argument("--noise-scale", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    from jaxlib_ext.models.growth import grow_checkpoint

    try:
        cfg = grow_checkpoint(args.src, args.dst, step=args.step, depth=not args.no_depth,
                              width=not args.no_width, noise_scale=args.noise_scale,
                              double_top_k=not args.keep_top_k, seed=args.seed)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"grown: {cfg.n_layers} blocks, {cfg.num_experts} experts, top-{cfg.top_k} -> "
          f"{args.dst} (continue with: python -m jaxlib_ext train --init-from {args.dst} ...)")
    return 0
