"""A small U-Net in Flax NNX for images and image-shaped latents, sized for CPU.

The DDPM U-Net (Ho et al., arXiv 2006.11239, App. B) without attention: residual blocks of
``GroupNorm -> SiLU -> 3x3 conv`` with the embedded time added between the two convolutions,
a stride-2 convolution between resolution levels and nearest-neighbour upsampling plus a 3x3
convolution on the way back, skip connections concatenated at each level.

Inputs are channels-last (NHWC). Two kinds of conditioning:

* a scalar per image ``t [B]`` (a diffusion step or a noise level), embedded with the
  sinusoidal features of Vaswani et al. (arXiv 1706.03762, Sec. 3.5),
  ``[sin(s t f_k), cos(s t f_k)]``, ``f_k = 10000^{-k / (d/2 - 1)}``, ``s = time_scale``, then an
  MLP; the frequencies suit ``t`` in the hundreds (integer steps of a 1000-step schedule); scale a
  noise level in [0, 1] with ``time_scale=1000``;
* an image ``cond [B, H, W, Cc]`` concatenated to ``x`` at the input (e.g. the log of a
  pixel-diagonal covariance, or a Fourier-diagonal one mapped back to an image).

Any spatial size works: a level whose side is odd is downsampled with ``SAME`` padding (7 -> 4)
and the upsampled map is cropped back to the skip connection's size (8 -> 7).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["UNet", "sinusoidal_embedding"]


def sinusoidal_embedding(t: jax.Array, dim: int, *, max_period: float = 10000.0) -> jax.Array:
    """``[sin(t f_k), cos(t f_k)]_{k < dim/2}`` with ``f_k = max_period^{-k/(dim/2 - 1)}``.

    Args:
      t: ``[B]`` any real values.
      dim: the embedding width, an even int ``>= 4``.
      max_period: the base of the frequencies.

    Returns:
      ``float32[B, dim]``, the sines first.

    Raises:
      ValueError: if ``dim`` is odd or below 4.

    References:
      Vaswani et al., Attention Is All You Need, arXiv 1706.03762 (Sec. 3.5).
    """
    if dim < 4 or dim % 2:
        raise ValueError(f"dim: expected an even int >= 4, got {dim}")
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / (half - 1))
    args = jnp.asarray(t, jnp.float32)[:, None] * freqs[None, :]
    return jnp.concatenate([jnp.sin(args), jnp.cos(args)], axis=-1)


def _groups(channels: int, max_groups: int = 8) -> int:
    """The largest divisor of ``channels`` not above ``max_groups``."""
    return max(g for g in range(1, max_groups + 1) if channels % g == 0)


def _conv(cin: int, cout: int, rngs: nnx.Rngs, *, kernel: int = 3, stride: int = 1) -> nnx.Conv:
    return nnx.Conv(cin, cout, (kernel, kernel), strides=(stride, stride), padding="SAME",
                    rngs=rngs)


class ResBlock(nnx.Module):
    """``x + conv(silu(gn(conv(silu(gn(x))) + W temb))))``, a 1x1 conv on the skip when the
    width changes."""

    def __init__(self, cin: int, cout: int, temb_dim: int | None, *, rngs: nnx.Rngs):
        self.norm1 = nnx.GroupNorm(cin, num_groups=_groups(cin), rngs=rngs)
        self.conv1 = _conv(cin, cout, rngs)
        self.time = nnx.Linear(temb_dim, cout, rngs=rngs) if temb_dim else None
        self.norm2 = nnx.GroupNorm(cout, num_groups=_groups(cout), rngs=rngs)
        self.conv2 = _conv(cout, cout, rngs)
        self.skip = _conv(cin, cout, rngs, kernel=1) if cin != cout else None

    def __call__(self, x: jax.Array, temb: jax.Array | None) -> jax.Array:
        h = self.conv1(jax.nn.silu(self.norm1(x)))
        if self.time is not None:
            h = h + self.time(jax.nn.silu(temb))[:, None, None, :]
        h = self.conv2(jax.nn.silu(self.norm2(h)))
        return h + (x if self.skip is None else self.skip(x))


class UNet(nnx.Module):
    """U-Net ``(x [B, H, W, in_channels], t [B], cond [B, H, W, cond_channels]) ->
    [B, H, W, out_channels]``.

    Args:
      in_channels: channels of the input image.
      out_channels: channels of the output.
      base_channels: width of the first level; level ``i`` has ``base_channels *
        channel_mults[i]`` channels, and ``len(channel_mults)`` levels (``len - 1``
        downsamplings).
      channel_mults: width multiplier per level.
      num_res_blocks: residual blocks per level on the way down (one more on the way up).
      cond_channels: channels of the conditioning image (0: no ``cond`` argument).
      time_embedding: whether the network takes ``t`` (required then, forbidden otherwise).
      time_scale: ``t`` is multiplied by it before the sinusoidal embedding.
      rngs: parameter initialisation.

    Raises:
      ValueError: if a channel count or ``num_res_blocks`` is not an int in range, or
        ``channel_mults`` is empty or not positive ints.

    References:
      Ho et al., Denoising Diffusion Probabilistic Models, arXiv 2006.11239 (App. B).
    """

    def __init__(self, in_channels: int, out_channels: int, *, base_channels: int = 32,
                 channel_mults: tuple[int, ...] = (1, 2), num_res_blocks: int = 1,
                 cond_channels: int = 0, time_embedding: bool = True, time_scale: float = 1.0,
                 rngs: nnx.Rngs):
        for name, v, low in (("in_channels", in_channels, 1), ("out_channels", out_channels, 1),
                             ("base_channels", base_channels, 1),
                             ("num_res_blocks", num_res_blocks, 1),
                             ("cond_channels", cond_channels, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {v!r}")
        mults = tuple(channel_mults)
        if not mults or any(not isinstance(m, int) or m < 1 for m in mults):
            raise ValueError(f"channel_mults: expected positive ints, got {channel_mults!r}")
        self.in_channels, self.out_channels, self.cond_channels = (in_channels, out_channels,
                                                                   cond_channels)
        self.time_embedding, self.time_scale = bool(time_embedding), float(time_scale)
        self.embed_dim = max(4, base_channels + base_channels % 2)
        temb_dim = 4 * base_channels if time_embedding else None
        if time_embedding:
            self.time_mlp1 = nnx.Linear(self.embed_dim, temb_dim, rngs=rngs)
            self.time_mlp2 = nnx.Linear(temb_dim, temb_dim, rngs=rngs)

        widths = [base_channels * m for m in mults]
        self.stem = _conv(in_channels + cond_channels, widths[0], rngs)
        down, downsample, skip_widths, ch = [], [], [widths[0]], widths[0]
        for level, width in enumerate(widths):
            blocks = []
            for _ in range(num_res_blocks):
                blocks.append(ResBlock(ch, width, temb_dim, rngs=rngs))
                ch = width
                skip_widths.append(ch)
            down.append(nnx.List(blocks))
            if level < len(widths) - 1:
                downsample.append(_conv(ch, ch, rngs, stride=2))
                skip_widths.append(ch)
        self.down, self.downsample = nnx.List(down), nnx.List(downsample)
        self.mid1 = ResBlock(ch, ch, temb_dim, rngs=rngs)
        self.mid2 = ResBlock(ch, ch, temb_dim, rngs=rngs)
        up, upsample = [], []
        for level in reversed(range(len(widths))):
            blocks = []
            for _ in range(num_res_blocks + 1):
                blocks.append(ResBlock(ch + skip_widths.pop(), widths[level], temb_dim,
                                       rngs=rngs))
                ch = widths[level]
            up.append(nnx.List(blocks))
            if level > 0:
                upsample.append(_conv(ch, ch, rngs))
        self.up, self.upsample = nnx.List(up), nnx.List(upsample)
        self.out_norm = nnx.GroupNorm(ch, num_groups=_groups(ch), rngs=rngs)
        self.out_conv = _conv(ch, out_channels, rngs)

    def _check(self, x, t, cond):
        if x.ndim != 4 or x.shape[-1] != self.in_channels:
            raise ValueError(f"x: expected [B, H, W, {self.in_channels}], got {tuple(x.shape)}")
        b, h, w, _ = x.shape
        if self.time_embedding:
            if t is None:
                raise ValueError("t: this UNet has a time embedding; pass t [B]")
            t = jnp.asarray(t)
            if t.ndim == 0:
                t = jnp.broadcast_to(t, (b,))
            if t.shape != (b,):
                raise ValueError(f"t: expected shape [{b}] or a scalar, got {tuple(t.shape)}")
        elif t is not None:
            raise ValueError("t: this UNet has no time embedding (time_embedding=False)")
        if self.cond_channels:
            if cond is None:
                raise ValueError(f"cond: expected [B, H, W, {self.cond_channels}], got None")
            if tuple(cond.shape) != (b, h, w, self.cond_channels):
                raise ValueError(f"cond: expected {(b, h, w, self.cond_channels)}, "
                                 f"got {tuple(cond.shape)}")
        elif cond is not None:
            raise ValueError("cond: this UNet takes no conditioning image (cond_channels=0)")
        return t

    def __call__(self, x: jax.Array, t: jax.Array | None = None,
                 cond: jax.Array | None = None) -> jax.Array:
        """Applies the network.

        Args:
          x: ``[B, H, W, in_channels]`` images, any ``H`` and ``W``.
          t: ``[B]`` or a scalar, the per-image step or noise level; required with a time
            embedding, ``None`` without.
          cond: ``[B, H, W, cond_channels]`` the conditioning image; required when
            ``cond_channels > 0``, ``None`` otherwise.

        Returns:
          ``[B, H, W, out_channels]``.

        Raises:
          ValueError: if a shape is wrong, or ``t`` or ``cond`` is missing or given where the
            network takes none.
        """
        x = jnp.asarray(x)
        t = self._check(x, t, cond)
        temb = None
        if self.time_embedding:
            temb = sinusoidal_embedding(t * self.time_scale, self.embed_dim)
            temb = self.time_mlp2(jax.nn.silu(self.time_mlp1(temb)))
        h = self.stem(x if cond is None else jnp.concatenate([x, cond.astype(x.dtype)], -1))
        skips = [h]
        for level, blocks in enumerate(self.down):
            for block in blocks:
                h = block(h, temb)
                skips.append(h)
            if level < len(self.downsample):
                h = self.downsample[level](h)
                skips.append(h)
        h = self.mid2(self.mid1(h, temb), temb)
        for level, blocks in enumerate(self.up):
            for block in blocks:
                h = block(jnp.concatenate([h, skips.pop()], -1), temb)
            if level < len(self.upsample):
                hs, ws = skips[-1].shape[1:3]  # crop the doubled map to the skip's size
                h = jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2)[:, :hs, :ws]
                h = self.upsample[level](h)
        return self.out_conv(jax.nn.silu(self.out_norm(h)))
