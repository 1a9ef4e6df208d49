"""Short causal depthwise convolution with a decode state (the ``ShortConvolution`` of fla).

Linear-recurrent layers (Mamba2, DeltaNet, Gated DeltaNet arXiv 2412.06464, Momentum DeltaNet
arXiv 2605.05838) pass q, k and v through a depthwise causal convolution of width ``W``
(4 by default) followed by SiLU. For channel ``c`` and time ``t``:

    y[t, c] = act( sum_{i=0}^{W-1} w[i, c] * x[t - (W-1) + i, c] )

with ``x[s] = state`` for ``s < 0`` (zeros for a fresh sequence). The newest input is multiplied
by ``w[W-1]``, the same tap order as a PyTorch ``Conv1d`` with left padding ``W-1``. The decode
state is the last ``W-1`` inputs, so a sequence processed in pieces gives the same outputs as one
pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.models.layers import dense_init

__all__ = ["causal_depthwise_conv", "ShortConvolution"]

_ACTIVATIONS = {"silu": jax.nn.silu, "identity": lambda x: x, None: lambda x: x}


def causal_depthwise_conv(
    x: jax.Array,
    weight: jax.Array,
    state: jax.Array | None = None,
    *,
    activation: str | None = "silu",
) -> tuple[jax.Array, jax.Array]:
    """Causal depthwise 1-D convolution over time, returning the output and the new state.

    Args:
      x: ``[B, T, C]`` inputs.
      weight: ``[W, C]`` taps; ``weight[W-1]`` multiplies the current input.
      state: ``[B, W-1, C]`` the previous ``W-1`` inputs (oldest first), or ``None`` for zeros.
      activation: ``"silu"`` (default), ``"identity"`` or ``None``.

    Returns:
      ``(y, new_state)``: ``y`` ``[B, T, C]`` in ``x``'s dtype and ``new_state`` ``[B, W-1, C]``
      the last ``W-1`` inputs of ``concat(state, x)``.

    Raises:
      ValueError: if ``x`` is not ``[B, T, C]``, ``weight`` is not ``[W, C]``, ``state`` is
        not ``[B, W-1, C]``, or ``activation`` is unknown.
    """
    if x.ndim != 3:
        raise ValueError(f"causal_depthwise_conv: x must be [B, T, C], got shape {x.shape}")
    if weight.ndim != 2 or weight.shape[1] != x.shape[2]:
        raise ValueError(
            f"causal_depthwise_conv: weight must be [W, C={x.shape[2]}], got shape {weight.shape}"
        )
    if activation not in _ACTIVATIONS:
        raise ValueError(
            f"causal_depthwise_conv: activation must be one of {sorted(map(str, _ACTIVATIONS))}, "
            f"got {activation!r}"
        )
    b, t, c = x.shape
    w = weight.shape[0]
    if state is None:
        state = jnp.zeros((b, w - 1, c), x.dtype)
    elif state.shape != (b, w - 1, c):
        raise ValueError(
            f"causal_depthwise_conv: state must be [B, W-1, C] = {(b, w - 1, c)}, got {state.shape}"
        )
    xp = jnp.concatenate([state.astype(x.dtype), x], axis=1)  # [B, W-1+T, C]
    acc = jnp.zeros((b, t, c), jnp.float32)
    for i in range(w):  # W is tiny (4): an unrolled sum of shifted slices is cheapest
        acc = acc + xp[:, i : i + t].astype(jnp.float32) * weight[i].astype(jnp.float32)
    y = _ACTIVATIONS[activation](acc).astype(x.dtype)
    new_state = xp[:, xp.shape[1] - (w - 1) :]
    return y, new_state


class ShortConvolution(nnx.Module):
    """Depthwise causal conv (no bias) + activation; weights ``N(0, 0.02)`` as in fla's init.

    Args:
      channels: the channels ``C``, a positive int.
      kernel_size: the width ``W``, a positive int.
      activation: ``"silu"`` (default), ``"identity"`` or ``None``.
      logical_axis: the channel axis's logical name for sharding.
      rngs: the parameter initialisation keys.

    Raises:
      ValueError: if ``channels`` or ``kernel_size`` is not positive.
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 4,
        *,
        activation: str | None = "silu",
        logical_axis: str | None = "heads",
        rngs: nnx.Rngs,
    ):
        if channels <= 0 or kernel_size <= 0:
            raise ValueError(
                f"ShortConvolution: channels and kernel_size must be positive, got "
                f"{channels}, {kernel_size}"
            )
        self.channels = channels
        self.kernel_size = kernel_size
        self.activation = activation
        self.weight = nnx.Param(
            dense_init(rngs.params(), (kernel_size, channels), jnp.float32),
            logical_axes=(None, logical_axis),
        )

    def init_state(self, batch: int, dtype=jnp.float32) -> jax.Array:
        """A zero decode state.

        Args:
          batch: the number of sequences.
          dtype: the state's dtype.

        Returns:
          Zeros ``[batch, kernel_size - 1, channels]``.
        """
        return jnp.zeros((batch, self.kernel_size - 1, self.channels), dtype)

    def __call__(self, x: jax.Array, state: jax.Array | None = None):
        """Convolves ``x`` after the inputs in ``state`` (:func:`causal_depthwise_conv`).

        Args:
          x: ``[B, T, C]`` inputs.
          state: ``[B, W-1, C]`` the previous inputs, or ``None`` for zeros.

        Returns:
          ``(y [B, T, C], new_state [B, W-1, C])``.
        """
        return causal_depthwise_conv(x, self.weight[...], state, activation=self.activation)
