"""Covariance-conditioned energy networks ``f(y, Sigma)`` in Flax NNX: an MLP and a U-Net.

Both return ``f`` of ``y``'s shape for (E.1) of :mod:`~jaxlib_ext.samplers.energy.energy`,
preconditioned so the trainable part is of order one at every noise level (the data-variance
scaling of Karras et al., arXiv 2206.00364, applied per coefficient of the covariance's basis)::

    f(y, Sigma) = (v I + Sigma)^{-1} (y - m)
                  + Sigma^{-1/2} g((v I + Sigma)^{-1/2} (y - m), log s)                      (N.1)

With ``g = 0`` (and ``b = 0``), ``U`` is exactly ``-log N(y; m, (v I + Sigma))``; ``g`` adds the
non-Gaussian part. Both networks also return the learned log-normaliser ``b(Sigma)``
(:class:`LogNormalizer`) of (E.1). ``Sigma^{-1/2} g`` has the scale of the true correction
``((C + Sigma)^{-1} - (v I + Sigma)^{-1}) (y - m)`` in directions of low data variance (where it
is largest). The
conditioning is ``log s`` (the covariance's variances in their basis) and, for the U-Net, a
basis indicator channel and the scalar ``1/2 mean log s`` (a log noise level) as its time input
(arXiv 2605.15487 conditions the network on the covariance and its type).

:func:`energy_fn_of` gives the pure ``energy_fn(y, cov)`` of a module (for jit/grad/vmap,
through ``nnx.split``/``nnx.merge``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.samplers.energy.covariance import Covariance
from jaxlib_ext.samplers.energy.energy import EnergyFn, inner_product_energy

__all__ = ["EnergyMLP", "EnergyUNet", "LogNormalizer", "energy_fn_of", "functional_energy"]


def _precondition(y, cov: Covariance, m, v, g):
    """(N.1) given ``g`` (the network's output, shape of ``y``)."""
    r = y - m
    gaussian = cov.apply_diag(r, 1.0 / (v + cov.diag))
    return gaussian + cov.apply(g, -0.5)


def _whiten(y, cov, m, v):
    return cov.apply_diag(y - m, 1.0 / jnp.sqrt(v + cov.diag))


class LogNormalizer(nnx.Module):
    """``b(Sigma) = h(phi(Sigma)) - h(phi(s_inf I))``: a small MLP ``h`` on features ``phi`` of
    ``log s``, zero at the anchor ``Sigma = s_inf I`` (``anchor_variance``, a variance large
    against the data's, where ``p_Sigma`` is Gaussian and (E.1) is exact with ``b = 0``). The
    loss sees only derivatives of ``U``, so this anchor is what fixes ``b``'s constant.

    ``features="values"``: ``phi = log s`` itself (vectors); ``"histogram"``: the fraction of
    variances above each of ``bins`` thresholds spread over ``log_range`` (smoothly) and the
    basis indicator (images). Zero at initialisation."""

    def __init__(self, in_features: int, *, features: str, anchor_variance: float = 400.0,
                 bins: int = 12, log_range=(-10.0, 6.0), hidden: int = 32, rngs: nnx.Rngs):
        if features not in ("values", "histogram"):
            raise ValueError(f"features: expected 'values' or 'histogram', got {features!r}")
        self.features = features
        self.in_features = in_features
        self.log_anchor = float(jnp.log(anchor_variance))
        self.centers = nnx.Variable(jnp.linspace(*log_range, bins))
        self.width = (log_range[1] - log_range[0]) / bins
        n_in = in_features if features == "values" else bins + 1
        self.l1 = nnx.Linear(n_in, hidden, rngs=rngs)
        self.l2 = nnx.Linear(hidden, 1, kernel_init=nnx.initializers.zeros, rngs=rngs)

    def _phi(self, log_s, basis):
        b = log_s.shape[0]
        if self.features == "values":
            return log_s.reshape(b, -1) / 4.0
        flat = log_s.reshape(b, -1, 1)
        frac = jnp.mean(jax.nn.sigmoid((flat - self.centers[...]) / self.width), axis=1)
        flag = jnp.full((b, 1), 1.0 if basis == "fourier" else 0.0)
        return jnp.concatenate([frac, flag], -1)

    def __call__(self, cov: Covariance):
        log_s = jnp.log(cov.diag)
        anchor = jnp.full_like(log_s[:1], self.log_anchor)
        h = jnp.concatenate([self._phi(log_s, cov.basis), self._phi(anchor, cov.basis)])
        out = self.l2(jax.nn.silu(self.l1(h)))[:, 0]
        n = log_s[0].size
        return n * (out[:-1] - out[-1]) / 16.0


class EnergyMLP(nnx.Module):
    """(N.1) with an MLP ``g`` for vectors ``y [B, dim]`` (pixel-basis covariances)."""

    def __init__(self, dim: int, *, hidden: int = 128, depth: int = 3, data_mean=0.0,
                 data_var=1.0, anchor_variance: float = 400.0, rngs: nnx.Rngs):
        if dim < 1 or hidden < 1 or depth < 1:
            raise ValueError(f"dim, hidden, depth: expected >= 1, got {dim}, {hidden}, {depth}")
        self.dim = dim
        self.data_mean = nnx.Variable(jnp.asarray(data_mean, jnp.float32))
        self.data_var = nnx.Variable(jnp.asarray(data_var, jnp.float32))
        sizes = [2 * dim] + [hidden] * depth
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1],
                                                                              sizes[1:])])
        self.out = nnx.Linear(hidden, dim, kernel_init=nnx.initializers.zeros, rngs=rngs)
        self.log_normalizer = LogNormalizer(dim, features="values",
                                            anchor_variance=anchor_variance, rngs=rngs)

    def __call__(self, y, cov: Covariance):
        if y.ndim != 2 or y.shape[-1] != self.dim:
            raise ValueError(f"y: expected [B, {self.dim}], got {tuple(y.shape)}")
        m, v = self.data_mean[...], self.data_var[...]
        h = jnp.concatenate([_whiten(y, cov, m, v), 0.25 * jnp.log(cov.diag)], -1)
        for layer in self.layers:
            h = jax.nn.silu(layer(h))
        return _precondition(y, cov, m, v, self.out(h)), self.log_normalizer(cov)


class EnergyUNet(nnx.Module):
    """(N.1) with a :class:`~jaxlib_ext.models.unet.UNet` ``g`` for images ``[B, H, W, C]``.

    ``cond`` = ``[log s / 4, basis indicator]`` (``C + 1`` channels), ``t = 1/2 mean log s``
    (embedded with ``time_scale=10``)."""

    def __init__(self, channels: int = 1, *, base_channels: int = 32,
                 channel_mults: tuple[int, ...] = (1, 2), num_res_blocks: int = 1,
                 data_mean=0.0, data_var=1.0, anchor_variance: float = 400.0,
                 rngs: nnx.Rngs):
        from jaxlib_ext.models.unet import UNet

        self.channels = channels
        self.data_mean = nnx.Variable(jnp.asarray(data_mean, jnp.float32))
        self.data_var = nnx.Variable(jnp.asarray(data_var, jnp.float32))
        self.unet = UNet(channels, channels, base_channels=base_channels,
                         channel_mults=channel_mults, num_res_blocks=num_res_blocks,
                         cond_channels=channels + 1, time_embedding=True, time_scale=10.0,
                         rngs=rngs)
        # start at the Gaussian reference (g = 0, b = 0)
        self.unet.out_conv.kernel[...] = jnp.zeros_like(self.unet.out_conv.kernel[...])
        self.log_normalizer = LogNormalizer(channels, features="histogram",
                                            anchor_variance=anchor_variance, rngs=rngs)

    def __call__(self, y, cov: Covariance):
        if y.ndim != 4 or y.shape[-1] != self.channels:
            raise ValueError(f"y: expected [B, H, W, {self.channels}], got {tuple(y.shape)}")
        m, v = self.data_mean[...], self.data_var[...]
        log_s = jnp.log(cov.diag)
        flag = jnp.full(y.shape[:-1] + (1,), 1.0 if cov.basis == "fourier" else 0.0, y.dtype)
        t = 0.5 * jnp.mean(log_s, axis=(1, 2, 3))
        g = self.unet(_whiten(y, cov, m, v), t, jnp.concatenate([0.25 * log_s, flag], -1))
        return _precondition(y, cov, m, v, g), self.log_normalizer(cov)


def functional_energy(graphdef, *states) -> EnergyFn:
    """The pure energy function of a split module.

    Args:
      graphdef: the module's graph definition (``nnx.split``).
      *states: its states.

    Returns:
      ``energy_fn(y, cov) -> U`` ``[B]`` of ``nnx.merge(graphdef, *states)``.
    """

    def energy_fn(y, cov):
        model = nnx.merge(graphdef, *states)
        return inner_product_energy(model, data_mean=model.data_mean[...],
                                    data_var=model.data_var[...])(y, cov)

    return energy_fn


def energy_fn_of(model: nnx.Module) -> EnergyFn:
    """The pure energy function of a module, ``functional_energy(*nnx.split(model))``.

    Args:
      model: an :class:`EnergyMLP` or :class:`EnergyUNet`.

    Returns:
      ``energy_fn(y, cov) -> U`` ``[B]``.
    """
    return functional_energy(*nnx.split(model))
