"""Text corpora, tokenizers and per-process batches.

The embedded default corpus is the English documentation that ships inside CPython
itself (``pydoc_data.topics``: the language reference topics behind ``help()``), so a
run needs no download and no extra package. ``load_corpus(path)`` reads a ``.txt`` file
or a folder of them instead.

Batches are a pure function of ``(seed, step)``: every process can compute the global
batch's row offsets, then materialises only the rows its devices hold and hands them to
:func:`jax.make_array_from_process_local_data`. Resuming at step ``s`` therefore sees the
same data an uninterrupted run would have seen.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import jax
import numpy as np

__all__ = [
    "ByteTokenizer",
    "Corpus",
    "load_corpus",
    "embedded_text",
    "unigram_entropy",
    "batch_offsets",
    "local_rows",
    "make_global_batch",
    "eval_batches",
]


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocabulary 256, lossless, no files to ship.

    Attributes:
      vocab_size: 256.
    """

    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        """The UTF-8 bytes of ``text`` as ``int32[N]`` token ids."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, tokens) -> str:
        """The text of byte ``tokens`` (invalid UTF-8 replaced by U+FFFD)."""
        return bytes(np.asarray(tokens, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")


def embedded_text() -> str:
    """The documentation topics shipped with CPython, in a fixed (sorted) order."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[name] for name in sorted(topics.topics))


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A tokenised corpus split deterministically into train and eval token arrays.

    Attributes:
      train: the training token ids.
      eval: the held-out token ids.
      vocab_size: the tokenizer's vocabulary size.
      source: where the text came from (a path, or a name such as
        ``"embedded:pydoc_data.topics"``).
    """

    train: np.ndarray
    eval: np.ndarray
    vocab_size: int
    source: str

    @property
    def num_tokens(self) -> int:
        """Train plus eval tokens."""
        return int(self.train.size + self.eval.size)


def _read_path(path: pathlib.Path) -> str:
    if not path.exists():
        raise FileNotFoundError(
            f"path: {str(path)!r} does not exist; pass a .txt file or a folder of .txt "
            "files, or none for the embedded corpus"
        )
    if path.is_file():
        return path.read_text(encoding="utf-8", errors="replace")
    files = sorted(path.rglob("*.txt"))
    if not files:
        raise FileNotFoundError(f"path: folder {str(path)!r} holds no .txt files")
    return "\n\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


def load_corpus(
    path: str | pathlib.Path | None = None,
    *,
    eval_fraction: float = 0.05,
    tokenizer: ByteTokenizer | None = None,
) -> Corpus:
    """Loads and tokenises a corpus; the last ``eval_fraction`` of tokens is held out.

    Args:
      path: a ``.txt`` file or a folder searched recursively for ``.txt`` files; ``None``
        uses :func:`embedded_text`.
      eval_fraction: fraction of tokens (taken from the end) kept for evaluation, in
        ``(0, 1)``.
      tokenizer: defaults to :class:`ByteTokenizer`.

    Returns:
      The :class:`Corpus`.

    Raises:
      ValueError: if ``eval_fraction`` is not in ``(0, 1)``.
      FileNotFoundError: if ``path`` does not exist or a folder holds no ``.txt`` files.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    tokenizer = tokenizer or ByteTokenizer()
    if path is None:
        text, source = embedded_text(), "embedded:pydoc_data.topics"
    else:
        text, source = _read_path(pathlib.Path(path)), str(path)
    tokens = tokenizer.encode(text)
    split = int(len(tokens) * (1.0 - eval_fraction))
    return Corpus(tokens[:split], tokens[split:], tokenizer.vocab_size, source)


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Entropy (nats) of the token frequencies: the loss of the best context-free model.

    Args:
      tokens: token ids, any shape.
      vocab_size: the vocabulary size.

    Returns:
      The entropy, a float.
    """
    counts = np.bincount(np.asarray(tokens).ravel(), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def batch_offsets(seed: int, step: int, batch_size: int, seq_len: int, n_tokens: int):
    """Start offsets of the training windows of a step (global, all rows).

    A pure function of ``(seed, step)``.

    Args:
      seed: the run's seed.
      step: the 0-based step.
      batch_size: the windows per step.
      seq_len: tokens per window before the one extra target token.
      n_tokens: the training split's length.

    Returns:
      ``int64[batch_size]`` offsets in ``[0, n_tokens - seq_len - 1)``.

    Raises:
      ValueError: if the split has at most ``seq_len + 1`` tokens.
    """
    high = n_tokens - seq_len - 1
    if high <= 0:
        raise ValueError(
            f"seq_len: {seq_len} needs a corpus of more than {seq_len + 1} tokens, "
            f"the training split has {n_tokens}"
        )
    rng = np.random.default_rng([seed, step])
    return rng.integers(0, high, size=batch_size)


def local_rows(sharding: jax.sharding.Sharding, global_shape: tuple[int, ...]) -> slice:
    """The contiguous range of batch rows that this process's devices hold.

    Args:
      sharding: the batch's sharding.
      global_shape: the global batch's shape.

    Returns:
      The slice of rows.
    """
    idx = sharding.addressable_devices_indices_map(global_shape).values()
    starts = [(i[0].start or 0) for i in idx]
    stops = [global_shape[0] if i[0].stop is None else i[0].stop for i in idx]
    return slice(min(starts), max(stops))


def _windows(tokens: np.ndarray, offsets: np.ndarray, seq_len: int) -> np.ndarray:
    return tokens[offsets[:, None] + np.arange(seq_len + 1)[None, :]]


def make_global_batch(
    tokens: np.ndarray,
    offsets: np.ndarray,
    seq_len: int,
    sharding: jax.sharding.Sharding,
) -> jax.Array:
    """A global batch built from this process's rows only.

    Args:
      tokens: the token array the windows are cut from.
      offsets: ``[B]`` global window offsets (:func:`batch_offsets`).
      seq_len: tokens per window before the one extra target token.
      sharding: the batch's sharding.

    Returns:
      The global ``[B, seq_len + 1]`` array in ``tokens``' dtype.
    """
    shape = (len(offsets), seq_len + 1)
    rows = local_rows(sharding, shape)
    local = _windows(tokens, offsets[rows], seq_len)
    return jax.make_array_from_process_local_data(sharding, local, shape)


def eval_batches(
    tokens: np.ndarray, batch_size: int, seq_len: int, max_batches: int = 8
) -> list[np.ndarray]:
    """Deterministic, evenly spaced global eval offsets.

    Args:
      tokens: the eval split.
      batch_size: windows per eval batch.
      seq_len: tokens per window before the one extra target token.
      max_batches: the most eval batches.

    Returns:
      A list of offset arrays ``[batch_size]``, one per eval batch (at least one).

    Raises:
      ValueError: if the split is too short for one window.
    """
    n_windows = max(1, (len(tokens) - 1) // (seq_len + 1))
    total = min(n_windows, batch_size * max_batches)
    n_batches = max(1, math.floor(total / batch_size))
    starts = np.arange(n_batches * batch_size) % n_windows * (seq_len + 1)
    if starts.max() + seq_len + 1 > len(tokens):
        raise ValueError(
            f"seq_len: the eval split ({len(tokens)} tokens) is too short for windows of "
            f"{seq_len + 1}"
        )
    return [starts[i * batch_size : (i + 1) * batch_size] for i in range(n_batches)]
