"""GGUF files: the metadata, the tensors and the byte-level BPE tokenizer they carry.

GGUF is llama.cpp's single-file format (``gguf`` package, ``gguf.GGUFReader``): key/value
metadata (``general.*``, ``<arch>.*``, ``tokenizer.ggml.*``) and tensors, possibly quantised.
This module reads them without any model knowledge: :func:`open_gguf`, :func:`field`,
:func:`read_tensors` (every tensor dequantised to float32) and :func:`gguf_tokenizer`
(:class:`GGUFTokenizer`). The Llama loader built on them is
:func:`jaxlib_ext.models.llama.load_gguf`.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

__all__ = ["GGUFTokenizer", "gguf_tokenizer", "field", "f32_value", "open_gguf", "read_tensors"]


class GGUFTokenizer:
    """A byte-level BPE tokenizer rebuilt from GGUF metadata (``tokenizer.ggml.*``).

    ``encode(text) -> int32[N]`` (with ``bos_id`` first when ``add_bos``), ``decode(ids) ->
    str`` (special tokens skipped unless ``skip_special=False``); ``vocab_size``, ``bos_id``,
    ``eos_id``; ``tokenizer`` is the underlying ``tokenizers.Tokenizer``. Same interface as
    :class:`jaxlib_ext.core.data.ByteTokenizer`, so corpora tokenise with either.

    Args:
      tokenizer: the underlying ``tokenizers.Tokenizer``.
      vocab_size: the number of token ids.
      bos_id: the beginning-of-sequence id, or ``None``.
      eos_id: the end-of-sequence id, or ``None``.
      add_bos: whether :meth:`encode` puts ``bos_id`` first.
    """

    def __init__(self, tokenizer, *, vocab_size: int, bos_id: int | None, eos_id: int | None,
                 add_bos: bool = False):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text``, ``int32[N]`` (``bos_id`` first when ``add_bos``)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return np.asarray(ids, np.int32)

    def decode(self, ids, *, skip_special: bool = True) -> str:
        """The text of token ``ids`` (any shape, flattened).

        Args:
          ids: integer token ids.
          skip_special: whether to leave out special tokens.

        Returns:
          The decoded str.
        """
        return self.tokenizer.decode([int(i) for i in np.asarray(ids).ravel()],
                                     skip_special_tokens=skip_special)

    def token_strings(self) -> list[str]:
        """The vocabulary as strings in id order (for comparing two tokenizers)."""
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        out = [""] * self.vocab_size
        for s, i in vocab.items():
            if i < self.vocab_size:
                out[i] = s
        return out


# llama.cpp's pre-tokenizer names whose regex is "split every digit, then GPT-2's byte-level
# regex" (SmolLM2, StarCoder, ...); "gpt2"/"default" are GPT-2's regex alone.
_DIGIT_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
_GPT2_PRE = ("gpt2", "default", "gpt-2")


def field(reader, name, default=Any):
    """The value of a metadata key of an open ``gguf.GGUFReader``.

    Args:
      reader: the open ``gguf.GGUFReader``.
      name: the metadata key, e.g. ``"general.architecture"``.
      default: returned when the key is absent; without it an absent key raises.

    Returns:
      The key's contents.

    Raises:
      ValueError: if the key is absent and no ``default`` is given.
    """
    field = reader.fields.get(name)
    if field is None:
        if default is Any:
            raise ValueError(f"GGUF file lacks the metadata key {name!r}")
        return default
    return field.contents()


def gguf_tokenizer(reader) -> GGUFTokenizer:
    """The :class:`GGUFTokenizer` of an open ``gguf.GGUFReader``.

    It has the BPE vocabulary and merges (``tokenizer.ggml.tokens``, ``.merges``), the
    byte-level pre-tokeniser chosen by ``tokenizer.ggml.pre``, and control and user-defined
    tokens (``token_type`` 3, 4) as special tokens. Only byte-level BPE
    (``tokenizer.ggml.model == "gpt2"``) is supported.

    Args:
      reader: the open ``gguf.GGUFReader``.

    Returns:
      The :class:`GGUFTokenizer`.

    Raises:
      ValueError: for another tokenizer model, an unknown pre-tokeniser or a missing key.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"tokenizer.ggml.model {kind!r} is not supported (only byte-level BPE, 'gpt2')"
        )
    tokens = field(reader, "tokenizer.ggml.tokens")
    merges = field(reader, "tokenizer.ggml.merges", [])
    types = field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    pre = field(reader, "tokenizer.ggml.pre", "default")
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges], ignore_merges=False)
    tok = Tokenizer(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre in _GPT2_PRE:
        tok.pre_tokenizer = byte_level
    else:
        raise ValueError(
            f"tokenizer.ggml.pre {pre!r} is not supported; known: {_DIGIT_PRE + _GPT2_PRE}"
        )
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types, strict=True) if int(ty) in (3, 4)]
    tok.add_special_tokens(special)
    bos = field(reader, "tokenizer.ggml.bos_token_id", None)
    eos = field(reader, "tokenizer.ggml.eos_token_id", None)
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", False))
    return GGUFTokenizer(tok, vocab_size=len(tokens), bos_id=None if bos is None else int(bos),
                         eos_id=None if eos is None else int(eos), add_bos=add_bos)


def f32_value(value) -> float:
    """The shortest decimal of a float32 metadata value (``1e-05``, not ``9.9999997e-06``).

    Args:
      value: a float32 metadata value.

    Returns:
      The Python float of its shortest decimal.
    """
    return float(str(np.float32(value)))


def open_gguf(path):
    """Opens a GGUF file for reading.

    Args:
      path: the file's path.

    Returns:
      A ``gguf.GGUFReader``.

    Raises:
      FileNotFoundError: if the file does not exist.
      ValueError: if it is not a valid GGUF file.
    """
    import gguf

    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: GGUF file {str(path)!r} does not exist")
    try:
        return gguf.GGUFReader(str(path), "r")
    except Exception as e:  # bad magic, truncation, ... all mean "not a GGUF file"
        raise ValueError(f"path: {str(path)!r} is not a valid GGUF file ({e})") from e


def read_tensors(reader) -> dict[str, np.ndarray]:
    """Every tensor as float32 in row-major ``[rows, cols]`` (``[out, in]`` for weights).

    Args:
      reader: the open ``gguf.GGUFReader``.

    Returns:
      A dict from tensor names to dequantised NumPy float32 arrays.

    Raises:
      ValueError: for a tensor type that ``gguf.quants.dequantize`` does not support.
    """
    import gguf

    out = {}
    for t in reader.tensors:
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise ValueError(f"tensor {t.name}: {e}") from e
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        out[t.name] = np.asarray(w, np.float32).reshape(shape)
    return out
