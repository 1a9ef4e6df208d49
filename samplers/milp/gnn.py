"""The bipartite variable-constraint graph network (Flax NNX) that outputs per-variable logits.

Architecture after Gasse et al. (arXiv 1906.01629, sec. 4): one node per integer column and one
per row, edges weighted by the row-scaled coefficients ``w_i A_ij`` (signed), embeddings of the
node features, then ``num_layers`` rounds of a constraint half-convolution (rows gather from their
columns) and a variable half-convolution (columns gather from their rows), each
``h <- relu(W [h, mean_nbrs(w_i A_ij h_nbr)])``, and a linear head to ``outputs`` logits per
column. The head's weights start at zero: as the bounded bias of the flip rule (D.3) of
:mod:`langevin` an untrained network adds nothing (the hybrid begins as the plain sampler); as the
learned proposal of :mod:`proposal` (two unbounded outputs) it begins as a lazy random walk.

Node features are computed from the current state (the sampler calls the network at every step):

* columns (:data:`VAR_FEATURES`): ``c_j / S``; ``z_j`` scaled to the box; the gradient of (E.1)
  over its largest magnitude; the exact single-move gains of ``langevin.coordinate_gains`` (up and
  down, squashed by ``tanh``); whether the column can move up / down.
* rows (:data:`CON_FEATURES`): the weighted violation above and below (``tanh``), the weighted
  slack to each finite bound (``tanh``; ``-1`` for an infinite side), and a constant.

The same network serves the supervised Neural-Diving baseline (:mod:`training`), evaluated at
the all-lower-bound state, where the logit is read as ``logit P(z_j = 1)`` of a binary column.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.samplers.milp.energy import EnergyData
from jaxlib_ext.samplers.milp.langevin import coordinate_gains

__all__ = ["CON_FEATURES", "VAR_FEATURES", "BipartiteGNN", "gnn_bias_fn", "node_features"]

VAR_FEATURES = 7
CON_FEATURES = 5


def node_features(data: EnergyData, z, g, shift=0.0, penalty=1.0):
    """The node features of the bipartite graph at a state (module docstring).

    Args:
      data: the :class:`~jaxlib_ext.samplers.milp.energy.EnergyData` of the integer block.
      z: ``(n,)`` the current assignment.
      g: ``(n,)`` the energy's gradient at ``z``.
      shift: ``(m,)`` (or scalar) the continuous block's row shift of (E.1).
      penalty: ``lam`` of (E.1), for the exact gains.

    Returns:
      ``(var_x, con_x)`` of shapes ``(n, VAR_FEATURES)`` (zero on padded columns) and
      ``(m, CON_FEATURES)``.
    """
    width = jnp.maximum(data.upper - data.lower, 1.0)
    gscale = jnp.maximum(jnp.max(jnp.abs(g)), 1e-6)
    up, down = coordinate_gains(data, z, shift, 0.0, penalty)
    can_up = ((z + 1 <= data.upper) & (data.var_mask > 0)).astype(z.dtype)
    can_down = ((z - 1 >= data.lower) & (data.var_mask > 0)).astype(z.dtype)
    var_x = jnp.stack([data.c / data.obj_scale, (z - data.lower) / width, g / gscale,
                       jnp.tanh(up) * can_up, jnp.tanh(down) * can_down, can_up, can_down], -1)
    r = data.A @ z + shift
    w = data.row_weight
    hi_fin, lo_fin = jnp.isfinite(data.row_upper), jnp.isfinite(data.row_lower)
    over = jnp.where(hi_fin, jnp.tanh(w * jnp.maximum(r - data.row_upper, 0.0)), 0.0)
    under = jnp.where(lo_fin, jnp.tanh(w * jnp.maximum(data.row_lower - r, 0.0)), 0.0)
    slack_hi = jnp.where(hi_fin, jnp.tanh(w * jnp.abs(data.row_upper - r)), -1.0)
    slack_lo = jnp.where(lo_fin, jnp.tanh(w * jnp.abs(r - data.row_lower)), -1.0)
    con_x = jnp.stack([over, under, slack_hi, slack_lo, jnp.ones_like(r)], -1)
    return var_x * data.var_mask[:, None], con_x


class BipartiteGNN(nnx.Module):
    """Bipartite GNN: ``model(data, z, g, shift, penalty)`` -> logits, ``(n,)`` for ``outputs=1``
    and ``(n, outputs)`` otherwise, zero on padded columns.

    Args:
      hidden: the embedding width, ``>= 1``.
      num_layers: rounds of the two half-convolutions, ``>= 1``.
      outputs: logits per column, ``>= 1``.
      max_logit: bounds the logits to ``(-max_logit, max_logit)`` (``max_logit * tanh(head /
        max_logit)``); ``None`` leaves them unbounded.
      rngs: the parameters' initialisation.

    References:
      Gasse et al., Exact Combinatorial Optimization with Graph Convolutional Neural Networks,
      arXiv 1906.01629, sec. 4.
    """

    def __init__(self, hidden: int = 32, num_layers: int = 2, *, outputs: int = 1,
                 max_logit: float | None = 2.0, rngs: nnx.Rngs):
        if hidden < 1 or num_layers < 1:
            raise ValueError(f"hidden, num_layers: expected >= 1, got {hidden}, {num_layers}")
        if outputs < 1:
            raise ValueError(f"outputs: expected >= 1, got {outputs}")
        if max_logit is not None and not max_logit > 0:
            raise ValueError(f"max_logit: expected > 0 or None, got {max_logit}")
        self.max_logit = None if max_logit is None else float(max_logit)
        self.outputs = int(outputs)
        self.var_embed = nnx.Linear(VAR_FEATURES, hidden, rngs=rngs)
        self.con_embed = nnx.Linear(CON_FEATURES, hidden, rngs=rngs)
        self.con_layers = nnx.List([nnx.Linear(2 * hidden, hidden, rngs=rngs)
                                    for _ in range(num_layers)])
        self.var_layers = nnx.List([nnx.Linear(2 * hidden, hidden, rngs=rngs)
                                    for _ in range(num_layers)])
        self.head = nnx.Linear(hidden, self.outputs, kernel_init=nnx.initializers.zeros,
                               rngs=rngs)

    def __call__(self, data: EnergyData, z, g, shift=0.0, penalty=1.0):
        var_x, con_x = node_features(data, z, g, shift, penalty)
        edges = data.row_weight[:, None] * data.A  # (m, n), signed, row-scaled
        nz = (data.A != 0).astype(z.dtype)
        deg_c = jnp.maximum(nz.sum(1), 1.0)[:, None]
        deg_v = jnp.maximum(nz.sum(0), 1.0)[:, None]
        hv = jax.nn.relu(self.var_embed(var_x))
        hc = jax.nn.relu(self.con_embed(con_x))
        for con_layer, var_layer in zip(self.con_layers, self.var_layers):
            hc = jax.nn.relu(con_layer(jnp.concatenate([hc, edges @ hv / deg_c], -1)))
            hv = jax.nn.relu(var_layer(jnp.concatenate([hv, edges.T @ hc / deg_v], -1)))
        out = self.head(hv)
        if self.max_logit is not None:
            # bounded: as a bias the learned logit reshapes the flip rule's moves but cannot
            # override (D.3) once the temperature is low and the gains dominate
            out = self.max_logit * jnp.tanh(out / self.max_logit)
        out = out * data.var_mask[:, None]
        return out[:, 0] if self.outputs == 1 else out


@functools.cache
def gnn_bias_fn(graphdef):
    """The network as a pure function of its parameters, cached so each graphdef compiles once.

    Args:
      graphdef: the graph definition of a split model (``graphdef, params =
        nnx.split(model)``).

    Returns:
      ``fn(params, data, z, g, shift, penalty)``, for ``langevin.run_langevin(bias_fn=...,
      bias_params=params)`` or ``run_langevin(proposal_fn=..., proposal_params=params)``.
    """

    def fn(params, data, z, g, shift, penalty):
        return nnx.merge(graphdef, params)(data, z, g, shift, penalty)

    return fn

