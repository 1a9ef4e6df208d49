"""Gated DeltaNet (GDN): the token mixer in Flax NNX.

Yang, Kautz & Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule",
arXiv 2412.06464 (ICLR 2025), Section 3. The layer is a
:class:`~jaxlib_ext.models._delta_mixer.DeltaMixer` over the pure op
:func:`jaxlib_ext.pallas_kernels.gated_delta.gated_delta_rule`, with the skeleton of
:class:`~jaxlib_ext.models.MomentumDeltaNet` (the baseline of arXiv 2605.05838). Per token ``x``,
after the shared q/k/v short convolutions (equation numbers are this module's)::

    g      = -exp(A_log) * softplus(a + dt_bias)                         (1) Mamba2-style decay
    beta   = sigmoid(b)                                                  (2)
    S_t    = alpha_t S_{t-1} + beta_t k_t (v_t - alpha_t S_{t-1}^T k_t)^T,   alpha = exp(g)   (3)
    o_t    = S_t^T (q_t / sqrt(K))                                       (4)
    y      = W_o( RMSNorm_head(o) * SiLU(W_g x) )                        (5)

with L2-normalised ``q, k`` and ``a, b`` per-head scalars ``W_{a,b} x``; (3) is the gated delta
rule of arXiv 2412.06464, Section 3.1; (5) is fla's ``FusedRMSNormGated`` default. Inits:
``A_log ~ log U(0, 16]``, ``dt_bias`` Mamba2's inverse-softplus init.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.models._delta_mixer import (
    DeltaMixer,
    DeltaNetConfig,
    DeltaRuleConfig,
    dt_bias_init,
    head_param,
    l2_normalize,
    linear,
    log_uniform_open,
)
from jaxlib_ext.pallas_kernels.gated_delta import gated_delta_rule

__all__ = ["GDNConfig", "gdn_gates", "GatedDeltaNet"]


@dataclasses.dataclass(frozen=True)
class GDNConfig(DeltaRuleConfig):
    """The ``"gdn"`` mixer of a language-model block (fields: :class:`DeltaRuleConfig`)."""

    kind: ClassVar[str] = "gdn"


def gdn_gates(a, b, *, A_log, dt_bias) -> tuple[jax.Array, jax.Array]:
    """Gated DeltaNet gates (1)-(2): ``(g, beta)``, each ``[..., H]`` float32.

    Args:
      a: ``[..., H]`` decay pre-activations ``W_a x``.
      b: ``[..., H]`` write-strength pre-activations ``W_b x``.
      A_log: ``[H]`` log decay rates (eq. (1)).
      dt_bias: ``[H]`` bias added to ``a`` before the softplus (eq. (1)).

    Returns:
      ``(g, beta)``: ``g = -exp(A_log) softplus(a + dt_bias)`` (log decay, ``<= 0``) and
      ``beta = sigmoid(b)``, both computed in float32.

    References:
      Gated DeltaNet, arXiv 2412.06464 (ICLR 2025), Section 3.
    """
    f32 = jnp.float32
    a, b = jnp.asarray(a, f32), jnp.asarray(b, f32)
    g = -jnp.exp(A_log.astype(f32)) * jax.nn.softplus(a + dt_bias.astype(f32))  # (1)
    return g, jax.nn.sigmoid(b)  # (2)


class GatedDeltaNet(DeltaMixer):
    """The Gated DeltaNet token mixer (arXiv 2412.06464, Section 3).

    ``__call__(x [B, T, d], cache=None) -> (y [B, T, d], new_cache or None)``; the cache state is
    ``[B, H, K, V]``. See the module docstring for the equations and inits.
    """

    gate_activation = staticmethod(jax.nn.silu)  # (5)

    def __init__(self, cfg: DeltaNetConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        d, h = cfg.d_model, cfg.n_heads
        self.a_proj = linear(d, h, ("embed", "heads"), rngs)
        self.b_proj = linear(d, h, ("embed", "heads"), rngs)
        self.A_log = head_param(log_uniform_open(rngs.params(), (h,), 16.0))
        self.dt_bias = head_param(dt_bias_init(rngs.params(), (h,)))

    def _state_shape(self, batch):
        c = self.cfg
        return (batch, c.n_heads, c.head_dim, c.value_dim)

    def gates(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(g, beta)`` this layer emits for hidden states ``x [B, T, d]`` (``[B, T, H]`` each)."""
        return gdn_gates(self.a_proj(x), self.b_proj(x), A_log=self.A_log[...],
                         dt_bias=self.dt_bias[...])

    def _delta_rule(self, x, q, k, v, **op_options):
        g, beta = self.gates(x)
        return gated_delta_rule(l2_normalize(q), l2_normalize(k), v, g, beta, **op_options)  # (3-4)
