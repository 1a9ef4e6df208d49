"""A small latent diffusion model for 28x28 digits: a KL-regularised convolutional autoencoder
and a noise-prediction U-Net in its latent space, with a variance-preserving schedule and DDIM /
ancestral sampling (Rombach et al., arXiv 2112.10752).

Conventions (everything a latent inverse solver needs):

* **Images** ``x [B, H, W, 1]``, float32, pixel values in ``[-1, 1]`` (``load_mnist(...,
  value_range=(-1, 1))``); :func:`decode` returns unclipped values of the same range.
* **Latents** ``z [B, H/f, W/f, latent_channels]`` with ``f = 2^(len(ae_channels) - 1)``
  (``[B, 7, 7, 4]`` for MNIST with the defaults). :func:`encode` returns the posterior mean of
  the encoder times ``latent_scale``, a constant fixed after the autoencoder is trained so that
  the training latents have unit standard deviation (Rombach et al., Sec. 4.3.2); the diffusion
  model lives in these scaled latents and :func:`decode` expects them.
* **Schedule** (:class:`~jaxlib_ext.models.diffusion.Schedule` of
  :func:`~jaxlib_ext.models.diffusion.make_schedule`, ``model.schedule``): ``T`` discrete steps
  indexed ``t = 0, ..., T - 1``; ``alphas_cumprod[t]`` is the ``alpha-bar`` of step ``t``
  (decreasing, ``alphas_cumprod[0] = 1 - betas[0]`` is one step of noise, not the clean latent).
  The forward process (Ho et al., arXiv 2006.11239, Eq. 4) is
  ``z_t = sqrt(alphas_cumprod[t]) z_0 + sqrt(1 - alphas_cumprod[t]) eps``, ``eps ~ N(0, I)``.
  ``"cosine"`` is Nichol & Dhariwal's (arXiv 2102.09672, Eq. 17, ``s = 0.008``, betas clipped at
  0.999); ``"linear"`` is Ho et al.'s betas from ``1e-4`` to ``0.02`` (scaled by ``1000 / T``).
* **Noise model** :func:`eps_model` ``(model, z_t [B, ...], t int [B]) -> eps-hat [B, ...]``:
  the U-Net's prediction of the ``eps`` that made ``z_t`` at step ``t``. The score is
  ``grad log p_t(z_t) = -eps-hat / sqrt(1 - alphas_cumprod[t])`` and Tweedie's clean estimate
  (:func:`~jaxlib_ext.models.diffusion.predict_z0`) is
  ``(z_t - sqrt(1 - abar_t) eps-hat) / sqrt(abar_t)``.
* **Samplers** over the steps of :mod:`jaxlib_ext.models.diffusion`: DDIM (Song et al., arXiv
  2010.02502, Eq. 12, with ``eta``) and ancestral (Ho et al., Eq. 11 with the posterior
  variance ``beta-tilde``); DDIM with ``eta = 1`` over every step is ancestral sampling.
  :func:`ddim_sample` and :func:`ancestral_sample` run them from ``z_{T-1} ~ N(0, I)`` to
  ``z_0`` (latents), with Tweedie's estimate clipped to ``[-4, 4]`` by default
  (:func:`~jaxlib_ext.models.diffusion.clip_eps`); :func:`sample_images` decodes.

Training: :func:`train` fits the autoencoder (MSE + ``kl_weight`` KL), fixes ``latent_scale``,
then the noise model (Ho et al.'s simple loss, Eq. 14, uniform ``t``) with an exponential moving
average of its parameters, which is what is kept. Each stage is one run of the training-loop
engine (:func:`jaxlib_ext.core.loop.run_loop`: progress bar, metrics rows, Orbax checkpoints from
which a stage killed mid-way resumes, a stop on a non-finite loss); the model after each stage is
checkpointed for :func:`load`, and :func:`load_or_train` reuses a finished checkpoint of the same
configuration. From the command line::

    python -m jaxlib_ext ldm --out DIR --ae-steps N --diffusion-steps M
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import shutil
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlib_ext.core.schedule import WarmupCosine
from jaxlib_ext.models.diffusion import (
    SCHEDULES,
    Schedule,
    alpha_bar,
    ancestral_step,
    clip_eps,
    ddim_step,
    ddim_timesteps,
    make_schedule,
    predict_z0,
    q_sample,
)
from jaxlib_ext.models.unet import ResBlock, UNet

__all__ = [
    "LDMConfig",
    "Autoencoder",
    "LatentDiffusion",
    "encode",
    "decode",
    "eps_model",
    "ddim_sample",
    "ancestral_sample",
    "sample_images",
    "autoencoder_loss",
    "diffusion_loss",
    "train",
    "load_or_train",
    "load",
]


# --------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class LDMConfig:
    """Sizes of the autoencoder, the latent U-Net and the schedule.

    Attributes:
      image_size: side of the square images (divisible by ``2^(len(ae_channels) - 1)``).
      image_channels: channels of the images.
      latent_channels: channels of the latent.
      ae_channels: autoencoder widths per resolution, full resolution first; one downsampling
        between consecutive entries.
      kl_weight: weight of the KL term (per latent dimension) against the per-pixel MSE.
      unet_channels: ``base_channels`` of the latent U-Net.
      unet_mults: ``channel_mults`` of the latent U-Net.
      unet_res_blocks: ``num_res_blocks`` of the latent U-Net.
      timesteps: ``T``.
      schedule: ``"cosine"`` or ``"linear"``.

    Raises:
      ValueError: if a size is not a positive int, ``image_size`` is not divisible by the
        downsampling, ``schedule`` is unknown or ``kl_weight`` is negative.

    References:
      Rombach et al., High-Resolution Image Synthesis with Latent Diffusion Models,
      arXiv 2112.10752.
    """

    image_size: int = 28
    image_channels: int = 1
    latent_channels: int = 4
    ae_channels: tuple[int, ...] = (16, 32, 64)
    kl_weight: float = 1e-4
    unet_channels: int = 32
    unet_mults: tuple[int, ...] = (1, 2)
    unet_res_blocks: int = 1
    timesteps: int = 1000
    schedule: str = "cosine"

    def __post_init__(self):
        object.__setattr__(self, "ae_channels", tuple(int(c) for c in self.ae_channels))
        object.__setattr__(self, "unet_mults", tuple(int(c) for c in self.unet_mults))
        for name in ("image_size", "image_channels", "latent_channels", "unet_channels",
                     "unet_res_blocks", "timesteps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if not self.ae_channels or min(self.ae_channels) < 1:
            raise ValueError(f"ae_channels: expected positive ints, got {self.ae_channels!r}")
        if self.image_size % self.downsampling:
            raise ValueError(f"image_size: {self.image_size} is not divisible by the "
                             f"autoencoder's downsampling {self.downsampling}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {SCHEDULES}, got {self.schedule!r}")
        if not self.kl_weight >= 0:
            raise ValueError(f"kl_weight: expected >= 0, got {self.kl_weight!r}")

    @property
    def downsampling(self) -> int:
        """The autoencoder's downsampling factor ``f = 2^(len(ae_channels) - 1)``."""
        return 2 ** (len(self.ae_channels) - 1)

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """``(S/f, S/f, latent_channels)``, a latent's shape without the batch axis."""
        s = self.image_size // self.downsampling
        return (s, s, self.latent_channels)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(S, S, image_channels)``, an image's shape without the batch axis."""
        return (self.image_size, self.image_size, self.image_channels)

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict (tuples as lists)."""
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict) -> LDMConfig:
        """The config of a :meth:`to_dict` dict ``d``; keys that are not fields are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()
                      if k in names})


# --------------------------------------------------------------------------- networks


class LatentScale(nnx.Variable):
    """A constant fixed after autoencoder training (never differentiated)."""


class Autoencoder(nnx.Module):
    """Convolutional autoencoder ``[B, S, S, C] <-> [B, S/f, S/f, latent_channels]``.

    The encoder gives the mean and log-variance of a diagonal Gaussian posterior (Rombach et
    al.'s KL-regularised autoencoder); the decoder maps a latent back to pixels. Residual blocks
    are :class:`~jaxlib_ext.models.unet.ResBlock` without time input.

    Args:
      config: the widths (``ae_channels``), image and latent channels.
      rngs: the parameter initialisation keys.
    """

    def __init__(self, config: LDMConfig, *, rngs: nnx.Rngs):
        ch, c_img, c_lat = config.ae_channels, config.image_channels, config.latent_channels
        conv = lambda i, o, s=1: nnx.Conv(i, o, (3, 3), strides=(s, s), padding="SAME",
                                          rngs=rngs)
        self.enc_in = conv(c_img, ch[0])
        self.enc_down = nnx.List([conv(ch[i], ch[i + 1], 2) for i in range(len(ch) - 1)])
        self.enc_blocks = nnx.List([ResBlock(c, c, None, rngs=rngs) for c in ch[1:]])
        self.enc_norm = nnx.GroupNorm(ch[-1], num_groups=_groups(ch[-1]), rngs=rngs)
        self.enc_out = conv(ch[-1], 2 * c_lat)
        self.dec_in = conv(c_lat, ch[-1])
        self.dec_blocks = nnx.List([ResBlock(c, c, None, rngs=rngs) for c in ch[:0:-1]])
        self.dec_up = nnx.List([conv(ch[i + 1], ch[i]) for i in reversed(range(len(ch) - 1))])
        self.dec_norm = nnx.GroupNorm(ch[0], num_groups=_groups(ch[0]), rngs=rngs)
        self.dec_out = conv(ch[0], c_img)

    def encode(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The latent posterior of images.

        Args:
          x: ``[B, S, S, C]`` images.

        Returns:
          ``(mean, logvar)`` of the latent posterior, each ``[B, S/f, S/f, latent]``
          (unscaled; ``logvar`` clipped to ``[-30, 20]``).
        """
        h = self.enc_in(x)
        for down, block in zip(self.enc_down, self.enc_blocks):
            h = block(down(jax.nn.silu(h)), None)
        mean, logvar = jnp.split(self.enc_out(jax.nn.silu(self.enc_norm(h))), 2, axis=-1)
        return mean, jnp.clip(logvar, -30.0, 20.0)

    def decode(self, z: jax.Array) -> jax.Array:
        """Pixels of an unscaled latent.

        Args:
          z: ``[B, S/f, S/f, latent]`` unscaled latents.

        Returns:
          ``[B, S, S, C]`` pixels.
        """
        h = self.dec_in(z)
        for block, up in zip(self.dec_blocks, self.dec_up):
            h = block(h, None)
            h = up(jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2))
        return self.dec_out(jax.nn.silu(self.dec_norm(h)))


def _groups(channels: int) -> int:
    return max(g for g in range(1, 9) if channels % g == 0)


class LatentDiffusion(nnx.Module):
    """The autoencoder, ``latent_scale`` and the latent noise-prediction U-Net of ``config``.

    Use it through the module functions (:func:`encode`, :func:`decode`, :func:`eps_model`,
    :func:`ddim_sample`, ...); ``model.schedule`` is the
    :class:`~jaxlib_ext.models.diffusion.Schedule`.

    Args:
      config: the sizes of the autoencoder, the U-Net and the schedule.
      rngs: the parameter initialisation keys.
    """

    def __init__(self, config: LDMConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.autoencoder = Autoencoder(config, rngs=rngs)
        self.latent_scale = LatentScale(jnp.ones((), jnp.float32))
        c = config.latent_channels
        self.unet = UNet(c, c, base_channels=config.unet_channels,
                         channel_mults=config.unet_mults, num_res_blocks=config.unet_res_blocks,
                         rngs=rngs)

    @property
    def schedule(self) -> Schedule:
        """The :class:`~jaxlib_ext.models.diffusion.Schedule` of ``config.timesteps`` and
        ``config.schedule``."""
        return make_schedule(self.config.timesteps, self.config.schedule)


# --------------------------------------------------------------------------- public functions


def _check_batch(arr, shape, arg: str) -> jax.Array:
    arr = jnp.asarray(arr)
    if arr.ndim != 4 or tuple(arr.shape[1:]) != tuple(shape):
        raise ValueError(f"{arg}: expected [B, {', '.join(map(str, shape))}], "
                         f"got {tuple(arr.shape)}")
    return arr


def encode(model: LatentDiffusion, x: jax.Array) -> jax.Array:
    """Scaled latent ``latent_scale * mean`` of images (deterministic: the posterior mean).

    Args:
      model: the latent diffusion model.
      x: ``[B, *image_shape]`` images in ``[-1, 1]``.

    Returns:
      ``[B, *latent_shape]`` scaled latents.

    Raises:
      ValueError: if ``x`` is not ``[B, *image_shape]``.
    """
    x = _check_batch(x, model.config.image_shape, "x")
    mean, _ = model.autoencoder.encode(x)
    return mean * model.latent_scale[...]


def decode(model: LatentDiffusion, z: jax.Array) -> jax.Array:
    """Images of scaled latents.

    Args:
      model: the latent diffusion model.
      z: ``[B, *latent_shape]`` scaled latents.

    Returns:
      ``[B, *image_shape]`` images, about ``[-1, 1]``, unclipped.

    Raises:
      ValueError: if ``z`` is not ``[B, *latent_shape]``.
    """
    z = _check_batch(z, model.config.latent_shape, "z")
    return model.autoencoder.decode(z / model.latent_scale[...])


def _check_t(t, batch: int, timesteps: int) -> jax.Array:
    t = jnp.asarray(t)
    if not jnp.issubdtype(t.dtype, jnp.integer):
        raise TypeError(f"t: expected integer steps in [0, {timesteps - 1}], got {t.dtype}")
    if t.ndim == 0:
        t = jnp.broadcast_to(t, (batch,))
    if t.shape != (batch,):
        raise ValueError(f"t: expected shape [{batch}] or a scalar, got {tuple(t.shape)}")
    return t


def eps_model(model: LatentDiffusion, z: jax.Array, t: jax.Array) -> jax.Array:
    """The U-Net's prediction of the noise ``eps`` in ``z_t = sqrt(abar_t) z_0 + sqrt(1 -
    abar_t) eps``.

    Args:
      model: the latent diffusion model.
      z: ``[B, *latent_shape]`` noisy scaled latents ``z_t``.
      t: integer steps ``[B]`` (or a scalar) in ``[0, T - 1]``.

    Returns:
      ``[B, *latent_shape]``, the predicted ``eps``.

    Raises:
      TypeError: if ``t`` is not integer.
      ValueError: if ``z`` is not ``[B, *latent_shape]`` or ``t`` neither ``[B]`` nor a scalar.
    """
    z = _check_batch(z, model.config.latent_shape, "z")
    t = _check_t(t, z.shape[0], model.config.timesteps)
    return model.unet(z, t.astype(jnp.float32))


def _abar(schedule: Schedule, t, batch: int) -> jax.Array:
    """alpha-bar at integer steps ``t`` (a scalar or ``[batch]``; ``-1``: the clean latent, 1)
    as ``[batch, 1, 1, 1]``, one per latent."""
    return alpha_bar(schedule, jnp.broadcast_to(t, (batch,))).reshape(-1, 1, 1, 1)


def _check_n(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"n: expected a positive int, got {n!r}")
    return int(n)


def _check_clip(clip_z0) -> float | None:
    if clip_z0 is not None and not float(clip_z0) > 0:
        raise ValueError(f"clip_z0: expected a positive number or None, got {clip_z0!r}")
    return None if clip_z0 is None else float(clip_z0)


def ddim_sample(model: LatentDiffusion, key: jax.Array, n: int, steps: int = 50, *,
                eta: float = 0.0, clip_z0: float | None = 4.0, return_trajectory: bool = False):
    """Latents by DDIM from ``z ~ N(0, I)`` (arXiv 2010.02502).

    Args:
      model: the latent diffusion model.
      key: the PRNG key of the initial latents and the step noise.
      n: the number of samples, a positive int.
      steps: the number of DDIM steps, an int in ``[1, T]``, at the training steps of
        :func:`~jaxlib_ext.models.diffusion.ddim_timesteps` (``T - 1`` first).
      eta: in ``[0, 1]``, 0 deterministic, 1 ancestral-like.
      clip_z0: the bound of :func:`~jaxlib_ext.models.diffusion.clip_eps` on each step's noise
        prediction, positive, or ``None``.
      return_trajectory: whether to return the latents after each step too.

    Returns:
      ``[n, *latent_shape]`` latents; with ``return_trajectory``, ``(z, trajectory)`` with the
      trajectory ``[steps, n, *latent_shape]``.

    Raises:
      ValueError: if ``n``, ``steps``, ``eta`` or ``clip_z0`` is out of range.
    """
    n = _check_n(n)
    if not 0.0 <= float(eta) <= 1.0:
        raise ValueError(f"eta: expected a value in [0, 1], got {eta!r}")
    clip_z0 = _check_clip(clip_z0)
    timesteps = model.config.timesteps
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or not (
            1 <= steps <= timesteps):
        raise ValueError(f"steps: expected an int in [1, {timesteps}], got {steps!r}")
    ts = jnp.asarray(ddim_timesteps(timesteps, steps))
    t_prev = jnp.concatenate([ts[1:], jnp.array([-1], jnp.int32)])
    graphdef, state = nnx.split(model)
    return _ddim_loop(graphdef, state, key, ts, t_prev, n, float(eta), clip_z0,
                      return_trajectory)


@functools.partial(jax.jit, static_argnames=("graphdef", "n", "clip_z0", "return_trajectory"))
def _ddim_loop(graphdef, state, key, ts, t_prev, n, eta, clip_z0, return_trajectory):
    model = nnx.merge(graphdef, state)
    sched = model.schedule
    k0, kloop = jax.random.split(key)
    z = jax.random.normal(k0, (n, *model.config.latent_shape))

    def body(z, inputs):
        t, tp, k = inputs
        a_t, a_p = _abar(sched, t, n), _abar(sched, tp, n)
        eps = clip_eps(z, model.unet(z, jnp.full((n,), t, jnp.float32)), a_t, clip_z0)
        z = ddim_step(predict_z0(z, eps, a_t), eps, a_t, a_p, eta, jax.random.normal(k, z.shape))
        return z, (z if return_trajectory else None)

    keys = jax.random.split(kloop, ts.shape[0])
    z, traj = jax.lax.scan(body, z, (ts, t_prev, keys))
    return (z, traj) if return_trajectory else z


def ancestral_sample(model: LatentDiffusion, key: jax.Array, n: int, *,
                     clip_z0: float | None = 4.0) -> jax.Array:
    """Latents by ancestral sampling over all ``T`` steps (arXiv 2006.11239, Alg. 2).

    Args:
      model: the latent diffusion model.
      key: the PRNG key of the initial latents and the step noise.
      n: the number of samples, a positive int.
      clip_z0: the bound of :func:`~jaxlib_ext.models.diffusion.clip_eps` on each step's noise
        prediction, positive, or ``None``.

    Returns:
      ``[n, *latent_shape]`` latents.

    Raises:
      ValueError: if ``n`` or ``clip_z0`` is out of range.
    """
    n = _check_n(n)
    clip_z0 = _check_clip(clip_z0)
    graphdef, state = nnx.split(model)
    return _ancestral_loop(graphdef, state, key, n, clip_z0)


@functools.partial(jax.jit, static_argnames=("graphdef", "n", "clip_z0"))
def _ancestral_loop(graphdef, state, key, n, clip_z0):
    model = nnx.merge(graphdef, state)
    sched = model.schedule
    k0, kloop = jax.random.split(key)
    z = jax.random.normal(k0, (n, *model.config.latent_shape))
    ts = jnp.arange(model.config.timesteps - 1, -1, -1, dtype=jnp.int32)

    def body(z, inputs):
        t, k = inputs
        eps = clip_eps(z, model.unet(z, jnp.full((n,), t, jnp.float32)), _abar(sched, t, n),
                       clip_z0)
        z, _ = ancestral_step(sched, z, eps, t, jax.random.normal(k, z.shape))
        return z, None

    z, _ = jax.lax.scan(body, z, (ts, jax.random.split(kloop, ts.shape[0])))
    return z


def sample_images(model: LatentDiffusion, key: jax.Array, n: int, steps: int = 50, *,
                  eta: float = 0.0, clip_z0: float | None = 4.0) -> jax.Array:
    """Decoded DDIM samples (:func:`ddim_sample`, then :func:`decode`).

    Args:
      model: the latent diffusion model.
      key: the PRNG key of the sampler.
      n: the number of samples, a positive int.
      steps: the DDIM steps.
      eta: in ``[0, 1]``, 0 deterministic.
      clip_z0: the bound of :func:`~jaxlib_ext.models.diffusion.clip_eps`, or ``None``.

    Returns:
      ``[n, *image_shape]`` images in about ``[-1, 1]``.

    Raises:
      ValueError: as :func:`ddim_sample`.
    """
    return _decode_jit(model, ddim_sample(model, key, n, steps, eta=eta, clip_z0=clip_z0))


@nnx.jit
def _decode_jit(model, z):
    return decode(model, z)


# --------------------------------------------------------------------------- losses


def autoencoder_loss(ae: Autoencoder, key: jax.Array, x: jax.Array,
                     kl_weight: float) -> tuple[jax.Array, dict]:
    """Per-pixel MSE of the reconstruction of a posterior sample plus ``kl_weight`` times the
    per-dimension KL to ``N(0, I)``.

    Args:
      ae: the autoencoder.
      key: the PRNG key of the posterior sample.
      x: ``[B, S, S, C]`` images.
      kl_weight: the weight of the KL term.

    Returns:
      ``(loss, {"mse": mse, "kl": kl})``, scalars.
    """
    mean, logvar = ae.encode(x)
    z = mean + jnp.exp(0.5 * logvar) * jax.random.normal(key, mean.shape)
    mse = jnp.mean((ae.decode(z) - x) ** 2)
    kl = 0.5 * jnp.mean(mean**2 + jnp.exp(logvar) - 1.0 - logvar)
    return mse + kl_weight * kl, {"mse": mse, "kl": kl}


def diffusion_loss(unet: UNet, schedule: Schedule, key: jax.Array,
                   z0: jax.Array) -> tuple[jax.Array, dict]:
    """Ho et al.'s simple loss (arXiv 2006.11239, Eq. 14): ``E ||eps - eps_hat(z_t, t)||^2``
    per dimension, ``t`` uniform on ``[0, T - 1]``.

    Args:
      unet: the noise-prediction U-Net.
      schedule: the :class:`~jaxlib_ext.models.diffusion.Schedule`.
      key: the PRNG key of ``t`` and ``eps``.
      z0: ``[B, H, W, C]`` clean scaled latents.

    Returns:
      ``(loss, {"mse": loss})``, scalars.
    """
    kt, ke = jax.random.split(key)
    t = jax.random.randint(kt, (z0.shape[0],), 0, schedule.betas.shape[0])
    eps = jax.random.normal(ke, z0.shape)
    z_t = q_sample(z0, eps, _abar(schedule, t, z0.shape[0]))
    mse = jnp.mean((unet(z_t, t.astype(jnp.float32)) - eps) ** 2)
    return mse, {"mse": mse}


# --------------------------------------------------------------------------- training


class _FitState(NamedTuple):
    """A stage's training state, as its checkpoints hold it (beside the EMA): the trained
    module's parameters (a pure dict) and the optimizer's state."""

    params: dict
    opt_state: Any


def _stage_schedule(lr: float | WarmupCosine, steps: int) -> WarmupCosine:
    """The learning rate of a stage of ``steps`` steps: linear warm-up from 0 to ``lr`` over
    ``min(100, steps // 10 + 1)`` steps, cosine decay to ``lr / 10`` at ``steps`` (a
    :class:`~jaxlib_ext.core.schedule.WarmupCosine` ``lr`` is taken as is)."""
    if isinstance(lr, WarmupCosine):
        return lr
    warmup = min(100, steps // 10 + 1)
    # a one-step stage has warmup == steps: its single step gets lr(0) = 0 on either curve
    return WarmupCosine(float(lr), warmup, max(steps, warmup + 1), 0.1 * float(lr))


def _check_stage(directory: pathlib.Path, run: dict, resume: bool) -> None:
    """A stage folder that holds checkpoints is resumed only by the run that wrote them (the
    engine checks the schedule; this checks the configuration, seed and batch size)."""
    if not directory.is_dir():
        return
    from jaxlib_ext.core.checkpoint import Checkpointer

    with Checkpointer(directory, read_only=True) as ckpt:
        step = ckpt.latest_step()
        if step is None:
            return
        if not resume:
            raise ValueError(f"out: {directory} already holds checkpoints; pass resume=True to "
                             "continue that run, or another out for a new one")
        recorded = ckpt.restore_meta(step).get("run")
    if recorded != json.loads(json.dumps(run)):
        raise ValueError(f"out: {directory} holds another run ({recorded}), not {run}")


def _fit(module: nnx.Module, loss_fn: Callable, data: jax.Array, *, steps: int, batch_size: int,
         lr: float | WarmupCosine, key: jax.Array, desc: str, ema_decay: float | None = None,
         progress: bool = True, log_every: int = 50,
         checkpoint_dir: pathlib.Path | None = None, checkpoint_every: int = 0,
         resume: bool = True, run: dict | None = None) -> tuple[nnx.State, list[dict]]:
    """One training stage on the engine (:func:`jaxlib_ext.core.loop.run_loop`).

    Adam (Kingma & Ba, arXiv 1412.6980) on gradients clipped to global norm 1, the learning
    rate of :func:`_stage_schedule`. Step ``i`` draws ``batch_size`` rows of ``data`` uniformly
    with replacement and the key of ``loss_fn(module, key, batch) -> (loss, aux)`` from
    ``fold_in(key, i)``: a stage resumed from its newest checkpoint in ``checkpoint_dir`` ends
    equal to an uninterrupted one. With ``ema_decay = d`` the engine keeps
    ``ema <- d * ema + (1 - d) * params`` after every step (``d`` fixed, no warm-up).

    Args:
      checkpoint_dir: the stage's folder (checkpoints every ``checkpoint_every`` steps and at
        the last, ``metrics.jsonl``), or ``None`` for none.
      resume: continue from the newest checkpoint of ``checkpoint_dir``.
      run: the record of the run (checked by :func:`_check_stage` before a resume).

    Returns:
      The trained parameters (their EMA with ``ema_decay``) and the stage's metrics rows
      ``{"step", "loss", <aux>, "images_per_s"}``: every row of ``metrics.jsonl`` (all the runs
      of the stage) with ``checkpoint_dir``, this call's otherwise.
    """
    from jaxlib_ext.core import loop

    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    schedule = _stage_schedule(lr, steps)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule.to_optax()))
    pure = nnx.to_pure_dict(params)
    state = _FitState(pure, opt.init(pure))

    @jax.jit
    def draw(data, k):
        kb, kl = jax.random.split(k)
        return data[jax.random.randint(kb, (batch_size,), 0, data.shape[0])], kl

    @jax.jit
    def step(state, batch):
        x, k = batch

        def f(p):
            return loss_fn(nnx.merge(graphdef, p, rest), k, x)

        (loss, aux), grads = jax.value_and_grad(f, has_aux=True)(state.params)
        updates, opt_state = opt.update(grads, state.opt_state, state.params)
        return (_FitState(optax.apply_updates(state.params, updates), opt_state),
                {"loss": loss, **aux})

    metrics_path = None
    if checkpoint_dir is not None:
        checkpoint_dir = pathlib.Path(checkpoint_dir)
        _check_stage(checkpoint_dir, run or {}, resume)
        metrics_path = checkpoint_dir / "metrics.jsonl"
    config = loop.LoopConfig(
        steps=steps, log_every=log_every,
        checkpoint_every=checkpoint_every if checkpoint_dir is not None else 0,
        checkpoint_dir=checkpoint_dir, max_to_keep=2, resume=resume, metrics_path=metrics_path,
        progress=progress, desc=desc, items_per_step=batch_size, items_name="images",
        ema=loop.EMA(ema_decay, select=lambda s: s.params) if ema_decay else None,
        schedule=schedule, meta={"run": run or {}})
    result = loop.run_loop(step, state, lambda i: draw(data, jax.random.fold_in(key, i)), config)
    log = result.history
    if metrics_path is not None and metrics_path.exists():
        log = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    nnx.replace_by_pure_dict(params, result.ema if ema_decay else result.state.params)
    return params, log


def _encode_all(model: LatentDiffusion, x: np.ndarray, batch: int = 500) -> jax.Array:
    enc = nnx.jit(lambda m, v: m.autoencoder.encode(v)[0])
    return jnp.concatenate([enc(model, jnp.asarray(x[i : i + batch]))
                            for i in range(0, len(x), batch)])


def train(config: LDMConfig = LDMConfig(), *, images: np.ndarray | None = None,
          ae_steps: int = 2000, diffusion_steps: int = 4000, batch_size: int = 64,
          ae_lr: float | WarmupCosine = 1e-3, diffusion_lr: float | WarmupCosine = 5e-4,
          ema_decay: float = 0.999, seed: int = 0, out: str | pathlib.Path | None = None,
          progress: bool = True, checkpoint_every: int = 500, resume: bool = True,
          autoencoder_from: LatentDiffusion | None = None,
          autoencoder_info: dict | None = None) -> tuple[LatentDiffusion, dict]:
    """Train the autoencoder, fix ``latent_scale``, then train the latent noise model.

    Each stage is one run of the training-loop engine (:func:`_fit`): a progress bar, metrics
    rows, Orbax checkpoints from which a stage killed mid-way resumes, and
    :class:`~jaxlib_ext.core.loop.NonFiniteLossError` on a NaN or Inf loss.

    Args:
      config: model sizes.
      images: training images ``[N, *config.image_shape]`` in ``[-1, 1]``; default the MNIST
        train split (``jaxlib_ext.core.images.load_mnist("train", value_range=(-1, 1))``).
      ae_steps: optimizer steps of the autoencoder stage, an int ``>= 0``.
      diffusion_steps: optimizer steps of the diffusion stage, an int ``>= 0``
        (``diffusion_steps = 0`` leaves the noise model untrained).
      batch_size: images (or latents) per step of either stage.
      ae_lr: the autoencoder stage's peak learning rate (the curve of
        :func:`_stage_schedule`), or its whole schedule as a
        :class:`~jaxlib_ext.core.schedule.WarmupCosine`.
      diffusion_lr: the diffusion stage's peak learning rate or schedule, as ``ae_lr``.
      ema_decay: the decay of the noise model's parameter average, which is what is kept.
      seed: the seed of the initialisation and of both stages' keys.
      out: the run's folder, or ``None`` to keep nothing on disk. Each stage writes its
        checkpoints (every ``checkpoint_every`` steps and at its last) and ``metrics.jsonl``
        into ``out/autoencoder`` and ``out/diffusion``; the model after each stage is
        checkpoint 1 (autoencoder) and 2 (both) of ``out`` itself, with ``info`` as its JSON
        record (the last records ``"complete": True``): what :func:`load` reads.
      progress: whether to show a progress bar.
      checkpoint_every: steps between a stage's checkpoints, an int ``>= 0``.
      resume: continue each stage from the newest checkpoint of its folder (one written by
        another configuration, seed or batch size raises ``ValueError``); ``False``: a stage
        folder holding checkpoints raises ``ValueError``.
      autoencoder_from: a model whose trained autoencoder and ``latent_scale`` are kept
        (the autoencoder stage is skipped; ``ae_steps`` is only recorded).
      autoencoder_info: the ``info`` of ``autoencoder_from``'s run, whose ``ae_log`` and
        ``ae_seconds`` are copied into ``info``.

    Returns:
      ``(model, info)``: ``info`` (also the checkpoint's JSON record) has the configuration,
      step counts, ``latent_scale``, seconds per stage, the logged metrics (``ae_log``,
      ``diffusion_log``: rows of every 50th step and the last), the last ``stage`` trained and
      whether the run is ``complete``.

    Raises:
      ValueError: if a step count or ``checkpoint_every`` is not an int ``>= 0``, ``images``
        is not ``[N, *config.image_shape]``, or a stage folder holds another run (or any
        checkpoints with ``resume=False``).
      NonFiniteLossError: on a NaN or Inf loss.

    References:
      Rombach et al., High-Resolution Image Synthesis with Latent Diffusion Models,
      arXiv 2112.10752.

      Ho et al., Denoising Diffusion Probabilistic Models, arXiv 2006.11239.
    """
    for name, v in (("ae_steps", ae_steps), ("diffusion_steps", diffusion_steps),
                    ("checkpoint_every", checkpoint_every)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
    if images is None:
        from jaxlib_ext.core.images import load_mnist

        images = load_mnist("train", value_range=(-1.0, 1.0)).images
    images = np.asarray(_check_batch(images, config.image_shape, "images"))
    key = jax.random.key(seed)
    k_init, k_ae, k_diff = jax.random.split(key, 3)
    model = LatentDiffusion(config, rngs=nnx.Rngs(int(jax.random.randint(k_init, (), 0, 2**30))))
    info: dict = {"config": config.to_dict(), "seed": seed, "batch_size": batch_size,
                  "ae_steps": ae_steps, "diffusion_steps": diffusion_steps}
    out = None if out is None else pathlib.Path(out)
    # what a stage folder records and a resume must match (its length is the schedule's)
    run = {"config": info["config"], "seed": seed, "batch_size": batch_size}
    common = dict(progress=progress, checkpoint_every=checkpoint_every, resume=resume,
                  batch_size=batch_size)

    t0 = time.perf_counter()
    if autoencoder_from is not None:
        nnx.update(model.autoencoder, nnx.state(autoencoder_from.autoencoder))
    elif ae_steps:
        kl_weight = config.kl_weight
        params, info["ae_log"] = _fit(
            model.autoencoder, lambda ae, k, x: autoencoder_loss(ae, k, x, kl_weight),
            jnp.asarray(images), steps=ae_steps, lr=ae_lr, key=k_ae, desc="autoencoder",
            checkpoint_dir=None if out is None else out / "autoencoder",
            run={**run, "stage": "autoencoder"}, **common)
        nnx.update(model.autoencoder, params)
    latents = _encode_all(model, images)
    if autoencoder_from is not None:
        scale = float(autoencoder_from.latent_scale[...])
    else:
        scale = 1.0 / float(jnp.std(latents))
    model.latent_scale.set_value(jnp.asarray(scale, jnp.float32))
    info["latent_scale"] = scale
    info["ae_seconds"] = time.perf_counter() - t0
    if autoencoder_from is not None and autoencoder_info:
        info.update({k: autoencoder_info[k] for k in ("ae_log", "ae_seconds")
                     if k in autoencoder_info})
    info.update(stage="autoencoder", complete=diffusion_steps == 0)
    if out is not None and autoencoder_from is None:
        _save_model(out, 1, model, info)

    t0 = time.perf_counter()
    if diffusion_steps:
        schedule = model.schedule
        params, info["diffusion_log"] = _fit(
            model.unet, lambda u, k, z: diffusion_loss(u, schedule, k, z),
            latents * scale, steps=diffusion_steps, lr=diffusion_lr, key=k_diff,
            desc="diffusion", ema_decay=ema_decay,
            checkpoint_dir=None if out is None else out / "diffusion",
            run={**run, "stage": "diffusion", "ae_steps": ae_steps, "ema_decay": ema_decay},
            **common)
        nnx.update(model.unet, params)
        info.update(stage="diffusion", complete=True)
    info["diffusion_seconds"] = time.perf_counter() - t0
    if out is not None and diffusion_steps:
        _save_model(out, 2, model, info)
    return model, info


def _pure_state(model: LatentDiffusion) -> dict:
    return nnx.to_pure_dict(nnx.state(model))


def _model_step(path: pathlib.Path) -> int | None:
    """The newest model checkpoint of ``path`` (1: autoencoder, 2: both stages), or ``None``."""
    if not path.is_dir():
        return None
    from jaxlib_ext.core.checkpoint import Checkpointer

    with Checkpointer(path, read_only=True) as ckpt:
        return ckpt.latest_step()


def _save_model(out: pathlib.Path, step: int, model: LatentDiffusion, info: dict) -> None:
    """Writes the model as checkpoint ``step`` of ``out``; the model checkpoints of that step
    and later ones, written by an earlier run into the same folder, are replaced."""
    from jaxlib_ext.core.checkpoint import Checkpointer

    if out.is_dir():
        for stale in out.iterdir():
            if stale.is_dir() and stale.name.isdigit() and int(stale.name) >= step:
                shutil.rmtree(stale)
    with Checkpointer(out, max_to_keep=2, async_save=False) as ckpt:
        ckpt.save(step, _pure_state(model), info)


def load(path: str | pathlib.Path) -> tuple[LatentDiffusion, dict]:
    """The model and ``info`` of the newest model checkpoint in ``path`` (see :func:`train`).

    Args:
      path: the run's folder (``out`` of :func:`train`).

    Returns:
      ``(model, info)``.

    Raises:
      FileNotFoundError: if ``path`` is not a folder or holds no model checkpoint.
    """
    from jaxlib_ext.core.checkpoint import Checkpointer

    path = pathlib.Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"path: no checkpoint folder at {path}")
    if _model_step(path) is None:
        raise FileNotFoundError(f"path: no model checkpoint in {path} (a run stopped during its "
                                "autoencoder stage: resume it with load_or_train or train)")
    with Checkpointer(path, read_only=True) as ckpt:
        meta = ckpt.restore_meta()
        config = LDMConfig.from_dict(meta["config"])
        abstract = nnx.eval_shape(lambda: LatentDiffusion(config, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract)
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                              nnx.to_pure_dict(state))
        restored, meta = ckpt.restore(None, target)
    nnx.replace_by_pure_dict(state, restored)
    return nnx.merge(graphdef, state), meta


def load_or_train(path: str | pathlib.Path, config: LDMConfig = LDMConfig(), *,
                  ae_steps: int = 2000, diffusion_steps: int = 4000, **train_kwargs
                  ) -> tuple[LatentDiffusion, dict]:
    """The model in ``path``, training it first when needed.

    A finished checkpoint of the same ``config``, ``ae_steps`` and ``diffusion_steps`` is
    loaded as is; a checkpoint of the autoencoder stage alone (a run stopped during the
    diffusion stage) is resumed from there, the diffusion stage from its newest checkpoint; a
    run stopped during its autoencoder stage resumes that stage; an empty or missing ``path``
    is trained into.

    Args:
      path: the run's folder.
      config: the model sizes.
      ae_steps: optimizer steps of the autoencoder stage.
      diffusion_steps: optimizer steps of the diffusion stage.
      **train_kwargs: the other keyword arguments of :func:`train`.

    Returns:
      ``(model, info)`` as :func:`train`.

    Raises:
      ValueError: if ``path`` holds another run, or as :func:`train`.
    """
    path = pathlib.Path(path)
    if _model_step(path) is not None:
        model, meta = load(path)
        same = meta.get("config") == config.to_dict() and meta.get("ae_steps") == ae_steps
        if same and meta.get("diffusion_steps") == diffusion_steps and meta.get("complete"):
            return model, meta
        if same and meta.get("stage") == "autoencoder":
            return train(config, ae_steps=ae_steps, diffusion_steps=diffusion_steps, out=path,
                         autoencoder_from=model, autoencoder_info=meta, **train_kwargs)
        raise ValueError(f"path: {path} holds another run ({meta.get('config')}, ae_steps "
                         f"{meta.get('ae_steps')}, diffusion_steps {meta.get('diffusion_steps')})")
    return train(config, ae_steps=ae_steps, diffusion_steps=diffusion_steps, out=path,
                 **train_kwargs)
