"""Momentum DeltaNet (MDN): the token mixer in Flax NNX.

Huang et al., "MDN: Parallelizing Stepwise Momentum for Delta Linear Attention", arXiv 2605.05838
(ICML 2026), Section 3. The layer is a :class:`~jaxlib_ext.models._delta_mixer.DeltaMixer` over
the pure op :func:`jaxlib_ext.pallas_kernels.mdn.momentum_delta_rule`; its gate parameterisation
and the 2x2 stability system are pure functions beside the module.

Per token ``x``, after the shared q/k/v short convolutions (equation numbers are this module's;
the gates follow the paper's Section 3, the stability constraint (5) its Appendix F, and the
recurrence inside (8) is eqs. (1)-(4) of :mod:`jaxlib_ext.pallas_kernels.mdn.reference`)::

    q      <- q - exp(D_log) * k                                         (1) output correction
    log_alpha_hat = -exp(A_log) * softplus(a + dt_bias)                  (2) Mamba2-style decay
    log_mu        = max(-exp(Mu_log) * softplus(m + mu_bias), min_log_mu)  (3)
    eta    = tanh(e / tau) + 1,  tau = sqrt(d / tau_factor)              (4)
    theta  = arctan(eta * exp(log_factor))                               (5) stability constraint
    beta   = sin^2(theta) * sigmoid(b)                                   (6)
    log_alpha = log cos^2(theta) + log_alpha_hat                         (7)
    q_hat, k_hat = q / ||q||, k / ||k||;   k <- eta * k_hat;   p <- alpha * k_hat
    o      = momentum_delta_rule(q_hat, k, v, p, log_alpha, log_mu, beta, ...)   (8)
    y      = W_o( RMSNorm_head(o) * sigmoid(W_g x) )

with ``a, b, m, e`` per-head scalars ``W_{a,b,m,e} x``. The op's ``eta`` argument multiplies
``k`` once inside ``M_t = mu M + eta k w^T``; the layer passes ``k = k_hat`` with ``eta = eta``,
which is the recurrence of ``k <- eta k_hat`` with unit ``eta`` (fla's kernel also scales by
``eta`` exactly once); passing ``eta * k_hat`` *and* ``eta`` would apply it twice.

Conventions (beside those of :mod:`jaxlib_ext.models._delta_mixer`):
- ``sin^2(arctan x) = x^2 / (1 + x^2)`` and ``log cos^2(arctan x) = -log1p(x^2)`` are evaluated
  in closed form (exact identities; no rounded angle goes through ``log(cos(.)^2)``).
- The L2 norm differs from the ``x / (||x|| + 1e-6)`` of MDN's recurrent kernel by
  ``O(1e-6 / ||x||)``.
- Inits: ``A_log, Mu_log ~ log U(0, 16]``, ``log_factor ~ log U(0, 4]``, ``D_log ~ log U(0, 1]``,
  ``dt_bias`` Mamba2's inverse-softplus init and ``mu_bias`` a copy of it.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

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
from jaxlib_ext.pallas_kernels.mdn import momentum_delta_rule

__all__ = [
    "MDNConfig",
    "MDNGates",
    "mdn_gates",
    "momentum_transition_matrix",
    "momentum_eigenvalues",
    "MomentumDeltaNet",
]


@dataclasses.dataclass(frozen=True)
class MDNConfig(DeltaRuleConfig):
    """The ``"mdn"`` mixer of a language-model block: :class:`DeltaRuleConfig`'s fields and
    MDN's ``tau_factor`` (``tau = sqrt(d / tau_factor)``, eq. (4)), ``min_log_mu`` (the clamp of
    eq. (3)) and ``use_output_correction`` (eq. (1))."""

    kind: ClassVar[str] = "mdn"
    tau_factor: float = 1.0
    min_log_mu: float | None = -2.0
    use_output_correction: bool = True


class MDNGates(NamedTuple):
    """Per-token, per-head gates of the momentum delta rule, all ``[..., H]`` float32."""

    log_alpha: jax.Array
    log_mu: jax.Array
    beta: jax.Array
    eta: jax.Array


def mdn_gates(
    a: jax.Array,
    b: jax.Array,
    m: jax.Array,
    e: jax.Array,
    *,
    A_log: jax.Array,
    Mu_log: jax.Array,
    dt_bias: jax.Array,
    mu_bias: jax.Array,
    log_factor: jax.Array,
    tau: float,
    min_log_mu: float | None,
) -> MDNGates:
    """MDN gate parameterisation, eqs. (2)-(7) of the module docstring, in float32.

    Args:
      a, b, m, e: ``[..., H]`` raw per-head projections of the token.
      A_log, Mu_log, dt_bias, mu_bias, log_factor: ``[H]`` parameters.
      tau: temperature of ``eta``; ``sqrt(d / tau_factor)``.
      min_log_mu: lower clamp of ``log_mu`` (``None``: no clamp).

    Returns:
      :class:`MDNGates` with ``alpha = cos^2(theta) alpha_hat``, ``beta = sin^2(theta) sigmoid(b)``,
      ``theta = arctan(eta exp(log_factor))``. Every value it emits gives the 2x2 system of
      :func:`momentum_transition_matrix` a spectral radius below one (``alpha beta eta <= eta/4``).
    """
    f32 = jnp.float32
    a, b, m, e = (jnp.asarray(x, f32) for x in (a, b, m, e))
    log_alpha_hat = -jnp.exp(A_log.astype(f32)) * jax.nn.softplus(a + dt_bias.astype(f32))  # (2)
    log_mu = -jnp.exp(Mu_log.astype(f32)) * jax.nn.softplus(m + mu_bias.astype(f32))  # (3)
    if min_log_mu is not None:
        log_mu = jnp.maximum(log_mu, min_log_mu)
    eta = jnp.tanh(e / tau) + 1.0  # (4), in (0, 2)
    x = eta * jnp.exp(log_factor.astype(f32))  # (5): tan(theta)
    x2 = x * x
    sin2 = x2 / (1.0 + x2)  # sin^2(arctan x)
    log_cos2 = -jnp.log1p(x2)  # log cos^2(arctan x)
    beta = sin2 * jax.nn.sigmoid(b)  # (6)
    log_alpha = log_cos2 + log_alpha_hat  # (7)
    return MDNGates(log_alpha, log_mu, beta, eta)


def momentum_transition_matrix(log_alpha, log_mu, beta, eta) -> jax.Array:
    """The homogeneous 2x2 system along a unit key ``k_hat`` with ``p = alpha k_hat``.

    With ``s = k_hat^T S`` and ``m = k_hat^T M`` (the second-order system of arXiv 2605.05838,
    Appendix F)::

        [s_t]   [alpha (1 - beta eta)   -beta mu] [s_{t-1}]
        [m_t] = [alpha eta                   mu ] [m_{t-1}]

    Args:
      log_alpha: ``log alpha``, the log state decay, eq. (7).
      log_mu: ``log mu``, the log momentum decay, eq. (3).
      beta: write strength, eq. (6).
      eta: key scale, eq. (4); the four gates broadcast to a common shape ``[...]``.

    Returns:
      The ``[..., 2, 2]`` transition matrices.

    References:
      arXiv 2605.05838, Appendix F.
    """
    alpha, mu = jnp.exp(log_alpha), jnp.exp(log_mu)
    row0 = jnp.stack([alpha * (1.0 - beta * eta), -beta * mu], axis=-1)
    row1 = jnp.stack([alpha * eta, mu], axis=-1)
    return jnp.stack([row0, row1], axis=-2)


def momentum_eigenvalues(log_alpha, log_mu, beta, eta) -> jax.Array:
    """Eigenvalues ``[..., 2]`` (complex) of :func:`momentum_transition_matrix`, in closed form.

    ``lambda^2 - (alpha (1 - beta eta) + mu) lambda + alpha mu = 0``; complex-conjugate roots have
    modulus ``sqrt(alpha mu)``.

    Args:
      log_alpha: ``log alpha``, the log state decay, eq. (7).
      log_mu: ``log mu``, the log momentum decay, eq. (3).
      beta: write strength, eq. (6).
      eta: key scale, eq. (4); the four gates broadcast to a common shape ``[...]``.

    Returns:
      The ``[..., 2]`` roots ``(tr + r) / 2`` and ``(tr - r) / 2``, complex128 for float64 gates,
      complex64 otherwise.
    """
    alpha, mu = jnp.exp(log_alpha), jnp.exp(log_mu)
    tr = alpha * (1.0 - beta * eta) + mu
    det = alpha * mu
    ctype = jnp.complex128 if tr.dtype == jnp.float64 else jnp.complex64
    root = jnp.sqrt((tr * tr - 4.0 * det).astype(ctype))
    return jnp.stack([(tr + root) / 2.0, (tr - root) / 2.0], axis=-1)


class MomentumDeltaNet(DeltaMixer):
    """The Momentum DeltaNet token mixer (arXiv 2605.05838, Section 3).

    ``__call__(x [B, T, d], cache=None) -> (y [B, T, d], new_cache or None)``; the cache state is
    ``[2, B, H, K, V]`` holding ``(S, M)``. See the module docstring for the equations and inits.
    """

    gate_activation = staticmethod(jax.nn.sigmoid)

    def __init__(self, cfg: DeltaNetConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        d, h = cfg.d_model, cfg.n_heads
        self.a_proj = linear(d, h, ("embed", "heads"), rngs)
        self.b_proj = linear(d, h, ("embed", "heads"), rngs)
        self.m_proj = linear(d, h, ("embed", "heads"), rngs)
        self.e_proj = linear(d, h, ("embed", "heads"), rngs)
        self.A_log = head_param(log_uniform_open(rngs.params(), (h,), 16.0))
        self.Mu_log = head_param(log_uniform_open(rngs.params(), (h,), 16.0))
        dt_bias = dt_bias_init(rngs.params(), (h,))
        self.dt_bias = head_param(dt_bias)
        self.mu_bias = head_param(jnp.array(dt_bias))  # a copy of dt_bias at init
        self.log_factor = head_param(log_uniform_open(rngs.params(), (h,), 4.0))
        if cfg.use_output_correction:
            self.D_log = head_param(log_uniform_open(rngs.params(), (h,), 1.0))
        else:
            self.D_log = None

    def _state_shape(self, batch):
        c = self.cfg
        return (2, batch, c.n_heads, c.head_dim, c.value_dim)

    def gates(self, x: jax.Array) -> MDNGates:
        """The gates this layer emits for hidden states ``x [B, T, d]`` (``[B, T, H]`` each)."""
        c = self.cfg
        return mdn_gates(
            self.a_proj(x), self.b_proj(x), self.m_proj(x), self.e_proj(x),
            A_log=self.A_log[...], Mu_log=self.Mu_log[...], dt_bias=self.dt_bias[...],
            mu_bias=self.mu_bias[...], log_factor=self.log_factor[...], tau=c.tau,
            min_log_mu=c.min_log_mu,
        )

    def _delta_rule(self, x, q, k, v, **op_options):
        gates = self.gates(x)
        if self.cfg.use_output_correction:  # (1), on the raw conv outputs, before the L2 norm
            q = (q - jnp.exp(self.D_log[...])[:, None] * k).astype(k.dtype)
        q_hat, k_hat = l2_normalize(q), l2_normalize(k)
        p = (jnp.exp(gates.log_alpha)[..., None] * k_hat).astype(k_hat.dtype)  # p = alpha k_hat
        # k <- eta k_hat: the op applies eta once (M += eta k w^T), so k_hat goes in as k.
        return momentum_delta_rule(  # (8)
            q_hat, k_hat, v, p, gates.log_alpha, gates.log_mu, gates.beta, gates.eta,
            **op_options,
        )
