"""LatentMoE: a mixture of experts whose routed experts run in a smaller latent width.

Elango et al., "LatentMoE: Toward Optimal Accuracy per FLOP and Parameter in Mixture of
Experts", arXiv 2601.18089 (the MoE layer of Nemotron 3 Super and Ultra, arXiv 2512.20856).
For a token ``x`` of width ``d`` (already normalised by the block's pre-norm)::

    s     = sigmoid(W_r x)                          router on the full-width x, float32
    sel   = top_k(s + b)                            b: correction bias, selection only
    w     = routed_scaling * s[sel] / sum s[sel]    (normalised, then scaled)
    z     = W_down x                                W_down: d -> l, shared by all experts
    y_lat = sum_{e in sel} w_e W2_e relu(W1_e z)^2  non-gated squared-ReLU experts, width l
    y     = W_up y_lat + W2_s relu(W1_s x)^2        one up-projection; shared expert at width d

``latent_dim=None`` is the standard mixture of experts with the same router and experts
(``z = x``, no projections). Projections have no biases.

Constructor (the layer's sizes and rules are one :class:`LatentMoEConfig`; the rest says where
and in which dtype it runs)::

    LatentMoE(d_model, LatentMoEConfig(num_experts=8, top_k=2, expert_dim=128, latent_dim=None,
              shared_expert_dim=None, routed_scaling=1.0, normalize_weights=True,
              bias_update_rate=1e-3, method="xla"),
              *, gmm_config=None, mesh=None, dtype=None, param_dtype=jnp.float32, rngs)

Call (``forward`` is the FFN protocol of a language-model block, ``train`` the bias update)::

    y, metrics = layer(x, update_bias=False)
    y, metrics = layer.forward(x, train=False)

``x`` is ``[..., d_model]`` (e.g. ``[B, T, d]``); ``y`` has its shape and dtype. ``metrics``
holds scalars of the router's load in this call, normalised so that a perfectly balanced
router gives 1: ``moe_load_max`` and ``moe_load_min`` (the most and least loaded expert's
token count over the mean count) and ``moe_load_cv`` (coefficient of variation of the counts).
Every call also stores the per-expert counts in ``layer.expert_load`` (``float32[E]``, an
``ExpertLoad`` variable, a kind of ``nnx.BatchStat``), for logging or histograms; as for any
NNX variable, a write inside a JAX transform needs the variable to be passed in as state
(``nnx.jit``/``nnx.grad``, or the ``nnx.BatchStat`` state an argument of the traced function
after ``nnx.split``); where it is not (closed over), the load write is skipped and
``update_bias=True`` raises flax's ``TraceContextError``.

Balancing (aux-loss-free, arXiv 2412.19437 Section 2.1.2): the correction bias
``layer.router_bias`` (``float32[E]``, a ``RouterBias`` variable, also ``nnx.BatchStat``, not a
parameter: it gets no gradient) changes only which experts are selected. With
``update_bias=True`` the call also applies :func:`router_bias_update` with this call's counts
and ``bias_update_rate`` (a training step does; evaluation does not). The output of that call
uses the bias from before the update.

Dispatch (``method``, one of :data:`jaxlib_ext.pallas_kernels.METHODS`; arXiv 2601.18089
Section 3 and the sorted grouped-matmul scheme of MaxText's ``RoutedMoE``): ``"xla"`` (the
default: dropless, sorted by expert, grouped matmuls by ``moe.gmm``'s XLA path:
``jax.lax.ragged_dot`` on GPU/TPU, its tiled form on CPU), ``"pallas"`` (the same with the
Pallas grouped-matmul kernel of :mod:`jaxlib_ext.pallas_kernels.moe`, configured by
``gmm_config``; interpreted on CPU), ``"auto"`` (the same with ``moe.gmm``'s ``"auto"``: the
kernel on a GPU, else XLA), ``"reference"`` (every expert on every token, masked: the dense
reference). See :mod:`_moe_dispatch`.

Expert parallelism: under a mesh with an ``expert`` axis of size ``P > 1`` (the ``mesh``
argument, or the mesh set by ``jax.set_mesh``), the experts are split over that axis and the
latent rows travel by all-to-all inside ``jax.shard_map`` (:mod:`_moe_expert_parallel`); the
result equals the unsharded layer. ``P`` must divide ``num_experts`` and the tokens must split
over the mesh's data-parallel and expert axes. The expert weights carry the logical axis
``"expert"`` (``jaxlib_ext.core.sharding`` maps it to the mesh axis ``expert``).

Parameters (logical axes): ``router`` ``[d, E]``, ``down`` ``[d, l]``, ``up`` ``[l, d]``
(latent only), ``w1`` ``[E, l, m]``, ``w2`` ``[E, m, l]``, ``shared_w1`` ``[d, m_s]``,
``shared_w2`` ``[m_s, d]`` (with a shared expert). Initialisation: normal(0.02), as the other
layers of :mod:`jaxlib_ext.models`.

Dtypes: parameters in ``param_dtype``; the matmuls in ``dtype`` (default: ``x.dtype``) with
float32 accumulation; the router always in float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import errors, nnx

from jaxlib_ext.models._moe_dispatch import (
    Routing,
    dispatch,
    expert_counts,
    route,
    router_bias_update,
)
from jaxlib_ext.models._moe_expert_parallel import check_expert_mesh, dispatch_expert_parallel
from jaxlib_ext.models.layers import dense_init
from jaxlib_ext.pallas_kernels import METHODS

__all__ = [
    "ExpertLoad",
    "LatentMoE",
    "LatentMoEConfig",
    "RouterBias",
    "Routing",
    "load_metrics",
    "route",
    "router_bias_update",
]

EXPERT_AXIS = "expert"


class RouterBias(nnx.BatchStat):
    """The router's selection-only correction bias ``float32[E]``.

    Balancing updates it (:func:`router_bias_update`); it gets no gradient.
    """


class ExpertLoad(nnx.BatchStat):
    """Per-expert (token, slot) counts ``float32[E]`` of the last call."""


def load_metrics(counts) -> dict[str, jax.Array]:
    """Scalar load statistics of per-expert counts, 1 meaning perfect balance.

    Args:
      counts: ``[E]`` per-expert (token, slot) counts.

    Returns:
      A dict of float32 scalars: ``moe_load_max`` and ``moe_load_min`` (the most and least
      loaded expert's count over the mean count) and ``moe_load_cv`` (the coefficient of
      variation of the counts).
    """
    counts = counts.astype(jnp.float32)
    mean = jnp.maximum(jnp.mean(counts), 1e-20)
    return {
        "moe_load_max": jnp.max(counts) / mean,
        "moe_load_min": jnp.min(counts) / mean,
        "moe_load_cv": jnp.std(counts) / mean,
    }


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class LatentMoEConfig:
    """Sizes and rules of a :class:`LatentMoE` layer (module docstring).

    Attributes:
      num_experts: routed experts ``E``, a positive int (default 8).
      top_k: experts per token ``k``, a positive int ``<= num_experts`` (default 2).
      expert_dim: hidden width ``m`` of each routed expert, a positive int (default 128).
      latent_dim: latent width ``l``, a positive int, or ``None`` (the standard mixture of
        experts, ``l = d``).
      shared_expert_dim: hidden width ``m_s`` of the full-width shared expert, a positive int;
        ``None``: none.
      routed_scaling: factor on the routing weights (default 1.0; Nemotron 3 Super: 5.0).
      normalize_weights: divide the selected scores by their sum before scaling (default
        True).
      bias_update_rate: step of the balancing update (``update_bias=True`` calls; 0: none;
        default 1e-3).
      method: dispatch, one of :data:`jaxlib_ext.pallas_kernels.METHODS`,
        ``"auto" | "reference" | "xla" | "pallas"`` (default ``"xla"``; module docstring).

    :attr:`kind` is the FFN's name in the composable LM: ``"latent_moe"``, or ``"moe"`` when
    ``latent_dim`` is ``None``.

    Raises:
      ValueError: if a size is not a positive int, ``top_k > num_experts``, or ``method`` is
        unknown.
    """

    num_experts: int = 8
    top_k: int = 2
    expert_dim: int = 128
    latent_dim: int | None = None
    shared_expert_dim: int | None = None
    routed_scaling: float = 1.0
    normalize_weights: bool = True
    bias_update_rate: float = 1e-3
    method: str = "xla"

    def __post_init__(self):
        for name in ("num_experts", "top_k", "expert_dim"):
            _positive_int(f"LatentMoEConfig.{name}", getattr(self, name))
        if self.top_k > self.num_experts:
            raise ValueError(f"LatentMoEConfig.top_k {self.top_k} exceeds "
                             f"LatentMoEConfig.num_experts {self.num_experts}")
        for name in ("latent_dim", "shared_expert_dim"):
            if getattr(self, name) is not None:
                _positive_int(f"LatentMoEConfig.{name}", getattr(self, name))
        if self.method not in METHODS:
            raise ValueError(f"LatentMoEConfig.method must be one of {METHODS}, got "
                             f"{self.method!r}")

    @property
    def kind(self) -> str:
        """The FFN's registry name: ``"moe"`` without a latent width, else ``"latent_moe"``."""
        return "moe" if self.latent_dim is None else "latent_moe"


class LatentMoE(nnx.Module):
    """The LatentMoE layer (module docstring); ``latent_dim=None``: the standard MoE.

    Args:
      d_model: model width ``d``.
      config: a :class:`LatentMoEConfig` (sizes, routing and balancing rules, dispatch).
      gmm_config: ``GMMKernelConfig`` of the Pallas grouped matmul (``method="pallas"``);
        ``None``: the kernel's default.
      mesh: mesh for expert parallelism (else the one set by ``jax.set_mesh``, if any).
      dtype: compute dtype (``None``: the input's).
      param_dtype: parameter dtype (default float32).
      rngs: ``nnx.Rngs`` with a ``params`` stream.

    Raises:
      TypeError: if ``config`` is not a :class:`LatentMoEConfig`.
      ValueError: a non-positive ``d_model``, ``config.latent_dim > d_model``, or a ``mesh``
        whose ``expert`` axis does not divide ``config.num_experts`` (the config checks the
        rest).

    References:
      Elango et al., LatentMoE: Toward Optimal Accuracy per FLOP and Parameter in Mixture of
      Experts, arXiv 2601.18089.

      DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv 2412.19437 (Section 2.1.2, the
      aux-loss-free balancing).
    """

    def __init__(
        self,
        d_model: int,
        config: LatentMoEConfig,
        *,
        gmm_config=None,
        mesh=None,
        dtype=None,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        _positive_int("d_model", d_model)
        if not isinstance(config, LatentMoEConfig):
            raise TypeError(f"config must be a LatentMoEConfig, got {type(config).__name__}")
        c = config
        num_experts, top_k, expert_dim = c.num_experts, c.top_k, c.expert_dim
        latent_dim, shared_expert_dim = c.latent_dim, c.shared_expert_dim
        if latent_dim is not None and latent_dim > d_model:
            raise ValueError(f"latent_dim must be <= d_model = {d_model}, got {latent_dim}")
        self.config = config
        routed_scaling, normalize_weights = c.routed_scaling, c.normalize_weights
        bias_update_rate, method = c.bias_update_rate, c.method
        if mesh is not None:
            check_expert_mesh(mesh, num_experts, EXPERT_AXIS)
        self.d_model = d_model
        self.num_experts = num_experts
        self.top_k = top_k
        self.expert_dim = expert_dim
        self.latent_dim = latent_dim
        self.shared_expert_dim = shared_expert_dim
        self.routed_scaling = float(routed_scaling)
        self.normalize_weights = bool(normalize_weights)
        self.bias_update_rate = float(bias_update_rate)
        self.method = method
        self.gmm_config = gmm_config
        self.mesh = mesh
        self.dtype = dtype
        self.param_dtype = param_dtype

        def param(shape, axes):
            return nnx.Param(dense_init(rngs.params(), shape, param_dtype), logical_axes=axes)

        width = d_model if latent_dim is None else latent_dim
        self.router = param((d_model, num_experts), ("embed", None))
        if latent_dim is not None:
            self.down = param((d_model, latent_dim), ("embed", None))
            self.up = param((latent_dim, d_model), (None, "embed"))
        self.w1 = param((num_experts, width, expert_dim), (EXPERT_AXIS, None, "mlp"))
        self.w2 = param((num_experts, expert_dim, width), (EXPERT_AXIS, "mlp", None))
        if shared_expert_dim is not None:
            self.shared_w1 = param((d_model, shared_expert_dim), ("embed", "mlp"))
            self.shared_w2 = param((shared_expert_dim, d_model), ("mlp", "embed"))
        self.router_bias = RouterBias(jnp.zeros((num_experts,), jnp.float32))
        self.expert_load = ExpertLoad(jnp.zeros((num_experts,), jnp.float32))

    # ------------------------------------------------------------------------------ parts

    def routing(self, x) -> Routing:
        """The router's decision for a flat batch of tokens.

        Args:
          x: ``[T, d]`` tokens.

        Returns:
          The :class:`Routing` (selected experts and their weights) of each token.
        """
        return route(
            x, self.router[...], self.router_bias[...], top_k=self.top_k,
            normalize=self.normalize_weights, scaling=self.routed_scaling,
        )  # fmt: skip

    def _expert_mesh(self):
        mesh = self.mesh if self.mesh is not None else jax.sharding.get_abstract_mesh()
        if mesh is None or dict(mesh.shape).get(EXPERT_AXIS, 1) <= 1:
            return None
        check_expert_mesh(mesh, self.num_experts, EXPERT_AXIS)
        return mesh

    def __call__(self, x, *, update_bias: bool = False):
        """Routes each token to its experts and combines their outputs.

        Every call stores this call's per-expert counts in ``expert_load``.

        Args:
          x: ``[..., d_model]`` floating inputs (e.g. ``[B, T, d]``).
          update_bias: whether to apply :func:`router_bias_update` to ``router_bias`` with
            this call's counts; the output uses the bias from before the update.

        Returns:
          ``(y, metrics)``: ``y`` of ``x``'s shape and dtype, and :func:`load_metrics` of
          this call's counts.

        Raises:
          ValueError: if ``x`` is not a floating ``[..., d_model]`` array, or
            ``method="reference"`` is asked of an expert-parallel mesh.
        """
        if not hasattr(x, "shape") or x.ndim < 1 or x.shape[-1] != self.d_model:
            shape = getattr(x, "shape", type(x).__name__)
            raise ValueError(f"x must have shape [..., d_model={self.d_model}], got {shape}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"x must have a floating dtype, got {x.dtype}")
        lead = x.shape[:-1]
        dtype = jnp.dtype(self.dtype or x.dtype)
        tokens = x.reshape(-1, self.d_model)
        routing = self.routing(tokens)
        xc = tokens.astype(dtype)
        cast = lambda p: p[...].astype(dtype)  # noqa: E731
        hi = jax.lax.Precision.HIGHEST if dtype == jnp.float64 else None

        z = xc if self.latent_dim is None else jnp.dot(xc, cast(self.down), precision=hi)
        mesh = self._expert_mesh()
        if mesh is None:
            y = dispatch(
                z, routing, cast(self.w1), cast(self.w2), method=self.method,
                config=self.gmm_config,
            )  # fmt: skip
        else:
            if self.method == "reference":
                raise ValueError("method 'reference' has no expert-parallel form; use 'xla'")
            y = dispatch_expert_parallel(
                z, routing, cast(self.w1), cast(self.w2), mesh=mesh, axis=EXPERT_AXIS,
                method=self.method, config=self.gmm_config,
            )  # fmt: skip
        y = y.astype(dtype)
        if self.latent_dim is not None:
            y = jnp.dot(y, cast(self.up), precision=hi)
        if self.shared_expert_dim is not None:
            h = jnp.square(jax.nn.relu(jnp.dot(xc, cast(self.shared_w1), precision=hi)))
            y = y + jnp.dot(h, cast(self.shared_w2), precision=hi)

        counts = jax.lax.stop_gradient(expert_counts(routing.experts, self.num_experts))
        try:
            self.expert_load[...] = counts
        except errors.TraceContextError:
            pass  # a diagnostic: skipped where the variable belongs to an outer trace
        if update_bias:
            self.router_bias[...] = router_bias_update(
                self.router_bias[...], counts, self.bias_update_rate
            )
        return y.astype(x.dtype).reshape(*lead, self.d_model), load_metrics(counts)

    def forward(self, x, *, train: bool = False):
        """The FFN protocol of a language-model block.

        Args:
          x: ``[..., d_model]`` floating inputs.
          train: whether to update the correction bias (``update_bias`` of ``__call__``).

        Returns:
          ``(y, metrics)`` as ``__call__``.
        """
        return self(x, update_bias=train)
