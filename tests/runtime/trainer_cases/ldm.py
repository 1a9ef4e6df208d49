"""The latent diffusion trainer (:func:`jaxlib_ext.models.latent_diffusion.train`): a 4x4
autoencoder (207 parameters) trained for 2 steps, then the latent noise model (2,713
parameters) and its exponential moving average for ``steps`` steps, on 8 random images."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
from flax import nnx

from jaxlib_ext.core.schedule import WarmupCosine
from jaxlib_ext.models import latent_diffusion as ld

NAME = "ldm"
_AE_STEPS = 2  # shorter than any kill step: the interrupted stage is the one with the EMA
_HORIZON = 8  # the noise model's schedule length, fixed so that runs of any length share it
CONFIG = ld.LDMConfig(image_size=4, ae_channels=(4,), latent_channels=1, unet_channels=4,
                      unet_mults=(1,), unet_res_blocks=1, timesteps=10)


def run(out: pathlib.Path, *, steps: int, lr_scale: float = 1.0) -> dict[str, np.ndarray]:
    """Both stages into ``out`` (checkpoints every 2 steps); returns the model's arrays: the
    autoencoder, ``latent_scale`` and the noise model's EMA (decay 0.9), which is what
    :func:`~jaxlib_ext.models.latent_diffusion.train` keeps."""
    images = np.random.default_rng(0).uniform(-1.0, 1.0, (8, *CONFIG.image_shape))
    model, _ = ld.train(
        CONFIG, images=images.astype(np.float32), ae_steps=_AE_STEPS, diffusion_steps=steps,
        batch_size=4, ae_lr=WarmupCosine(1e-2 * lr_scale, 1, _AE_STEPS, 1e-3 * lr_scale),
        diffusion_lr=WarmupCosine(5e-3 * lr_scale, 2, _HORIZON, 5e-4 * lr_scale),
        ema_decay=0.9, out=out, checkpoint_every=2, progress=False)
    leaves = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(model)))[0]
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}
