"""Parameter and FLOP accounting per token, by component, without building a model.

A :class:`Cost` is ``(params, active_params, flops)``: the parameters a component holds, those
one token touches (a mixture of experts touches ``top_k`` of its experts), and the forward
FLOPs one token costs (2 per multiply-add; elementwise work, norms and softmaxes are not
counted). Training costs about 3x the forward FLOPs.

The mixture-of-experts terms follow LatentMoE (arXiv 2601.18089; Nemotron-H's ``NemotronHMoE``),
per token with ``d`` the model width, ``l`` the latent width, ``m`` the expert width, ``m_s`` the
shared expert's, ``N`` experts and top-``K``::

    routed experts      K * 2 * (2 l m)    (non-gated: W1 [m, l], W2 [l, m]; l = d without latent)
    latent projections  2 * (2 d l)        (W_down [l, d], W_up [d, l])
    shared expert       2 * (2 d m_s)
    router              2 d N

Token mixers: attention counts its projections and ``4 H D c`` for the scores and the weighted
values at a mean causal context ``c = (T + 1) / 2`` over a sequence of ``T`` tokens; the
delta-rule mixers count their projections, short convolutions and the recurrent form of their
state update per token and head (GDN ``6 K V``: the read ``S^T k``, the rank-1 write and the
read-out ``S^T q``; MDN ``10 K V``: the same plus the momentum state's write and its addition
to ``S``); the mLSTM counts its projections, convolution and ``4 K V`` per head (the rank-1
write and the read-out ``C^T q``); Mamba-2 counts its projections, convolution and ``6 P N``
per head (state decay and write, read-out; ``P`` the head dim, ``N`` the state size). The
embedding is a lookup (its parameters active, no FLOPs); the untied head is a matmul.

:data:`NEMOTRON_3_SUPER` is the released Nemotron 3 Super 120B-A12B shape (arXiv 2512.20856;
88 layers: 40 Mamba-2, 40 LatentMoE, 8 attention), as a :class:`HybridConfig` whose
:func:`hybrid_cost` gives about 120B parameters of which about 12B are active. Its one
multi-token-prediction layer is left out (it serves speculative decoding, not the model).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

__all__ = [
    "Cost",
    "Accounting",
    "moe_cost",
    "swiglu_cost",
    "attention_cost",
    "delta_mixer_cost",
    "mlstm_cost",
    "mamba2_cost",
    "lm_cost",
    "HybridConfig",
    "NEMOTRON_3_SUPER",
    "hybrid_cost",
]


class Cost(NamedTuple):
    """Parameters, parameters one token touches, forward FLOPs per token.

    ``+`` adds componentwise and ``* n`` scales every count (``n`` layers).

    Attributes:
      params: the parameters the component holds.
      active_params: the parameters one token touches.
      flops: the forward FLOPs per token (2 per multiply-add).
    """

    params: int
    active_params: int
    flops: int

    def __add__(self, other):  # componentwise, not tuple concatenation
        return Cost(*(a + b for a, b in zip(self, other, strict=True)))

    def __mul__(self, n: int):
        return Cost(*(a * n for a in self))

    __rmul__ = __mul__


ZERO = Cost(0, 0, 0)


def _dense(params: int) -> Cost:
    """A matmul whose every weight each token uses once."""
    return Cost(params, params, 2 * params)


@dataclasses.dataclass(frozen=True)
class Accounting:
    """Per-component costs of a whole model.

    Attributes:
      components: the :class:`Cost` of each named component, summed over its layers.
    """

    components: dict[str, Cost]

    @property
    def total(self) -> Cost:
        """The sum of the components' costs."""
        out = ZERO
        for c in self.components.values():
            out = out + c
        return out

    @property
    def params(self) -> int:
        """The total parameter count."""
        return self.total.params

    @property
    def active_params(self) -> int:
        """The total parameters one token touches."""
        return self.total.active_params

    @property
    def flops_per_token(self) -> int:
        """The total forward FLOPs per token."""
        return self.total.flops

    def table(self) -> str:
        """A markdown table: one row per component and the total."""
        rows = ["| component | params | active params | GFLOPs/token |", "|---|---:|---:|---:|"]
        for name, c in [*self.components.items(), ("total", self.total)]:
            rows.append(f"| {name} | {c.params:,} | {c.active_params:,} | {c.flops / 1e9:.4f} |")
        return "\n".join(rows)

    def summary(self) -> str:
        """One line: total and active parameters, forward FLOPs per token."""
        t = self.total
        return (f"{t.params / 1e6:,.2f}M params ({t.active_params / 1e6:,.2f}M active), "
                f"{t.flops / 1e6:,.2f} MFLOPs/token forward")


def moe_cost(d_model: int, *, num_experts: int, top_k: int, expert_dim: int,
             latent_dim: int | None = None, shared_expert_dim: int | None = None
             ) -> dict[str, Cost]:
    """Costs of one (Latent)MoE layer (module docstring's formulas).

    Args:
      d_model: the model width ``d``.
      num_experts: the routed experts ``N``.
      top_k: experts per token ``K``, at most ``num_experts``.
      expert_dim: the hidden width ``m`` of each routed expert.
      latent_dim: the latent width ``l``; ``None`` means no latent projections (``l = d``).
      shared_expert_dim: the shared expert's width ``m_s``; ``None`` (or 0) means none.

    Returns:
      A dict of :class:`Cost`: ``routed``, ``latent`` (with ``latent_dim``), ``shared`` (with
      ``shared_expert_dim``) and ``router``.

    Raises:
      ValueError: if ``top_k > num_experts``.

    References:
      Elango et al., LatentMoE: Toward Optimal Accuracy per FLOP and Parameter in Mixture of
      Experts, arXiv 2601.18089.
    """
    if top_k > num_experts:
        raise ValueError(f"moe_cost: top_k {top_k} exceeds num_experts {num_experts}")
    width = latent_dim or d_model
    expert = 2 * width * expert_dim
    out = {"routed": Cost(num_experts * expert, top_k * expert, top_k * 2 * expert)}
    if latent_dim is not None:
        out["latent"] = _dense(2 * d_model * latent_dim)
    if shared_expert_dim:
        out["shared"] = _dense(2 * d_model * shared_expert_dim)
    out["router"] = _dense(d_model * num_experts)
    return out


def swiglu_cost(d_model: int, hidden: int) -> Cost:
    """SwiGLU: gate, up and down projections.

    Args:
      d_model: the model width.
      hidden: the hidden width.

    Returns:
      The :class:`Cost` of one layer.
    """
    return _dense(3 * d_model * hidden)


def attention_cost(d_model: int, n_heads: int, head_dim: int, *, n_kv_heads: int | None = None,
                   seq_len: int = 0) -> Cost:
    """Causal attention: projections plus ``4 H D (T + 1) / 2`` for scores and values.

    Args:
      d_model: the model width.
      n_heads: the query heads ``H``.
      head_dim: the head width ``D``.
      n_kv_heads: the key/value heads; ``None`` means ``n_heads``.
      seq_len: the sequence length ``T`` that sets the mean causal context.

    Returns:
      The :class:`Cost` of one layer.
    """
    kv = n_kv_heads or n_heads
    proj = 2 * d_model * n_heads * head_dim + 2 * d_model * kv * head_dim
    scores = 4 * n_heads * head_dim * (seq_len + 1) // 2
    return Cost(proj, proj, 2 * proj + scores)


def delta_mixer_cost(kind: str, d_model: int, n_heads: int, head_dim: int, value_dim: int, *,
                     conv_size: int = 4, use_output_correction: bool = True) -> Cost:
    """An MDN (``kind="mdn"``) or GDN (``"gdn"``) mixer.

    It counts the q/k/v/g/o projections, short convs, the per-head gate projections and
    vectors, the head norm, and the recurrence (module docstring).

    Args:
      kind: ``"mdn"`` or ``"gdn"``.
      d_model: the model width.
      n_heads: the heads ``H``.
      head_dim: the key width ``K``.
      value_dim: the value width ``V``.
      conv_size: the short convolutions' width.
      use_output_correction: whether an MDN has its output-correction vector (unused for
        GDN).

    Returns:
      The :class:`Cost` of one layer.

    Raises:
      ValueError: if ``kind`` is neither ``"mdn"`` nor ``"gdn"``.
    """
    if kind not in ("mdn", "gdn"):
        raise ValueError(f"delta_mixer_cost: kind must be 'mdn' or 'gdn', got {kind!r}")
    h, k, v = n_heads, head_dim, value_dim
    proj = d_model * h * (2 * k + 2 * v) + h * v * d_model
    conv = conv_size * h * (2 * k + v)
    gate_proj = (4 if kind == "mdn" else 2) * d_model * h
    vectors = (6 if use_output_correction else 5) * h if kind == "mdn" else 2 * h
    params = proj + conv + gate_proj + vectors + v
    flops = 2 * (proj + conv + gate_proj) + (10 if kind == "mdn" else 6) * h * k * v
    return Cost(params, params, flops)


def mlstm_cost(d_model: int, n_heads: int, head_dim: int, value_dim: int, *,
               conv_size: int = 4) -> Cost:
    """An mLSTM mixer (:class:`~jaxlib_ext.models.MLSTMLayer`, arXiv 2405.04517).

    It counts the up, output-gate and down projections, the conv, per-head q/k/v, the gate
    projections with biases, the head norm and skip, and ``4 K V`` per head for the
    recurrence (the normaliser's ``O(K)`` is not counted).

    Args:
      d_model: the model width.
      n_heads: the heads ``H``.
      head_dim: the key width ``K``.
      value_dim: the value width ``V``.
      conv_size: the convolution's width.

    Returns:
      The :class:`Cost` of one layer.

    References:
      Beck et al., xLSTM: Extended Long Short-Term Memory, arXiv 2405.04517.
    """
    h, k, v = n_heads, head_dim, value_dim
    inner = h * v
    matmuls = 3 * d_model * inner + h * v * (2 * k + v) + 2 * d_model * h
    conv = conv_size * inner
    params = matmuls + conv + 2 * h + v + inner
    return Cost(params, params, 2 * (matmuls + conv) + 4 * h * k * v)


def mamba2_cost(d_model: int, *, n_heads: int, head_dim: int, state_dim: int, n_groups: int,
                conv_size: int = 4) -> Cost:
    """A Mamba-2 mixer (``mamba_ssm``'s ``Mamba2``).

    It counts in_proj to ``z, x, B, C, dt``, the depthwise conv (with bias) over ``x, B, C``,
    ``dt_bias, A_log, D``, the gated norm, out_proj, and ``6 P N`` per head for the scan.

    Args:
      d_model: the model width.
      n_heads: the heads.
      head_dim: the head width ``P``.
      state_dim: the state size ``N``.
      n_groups: the groups sharing ``B`` and ``C``.
      conv_size: the convolution's width.

    Returns:
      The :class:`Cost` of one layer.

    References:
      Dao & Gu, Transformers are SSMs: Generalized Models and Efficient Algorithms Through
      Structured State Space Duality, arXiv 2405.21060.
    """
    inner = n_heads * head_dim
    conv_ch = inner + 2 * n_groups * state_dim
    in_proj = d_model * (2 * inner + 2 * n_groups * state_dim + n_heads)
    out_proj = inner * d_model
    conv = conv_ch * (conv_size + 1)
    params = in_proj + out_proj + conv + 3 * n_heads + inner
    flops = 2 * (in_proj + out_proj + conv_ch * conv_size) + 6 * n_heads * head_dim * state_dim
    return Cost(params, params, flops)


def lm_cost(cfg, *, seq_len: int | None = None) -> Accounting:
    """The accounting of a :class:`~jaxlib_ext.models.LMConfig` (any mixer and FFN).

    Its parameter count equals the built model's.

    Args:
      cfg: the language model's config.
      seq_len: the sequence length that sets attention's mean causal context; ``None`` means
        ``cfg.max_seq_len``.

    Returns:
      The :class:`Accounting` by component (embedding, mixer, FFN parts, norms, head).

    Raises:
      TypeError: if ``cfg`` is not an ``LMConfig``.
    """
    from jaxlib_ext.models.lm import LMConfig

    if not isinstance(cfg, LMConfig):
        raise TypeError(f"lm_cost: cfg must be an LMConfig, got {type(cfg).__name__}")
    d, n = cfg.d_model, cfg.n_layers
    seq_len = cfg.max_seq_len if seq_len is None else seq_len
    kind = cfg.mixer_name
    if kind == "attention":
        mixer = attention_cost(d, cfg.n_heads, cfg.head_dim, n_kv_heads=cfg.mixer.kv_heads,
                               seq_len=seq_len)
    elif kind == "mlstm":
        mixer = mlstm_cost(d, cfg.n_heads, cfg.head_dim, cfg.expand_v * cfg.head_dim,
                           conv_size=cfg.conv_size)
    else:
        mixer = delta_mixer_cost(kind, d, cfg.n_heads, cfg.head_dim,
                                 cfg.expand_v * cfg.head_dim, conv_size=cfg.conv_size,
                                 use_output_correction=getattr(cfg.mixer,
                                                               "use_output_correction", False))
    comps = {"embedding": Cost(cfg.vocab_size * d, cfg.vocab_size * d, 0),
             f"mixer ({kind})": mixer * n}
    if cfg.ffn_name == "swiglu":
        comps["ffn (swiglu)"] = swiglu_cost(d, cfg.hidden) * n
    else:
        parts = moe_cost(d, num_experts=cfg.num_experts, top_k=cfg.top_k,
                         expert_dim=cfg.expert_dim,
                         latent_dim=cfg.latent_dim,
                         shared_expert_dim=cfg.shared_expert_dim)
        for name, c in parts.items():
            comps[f"ffn {name}"] = c * n
    norms = (2 * n + 1) * d
    comps["norms"] = Cost(norms, norms, 0)
    comps["lm_head"] = _dense(d * cfg.vocab_size)
    return Accounting(comps)


@dataclasses.dataclass(frozen=True)
class HybridConfig:
    """A hybrid stack in Nemotron-H's layout, for accounting only.

    Every layer is one pre-normed mixer or FFN.

    Attributes:
      d_model: the model width.
      vocab_size: the vocabulary size.
      pattern: one letter per layer, ``"M"`` Mamba-2, ``"*"`` attention, ``"E"`` (Latent)MoE
        (Nemotron-H also writes ``"-"`` for a dense MLP, which :func:`hybrid_cost` rejects).
      mamba_heads: the Mamba-2 heads.
      mamba_head_dim: the Mamba-2 head width.
      mamba_state: the Mamba-2 state size.
      mamba_groups: the Mamba-2 groups.
      mamba_conv: the Mamba-2 convolution width.
      n_heads: the attention query heads.
      n_kv_heads: the attention key/value heads.
      head_dim: the attention head width.
      num_experts: the routed experts.
      top_k: experts per token.
      expert_dim: the routed experts' width.
      latent_dim: the latent width, or ``None``.
      shared_expert_dim: the shared expert's width, or ``None``.
      tie_embeddings: whether the head is the transposed embedding (no parameters of its own).
    """

    d_model: int
    vocab_size: int
    pattern: str
    # Mamba-2
    mamba_heads: int
    mamba_head_dim: int
    mamba_state: int
    mamba_groups: int
    mamba_conv: int
    # attention
    n_heads: int
    n_kv_heads: int
    head_dim: int
    # (Latent)MoE
    num_experts: int
    top_k: int
    expert_dim: int
    latent_dim: int | None
    shared_expert_dim: int | None
    tie_embeddings: bool = False


#: Nemotron 3 Super 120B-A12B (arXiv 2512.20856; its released config): d = 4096, 40 Mamba-2,
#: 40 LatentMoE (512 experts, top-22, expert width 2688, latent 1024, shared width 5376) and
#: 8 attention layers (32 heads, 2 KV heads, head dim 128), vocabulary 131072. The layer order
#: does not change the counts; this pattern interleaves them evenly.
NEMOTRON_3_SUPER = HybridConfig(
    d_model=4096, vocab_size=131072, pattern=("ME" * 5 + "*") * 8,
    mamba_heads=128, mamba_head_dim=64, mamba_state=128, mamba_groups=8, mamba_conv=4,
    n_heads=32, n_kv_heads=2, head_dim=128,
    num_experts=512, top_k=22, expert_dim=2688, latent_dim=1024, shared_expert_dim=5376,
)


def hybrid_cost(cfg: HybridConfig, *, seq_len: int = 4096) -> Accounting:
    """The accounting of a :class:`HybridConfig`.

    Args:
      cfg: the hybrid stack.
      seq_len: the sequence length that sets attention's mean causal context.

    Returns:
      The :class:`Accounting` by component.

    Raises:
      ValueError: if ``cfg.pattern`` has a letter other than ``M``, ``*`` and ``E``.

    References:
      Nemotron 3 Super and Ultra (NVIDIA), arXiv 2512.20856.
    """
    bad = set(cfg.pattern) - set("M*E")
    if bad:
        raise ValueError(f"hybrid_cost: pattern has unknown layer kinds {sorted(bad)}")
    d = cfg.d_model
    count = {k: cfg.pattern.count(k) for k in "M*E"}
    comps = {"embedding": Cost(cfg.vocab_size * d, cfg.vocab_size * d, 0)}
    comps["mamba2"] = mamba2_cost(
        d, n_heads=cfg.mamba_heads, head_dim=cfg.mamba_head_dim, state_dim=cfg.mamba_state,
        n_groups=cfg.mamba_groups, conv_size=cfg.mamba_conv,
    ) * count["M"]
    comps["attention"] = attention_cost(d, cfg.n_heads, cfg.head_dim, n_kv_heads=cfg.n_kv_heads,
                                        seq_len=seq_len) * count["*"]
    parts = moe_cost(d, num_experts=cfg.num_experts, top_k=cfg.top_k, expert_dim=cfg.expert_dim,
                     latent_dim=cfg.latent_dim, shared_expert_dim=cfg.shared_expert_dim)
    for name, c in parts.items():
        comps[f"moe {name}"] = c * count["E"]
    norms = (len(cfg.pattern) + 1) * d
    comps["norms"] = Cost(norms, norms, 0)
    head = _dense(d * cfg.vocab_size)
    comps["lm_head"] = Cost(0, 0, head.flops) if cfg.tie_embeddings else head
    return Accounting(comps)
