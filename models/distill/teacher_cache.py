"""The teacher's activations and top-k next-token distributions, computed once and kept on disk.

Both distillation stages of arXiv 2603.15590 read only the frozen teacher's outputs on fixed
token windows: stage I its attention layers' inputs and outputs, stage II its top-k
log-probabilities. :func:`build_teacher_cache` runs the teacher once over ``windows int32[N,
T + 1]`` and writes, in one folder, ``.npy`` arrays read back as memory maps:

* ``tokens.npy`` ``int32[N, T + 1]`` (the model reads ``[:, :T]``; position ``t`` predicts
  token ``t + 1``);
* ``top_log_probs.npy`` ``float32[N, T, k]`` and ``top_ids.npy`` ``int32[N, T, k]``
  (:func:`~jaxlib_ext.models.distill.losses.top_k_log_probs` of the teacher's logits);
* ``layer_XXX_in.npy`` and ``layer_XXX_out.npy`` ``[N, T, dim]`` in ``dtype`` for each chosen
  layer (:meth:`~jaxlib_ext.models.LanguageModel.mixer_io`);
* ``meta.json``, written last: the settings (:class:`CacheSpec`) and ``complete: true``.

A folder without a complete ``meta.json`` (an interrupted build) is rebuilt; a complete one is
reused when its settings, teacher and tokenizer fingerprints are the requested ones, and refused
with a ``ValueError`` naming the difference otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlib_ext.models.distill.losses import top_k_log_probs

__all__ = [
    "CacheSpec",
    "TeacherCache",
    "build_teacher_cache",
    "make_windows",
    "model_fingerprint",
    "tokenizer_fingerprint",
]

CACHE_DTYPES = ("float32", "float16")


def make_windows(tokens: np.ndarray, n_sequences: int, seq_len: int) -> np.ndarray:
    """Non-overlapping windows spread evenly over a token array.

    Args:
      tokens: ``[L]`` token ids.
      n_sequences: the number of windows, positive.
      seq_len: tokens per window before the one extra target token, positive.

    Returns:
      ``int32[n_sequences, seq_len + 1]``.

    Raises:
      ValueError: if a count is not positive or ``tokens`` is too short for the windows.
    """
    tokens = np.asarray(tokens)
    width = seq_len + 1
    available = len(tokens) // width
    if n_sequences < 1 or seq_len < 1:
        raise ValueError(f"n_sequences and seq_len must be positive, got {n_sequences}, {seq_len}")
    if available < n_sequences:
        raise ValueError(
            f"n_sequences: {n_sequences} windows of {width} tokens need "
            f"{n_sequences * width} tokens, the text has {len(tokens)}"
        )
    starts = (np.arange(n_sequences) * available // n_sequences) * width
    return np.stack([tokens[s : s + width] for s in starts]).astype(np.int32)


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the vocabulary (token strings in id order when the tokenizer lists them).

    Args:
      tokenizer: a tokenizer with ``vocab_size`` and optionally ``token_strings()``.

    Returns:
      16 hex digits of a SHA-256 (of the type name and size without ``token_strings``).
    """
    if hasattr(tokenizer, "token_strings"):
        text = "\n".join(tokenizer.token_strings())
    else:
        text = f"{type(tokenizer).__name__}:{tokenizer.vocab_size}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def model_fingerprint(model) -> str:
    """A hash of a model's configuration and a sample of its parameters.

    Args:
      model: an NNX model (its ``cfg`` when it has one, and the first 64 values of each
        ``nnx.Param``).

    Returns:
      16 hex digits of a SHA-256.
    """
    h = hashlib.sha256(repr(getattr(model, "cfg", type(model).__name__)).encode())
    for _, value in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        h.update(np.asarray(value[...], np.float32).ravel()[:64].tobytes())
    return h.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    """The settings a teacher cache was built with.

    Attributes:
      n_sequences: the cached windows ``N``.
      seq_len: the tokens ``T`` the model reads per window.
      top_k: the teacher's log-probabilities kept per position.
      layers: the cached attention layers.
      dim: the teacher's model width.
      vocab_size: the teacher's vocabulary size.
      dtype: the storage dtype of the layer activations.
      teacher: the teacher's :func:`model_fingerprint`.
      tokenizer: the tokenizer's :func:`tokenizer_fingerprint`.
      windows: 16 hex digits of a SHA-256 of the token windows.
    """

    n_sequences: int
    seq_len: int
    top_k: int
    layers: tuple[int, ...]
    dim: int
    vocab_size: int
    dtype: str
    teacher: str  # model_fingerprint
    tokenizer: str  # tokenizer_fingerprint
    windows: str  # hash of the token windows

    def to_json(self) -> dict:
        """The fields as a JSON-ready dict (``layers`` as a list)."""
        d = dataclasses.asdict(self)
        d["layers"] = list(self.layers)
        return d

    @classmethod
    def from_json(cls, d: dict) -> CacheSpec:
        """The spec of a :meth:`to_json` dict ``d``."""
        return cls(**{**d, "layers": tuple(d["layers"])})


class TeacherCache:
    """A complete cache folder (module docstring), arrays opened as read-only memory maps.

    ``len(cache)`` is the number of windows; ``spec`` is the :class:`CacheSpec`; ``tokens``,
    ``top_log_probs`` and ``top_ids`` are the memory-mapped arrays.

    Args:
      directory: the cache folder.

    Raises:
      FileNotFoundError: if ``directory`` holds no complete cache.
    """

    def __init__(self, directory: str | pathlib.Path):
        self.directory = pathlib.Path(directory)
        meta = _read_meta(self.directory)
        if meta is None:
            raise FileNotFoundError(f"no complete teacher cache in {str(self.directory)!r}")
        self.spec = CacheSpec.from_json(meta["spec"])
        self.tokens = self._load("tokens")
        self.top_log_probs = self._load("top_log_probs")
        self.top_ids = self._load("top_ids")

    def _load(self, name):
        return np.load(self.directory / f"{name}.npy", mmap_mode="r")

    def __len__(self) -> int:
        return self.spec.n_sequences

    def layer_io(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """The memory-mapped inputs and outputs of a layer's attention.

        Args:
          layer: a cached layer index.

        Returns:
          ``(inputs, outputs)``, each ``[N, T, dim]`` in the cache's dtype.

        Raises:
          ValueError: if ``layer`` is not cached.
        """
        if layer not in self.spec.layers:
            raise ValueError(f"layer {layer} is not cached (cached: {list(self.spec.layers)})")
        return self._load(f"layer_{layer:03d}_in"), self._load(f"layer_{layer:03d}_out")


def _read_meta(directory: pathlib.Path) -> dict | None:
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return meta if meta.get("complete") else None


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _teacher_outputs(graphdef, state, tokens, layers, top_k):
    model = nnx.merge(graphdef, state)
    io, logits = model.mixer_io(tokens, with_logits=True)
    values, ids = top_k_log_probs(logits, top_k)
    return [io[i] for i in layers], values, ids


def build_teacher_cache(model, tokenizer, windows: np.ndarray, directory: str | pathlib.Path, *,
                        top_k: int, layers=None, dtype: str = "float32", batch_size: int = 4,
                        progress: bool = True, desc: str = "teacher cache") -> TeacherCache:
    """Runs the teacher over token windows and writes the cache folder (module docstring).

    A complete folder with the same settings is reused as is.

    Args:
      model: the teacher, a Llama :class:`~jaxlib_ext.models.LanguageModel`.
      tokenizer: its tokenizer (for the fingerprint; same vocabulary size as ``model``).
      windows: ``int32[N, T + 1]`` token windows, ``T >= 1``, ids in ``[0, vocab_size)``.
      directory: the cache folder.
      top_k: the log-probabilities kept per position.
      layers: the attention layers whose inputs and outputs are kept; ``None`` means all.
      dtype: their storage type, ``"float32"`` or ``"float16"``.
      batch_size: windows per teacher call.
      progress: whether to show a progress bar.
      desc: the progress bar's label.

    Returns:
      The :class:`TeacherCache`.

    Raises:
      ValueError: if ``windows``, ``dtype`` or ``layers`` is invalid, the tokenizer's
        vocabulary differs from the model's, or ``directory`` holds a complete cache of other
        settings.
    """
    windows = np.asarray(windows)
    if windows.ndim != 2 or windows.shape[1] < 2 or not np.issubdtype(windows.dtype, np.integer):
        raise ValueError(f"windows: expected integer [N, T + 1] with T >= 1, got {windows.shape}")
    if dtype not in CACHE_DTYPES:
        raise ValueError(f"dtype must be one of {CACHE_DTYPES}, got {dtype!r}")
    cfg = model.cfg
    if tokenizer.vocab_size != cfg.vocab_size:
        raise ValueError(
            f"tokenizer: vocabulary of {tokenizer.vocab_size} tokens, the teacher has "
            f"{cfg.vocab_size}"
        )
    if windows.max() >= cfg.vocab_size or windows.min() < 0:
        raise ValueError(f"windows: token ids must be in [0, {cfg.vocab_size})")
    layers = tuple(range(cfg.n_layers)) if layers is None else tuple(int(i) for i in layers)
    if any(not 0 <= i < cfg.n_layers for i in layers):
        raise ValueError(f"layers: expected indices in [0, {cfg.n_layers}), got {list(layers)}")
    n, width = windows.shape
    spec = CacheSpec(
        n_sequences=n, seq_len=width - 1, top_k=int(top_k), layers=layers, dim=cfg.d_model,
        vocab_size=cfg.vocab_size, dtype=dtype, teacher=model_fingerprint(model),
        tokenizer=tokenizer_fingerprint(tokenizer),
        windows=hashlib.sha256(windows.astype(np.int32).tobytes()).hexdigest()[:16],
    )
    directory = pathlib.Path(directory)
    meta = _read_meta(directory)
    if meta is not None:
        have = CacheSpec.from_json(meta["spec"])
        if have != spec:
            diff = {k: (getattr(have, k), getattr(spec, k)) for k in spec.to_json()
                    if getattr(have, k) != getattr(spec, k)}
            raise ValueError(
                f"teacher cache {str(directory)!r} was built with other settings "
                f"(field: (cached, requested)) {diff}; use another folder or delete it"
            )
        return TeacherCache(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "meta.json").unlink(missing_ok=True)
    t = width - 1

    def open_(name, shape, dt):
        return np.lib.format.open_memmap(directory / f"{name}.npy", mode="w+", dtype=dt,
                                         shape=shape)

    tokens_out = open_("tokens", (n, width), np.int32)
    tokens_out[:] = windows
    lp_out = open_("top_log_probs", (n, t, spec.top_k), np.float32)
    id_out = open_("top_ids", (n, t, spec.top_k), np.int32)
    io_out = [(open_(f"layer_{i:03d}_in", (n, t, cfg.d_model), dtype),
               open_(f"layer_{i:03d}_out", (n, t, cfg.d_model), dtype)) for i in layers]
    graphdef, state = nnx.split(model)
    starts = range(0, n, batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=desc, unit="batch")
    for s in starts:
        batch = jnp.asarray(windows[s : s + batch_size, :t], jnp.int32)
        io, values, ids = _teacher_outputs(graphdef, state, batch, layers, spec.top_k)
        lp_out[s : s + len(batch)] = np.asarray(values)
        id_out[s : s + len(batch)] = np.asarray(ids)
        for (x_out, y_out), (x, y) in zip(io_out, io, strict=True):
            x_out[s : s + len(batch)] = np.asarray(x, dtype)
            y_out[s : s + len(batch)] = np.asarray(y, dtype)
    for arr in (tokens_out, lp_out, id_out, *[a for pair in io_out for a in pair]):
        arr.flush()
    del tokens_out, lp_out, id_out, io_out
    (directory / "meta.json").write_text(
        json.dumps({"spec": spec.to_json(), "complete": True}, indent=1)
    )
    return TeacherCache(directory)
