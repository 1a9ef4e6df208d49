"""``python -m jaxlib_ext energy --out DIR ...``: trains a normalized energy prior on digits.

:func:`jaxlib_ext.samplers.energy.train.train` of an energy U-Net (arXiv 2605.15487) on the
bundled MNIST digits (or scikit-learn's 8x8 digits), resuming from the newest checkpoint in
``--out``; prints the steps run and the mean loss of the last 50 steps as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxlib_ext energy",
                                description="Train a normalized energy prior (arXiv 2605.15487).")
    p.add_argument("--data", choices=("mnist", "digits8"), default="mnist")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--cov-weight", type=float, default=1.0)
    p.add_argument("--cov-reduction", choices=("authors", "mean"), default="authors",
                   help="the covariance term's average: 1/d^2 (the authors') or 1/d (ours)")
    p.add_argument("--base-channels", type=int, default=16)
    p.add_argument("--sigma-min", type=float, default=0.01)
    p.add_argument("--sigma-max", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="checkpoint folder (resumes from it)")
    p.add_argument("--checkpoint-every", type=int, default=250)
    p.add_argument("--max-minutes", type=float, default=None)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run(a: argparse.Namespace):
    """Trains the prior of ``a``; returns :class:`~jaxlib_ext.samplers.energy.train.TrainResult`."""
    import numpy as np

    from jaxlib_ext.core import images
    from jaxlib_ext.samplers.energy import train as energy_train

    data = (images.load_mnist("train") if a.data == "mnist" else images.load_digits8()).images
    kwargs = {"channels": 1, "base_channels": a.base_channels,
              "data_mean": float(data.mean()), "data_var": float(data.var())}
    model = energy_train.build_model("unet", kwargs, a.seed)
    res = energy_train.train(
        model, data, steps=a.steps, batch_size=a.batch_size, learning_rate=a.lr,
        ema_decay=a.ema, cov_weight=a.cov_weight, cov_reduction=a.cov_reduction,
        sigma_min=a.sigma_min,
        sigma_max=a.sigma_max, seed=a.seed, checkpoint_dir=a.out,
        checkpoint_every=a.checkpoint_every, model_meta={"kind": "unet", "kwargs": kwargs},
        max_seconds=None if a.max_minutes is None else 60 * a.max_minutes,
        progress=not a.no_progress)
    if len(res.history["loss"]):
        print(json.dumps({"steps_run": len(res.history["loss"]),
                          "final_loss": float(np.mean(res.history["loss"][-50:]))}))
    return res


def main(argv: list[str] | None = None) -> int:
    from jaxlib_ext.cli._status import run_command

    return run_command(run, build_parser().parse_args(sys.argv[1:] if argv is None else argv))
