"""The Transformer baseline: the ``attention + swiglu`` preset of the composable LM.

Pre-norm blocks of RMSNorm -> causal multi-head attention with RoPE -> residual, then
RMSNorm -> SwiGLU -> residual; untied input embedding and LM head (LLaMA-style,
Touvron et al. 2023, arXiv 2302.13971). The mixer and the attention function live in
:mod:`~jaxlib_ext.models.attention`; :func:`build_transformer` is :func:`build_lm` at a size of
:data:`TRANSFORMER_PRESETS`.
"""

from __future__ import annotations

from jaxlib_ext.models.attention import (
    TRANSFORMER_PRESETS,
    Attention,
    TransformerConfig,
    causal_attention,
)
from jaxlib_ext.models.lm import build_transformer

__all__ = [
    "TransformerConfig",
    "Attention",
    "TRANSFORMER_PRESETS",
    "build_transformer",
    "causal_attention",
]
