"""``python -m jaxlib_ext ldm --out DIR ...``: trains the MNIST latent diffusion model.

:func:`jaxlib_ext.models.latent_diffusion.load_or_train` (the autoencoder, then the latent
noise model): a finished run in ``--out`` is reused, a run stopped after its autoencoder stage is
resumed. Prints the held-out reconstruction error of the autoencoder.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    from jaxlib_ext.models.diffusion import SCHEDULES

    parser = argparse.ArgumentParser(
        prog="python -m jaxlib_ext ldm",
        description="Train the MNIST latent diffusion model (autoencoder, then noise model); "
                    "a finished run in --out is reused, a run stopped after its autoencoder "
                    "stage resumed.")
    parser.add_argument("--out", required=True, help="checkpoint folder")
    parser.add_argument("--ae-steps", type=int, default=2000)
    parser.add_argument("--diffusion-steps", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timesteps", type=int, default=1000)
    parser.add_argument("--schedule", choices=SCHEDULES, default="cosine")
    parser.add_argument("--unet-channels", type=int, default=32)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def run(args: argparse.Namespace) -> dict:
    """Trains (or loads) the model of ``args``; returns its ``info`` with ``test_mse``."""
    import jax.numpy as jnp
    from flax import nnx

    from jaxlib_ext.core.images import load_mnist
    from jaxlib_ext.models import latent_diffusion as ldm

    config = ldm.LDMConfig(timesteps=args.timesteps, schedule=args.schedule,
                           unet_channels=args.unet_channels)
    model, info = ldm.load_or_train(args.out, config, ae_steps=args.ae_steps,
                                    diffusion_steps=args.diffusion_steps,
                                    batch_size=args.batch_size, seed=args.seed,
                                    progress=not args.no_progress)
    test = load_mnist("test", value_range=(-1.0, 1.0)).images
    recon = nnx.jit(lambda m, x: ldm.decode(m, ldm.encode(m, x)))(model, jnp.asarray(test))
    mse = float(jnp.mean((recon - test) ** 2))
    print(f"held-out reconstruction MSE ([-1, 1] pixels): {mse:.5f}; "
          f"latent_scale {info['latent_scale']:.4f}; AE {info['ae_seconds']:.0f} s, "
          f"diffusion {info['diffusion_seconds']:.0f} s; checkpoints in {args.out}")
    return {**info, "test_mse": mse}


def main(argv: list[str] | None = None) -> int:
    from jaxlib_ext.cli._status import run_command

    return run_command(run, build_parser().parse_args(sys.argv[1:] if argv is None else argv))
