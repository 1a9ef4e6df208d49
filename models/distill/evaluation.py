"""The task suite of a distilled student against its teacher, and the Win-and-Tie metric.

Every model is a plain callable ``model(tokens int32[B, T]) -> logits [B, T, V]`` (a tuple's
first element is taken, so a :class:`~jaxlib_ext.models.LanguageModel` is accepted as it is;
:func:`logits_fn` turns an NNX model into a compiled one). Tasks, per held-out domain:

* ``next_token_accuracy``: argmax next-token accuracy on held-out windows (teacher forcing);
* ``perplexity``: ``exp`` of the mean next-token negative log-likelihood on the same windows
  (lower is better);
* ``cloze``: last-word cloze (LAMBADA-style): a passage cut right after a word of at least
  three letters that follows a single space; the item is solved when every token of the space
  and the word is the argmax prediction given the passage before them (:func:`cloze_items`);
* ``greedy_agreement``: greedy continuations of held-out prompts by each model; the score is
  the mean fraction of the continuation's tokens before the first token that differs from the
  teacher's continuation (the teacher scores 1 by definition).

**Win-and-Tie rate** (Hauzenberger et al., arXiv 2603.15590). Over tasks ``i`` with scores
``s_i`` (student) and ``t_i`` (teacher), higher is better::

    C_alpha = (1 / n) #{ i : s_i >= t_i - alpha }               (absolute tolerance)
    C_alpha = (1 / n) #{ i : s_i >= t_i - alpha |t_i| }         (relative tolerance)

and the critical tolerance ``alpha*`` is the smallest ``alpha >= 0`` with ``C_alpha >=
target``. Ties count as wins (``>=``), so ``C_0`` is the fraction of tasks the student wins or
ties, and ``C_alpha`` is non-decreasing in ``alpha``. With per-task gaps ``d_i = max(0, t_i -
s_i)`` (relative: ``d_i / |t_i|``), ``C_alpha = #{d_i <= alpha} / n``, so ``alpha*`` is the
``ceil(target n)``-th smallest gap; with ``target = 1`` (lossless on every task) it is
``max_i d_i``.

Choices where the paper is not specific (its exact definitions are not public): ``alpha`` is
given both absolute (accuracy points as fractions, the default) and relative to the teacher's
score; ``target`` defaults to 1. Scores enter ``C_alpha`` only for tasks whose score is an
accuracy in ``[0, 1]`` (``next_token_accuracy``, ``cloze``, ``greedy_agreement``), so that an
absolute ``alpha`` has one unit; perplexity is reported beside them, not counted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "TASKS",
    "WIN_AND_TIE_TASKS",
    "ClozeItems",
    "SuiteConfig",
    "TaskScore",
    "SuiteReport",
    "logits_fn",
    "next_token_metrics",
    "cloze_items",
    "cloze_accuracy",
    "cloze_texts",
    "greedy_continuations",
    "continuation_agreement",
    "tolerance_gaps",
    "win_and_tie_rate",
    "critical_tolerance",
    "evaluate_suite",
    "summarize",
]

#: The per-domain tasks, in table order.
TASKS = ("next_token_accuracy", "perplexity", "cloze", "greedy_agreement")
#: The tasks whose scores (accuracies in [0, 1]) enter ``C_alpha``.
WIN_AND_TIE_TASKS = ("next_token_accuracy", "cloze", "greedy_agreement")


# --------------------------------------------------------------------------- models


def _logits(model: Callable, tokens) -> jax.Array:
    out = model(jnp.asarray(tokens, jnp.int32))
    return out[0] if isinstance(out, tuple) else out


def logits_fn(model) -> Callable[[jax.Array], jax.Array]:
    """A compiled ``tokens -> logits`` of an NNX model.

    The parameters are an argument of the compiled function (not constants folded into it),
    so compiling a 100M-parameter model stays cheap.

    Args:
      model: an NNX model whose call returns logits or a tuple ``(logits, ...)``.

    Returns:
      A function ``tokens int[B, T] -> logits [B, T, V]`` over the model's current state.
    """
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, tokens):
        out = nnx.merge(graphdef, state)(tokens)
        return out[0] if isinstance(out, tuple) else out

    return lambda tokens: forward(state, jnp.asarray(tokens, jnp.int32))


def _batches(rows: np.ndarray, batch_size: int):
    """``rows`` in batches of exactly ``batch_size`` (the last one padded by repeating its first
    row, so every call has one shape); yields ``(batch, n_real)``."""
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        n = len(batch)
        if n < batch_size:
            batch = np.concatenate([batch, np.repeat(batch[:1], batch_size - n, axis=0)])
        yield batch, n


# --------------------------------------------------------------------------- tasks


def next_token_metrics(model: Callable, windows, *, batch_size: int = 8) -> dict[str, float]:
    """Next-token accuracy, mean negative log-likelihood and perplexity of a model.

    Args:
      model: a callable ``tokens [B, T] -> logits [B, T, V]`` (or a tuple of them first).
      windows: ``int[N, T]`` token windows, ``T >= 2``; the targets are tokens ``1 .. T-1``
        of each window.
      batch_size: windows per call (the last batch padded).

    Returns:
      ``{"accuracy", "nll", "perplexity"}`` as floats (``nll`` in nats, ``perplexity =
      exp(nll)``).

    Raises:
      ValueError: if ``windows`` is not integer ``[N, T]`` with ``T >= 2``.
    """
    windows = _check_tokens("windows", windows, min_len=2)
    correct = nll = count = 0.0
    for batch, n in _batches(windows, batch_size):
        logits = _logits(model, batch)[:, :-1].astype(jnp.float32)
        targets = jnp.asarray(batch[:, 1:])
        logp = jax.nn.log_softmax(logits, axis=-1)
        token_nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        nll += float(np.asarray(token_nll[:n], np.float64).sum())
        correct += float(np.sum(np.asarray(jnp.argmax(logits, -1) == targets)[:n]))
        count += n * targets.shape[1]
    mean_nll = nll / count
    return {"accuracy": correct / count, "nll": mean_nll, "perplexity": math.exp(mean_nll)}


@dataclasses.dataclass(frozen=True)
class ClozeItems:
    """Last-word cloze items, right-padded; ``len(items)`` is ``N``.

    Attributes:
      tokens: ``int32[N, L]``, the passage then the last word, zeros after.
      target: ``bool[N, L]``, True at the last word's tokens.
    """

    tokens: np.ndarray
    target: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)


_WORD = re.compile(r"(?<=\S )[A-Za-z]{3,}\b")  # after one space that follows a non-space


def cloze_items(text: str, tokenizer, *, n_items: int = 32, context_chars: int = 400,
                max_tokens: int = 128) -> ClozeItems:
    """Up to ``n_items`` last-word cloze items cut from ``text``.

    Candidate last words are words of at least three ASCII letters after a single space, each
    with ``context_chars`` characters of text before it; ``n_items`` of them are taken evenly
    spaced through the text. The target is the space and the word (byte-level BPE tokenisers
    attach a word's leading space to it); an item is kept when the tokenisation of the passage
    starts with the tokenisation of the passage without them (so the target's tokens are well
    defined); the context is cut from the left to fit ``max_tokens``.

    Args:
      text: the held-out text.
      tokenizer: anything with ``encode(str) -> ids``.
      n_items: the most items, ``>= 1``.
      context_chars: characters of text before each last word, ``>= 1``.
      max_tokens: the most tokens per item, ``>= 2``.

    Returns:
      The :class:`ClozeItems`.

    Raises:
      ValueError: if a size is out of range or no item can be made.
    """
    if n_items < 1 or max_tokens < 2 or context_chars < 1:
        raise ValueError(
            f"n_items, context_chars must be >= 1 and max_tokens >= 2, got {n_items}, "
            f"{context_chars}, {max_tokens}"
        )
    starts = [m for m in _WORD.finditer(text) if m.start() >= context_chars]
    if not starts:
        raise ValueError(f"text: no word with {context_chars} characters of context before it")
    picks = np.unique(np.linspace(0, len(starts) - 1, min(n_items, len(starts))).astype(int))
    rows = []
    for i in picks:
        m = starts[i]
        context = text[m.start() - context_chars : m.start() - 1]  # without the space
        ids_ctx = list(np.asarray(tokenizer.encode(context)).tolist())
        ids_full = list(np.asarray(tokenizer.encode(context + " " + m.group())).tolist())
        if ids_full[: len(ids_ctx)] != ids_ctx or len(ids_full) == len(ids_ctx):
            continue
        word = ids_full[len(ids_ctx) :]
        if len(word) >= max_tokens:
            continue
        ctx = ids_ctx[-(max_tokens - len(word)) :]
        if not ctx:
            continue
        rows.append((ctx, word))
    if not rows:
        raise ValueError("text: no cloze item survives tokenisation")
    length = max(len(c) + len(w) for c, w in rows)
    tokens = np.zeros((len(rows), length), np.int32)
    target = np.zeros((len(rows), length), bool)
    for r, (ctx, word) in enumerate(rows):
        tokens[r, : len(ctx) + len(word)] = ctx + word
        target[r, len(ctx) : len(ctx) + len(word)] = True
    return ClozeItems(tokens, target)


def cloze_texts(texts: Mapping[str, str], tokenizer, config: SuiteConfig | None = None
                ) -> dict[str, str]:
    """The entries of ``texts`` that yield at least one cloze item (:func:`cloze_items`).

    This is what :func:`evaluate_suite` takes as ``held_out_text``. Code and other text
    without such items is left out, not an error.

    Args:
      texts: domain name -> held-out text.
      tokenizer: anything with ``encode(str) -> ids``.
      config: the suite's sizes; ``None`` means ``SuiteConfig()``.

    Returns:
      The kept entries, domain name -> text.
    """
    c = SuiteConfig() if config is None else config
    kept = {}
    for name, text in texts.items():
        try:
            cloze_items(text, tokenizer, n_items=c.cloze_items,
                        context_chars=c.cloze_context_chars, max_tokens=c.cloze_max_tokens)
        except ValueError:
            continue
        kept[name] = text
    return kept


def cloze_accuracy(model: Callable, items: ClozeItems, *, batch_size: int = 8) -> float:
    """Fraction of :class:`ClozeItems` whose every last-word token is the argmax prediction
    from the tokens before it (teacher forcing).

    Args:
      model: a callable ``tokens [B, T] -> logits [B, T, V]``.
      items: the cloze items.
      batch_size: items per call.

    Returns:
      The accuracy, a float in ``[0, 1]``.
    """
    solved = 0
    both = np.concatenate([items.tokens, items.target.astype(np.int32)], axis=1)
    length = items.tokens.shape[1]
    for batch, n in _batches(both, batch_size):
        tokens, target = batch[:, :length], batch[:, length:].astype(bool)
        pred = np.asarray(jnp.argmax(_logits(model, tokens), -1))  # pred[:, j]: token j + 1
        hit = (pred[:, :-1] == tokens[:, 1:]) | ~target[:, 1:]
        solved += int(hit[:n].all(axis=1).sum())
    return solved / len(items)


def greedy_continuations(model: Callable, prompts, n_new: int, *, batch_size: int = 8
                         ) -> np.ndarray:
    """Greedy continuations of prompts, one full forward of a fixed-size buffer per new token.

    Any causal callable works; no decode cache is needed.

    Args:
      model: a causal callable ``tokens [B, T] -> logits [B, T, V]``.
      prompts: ``int[N, P]`` prompts, ``P >= 1``.
      n_new: the new tokens per prompt, a positive int.
      batch_size: prompts per call.

    Returns:
      ``int32[N, n_new]``.

    Raises:
      ValueError: if ``prompts`` is not integer ``[N, P]`` or ``n_new`` is not a positive int.
    """
    prompts = _check_tokens("prompts", prompts, min_len=1)
    if not isinstance(n_new, int) or n_new < 1:
        raise ValueError(f"n_new must be a positive int, got {n_new!r}")
    p = prompts.shape[1]
    out = []
    for batch, n in _batches(prompts, batch_size):
        buf = np.concatenate([batch, np.zeros((len(batch), n_new), np.int32)], axis=1)
        for i in range(n_new):
            buf[:, p + i] = np.asarray(jnp.argmax(_logits(model, buf)[:, p + i - 1], -1))
        out.append(buf[:n, p:])
    return np.concatenate(out).astype(np.int32)


def continuation_agreement(continuations, reference) -> float:
    """Mean over rows of (length of the common prefix of the two continuations) / length.

    Args:
      continuations: ``[N, n]`` token ids.
      reference: ``[N, n]`` token ids.

    Returns:
      The agreement, a float in ``[0, 1]``.

    Raises:
      ValueError: if the two are not equal-shaped ``[N, n]`` arrays.
    """
    a, b = np.asarray(continuations), np.asarray(reference)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"continuations {a.shape} and reference {b.shape} must be equal [N, n]")
    differ = a != b
    first = np.where(differ.any(axis=1), differ.argmax(axis=1), a.shape[1])
    return float(np.mean(first / a.shape[1]))


# --------------------------------------------------------------------------- Win-and-Tie


def tolerance_gaps(student, teacher, *, relative: bool = False) -> np.ndarray:
    """Per-task gaps ``d_i = max(0, t_i - s_i)``; ``C_alpha = #{d_i <= alpha} / n`` (module
    docstring).

    Args:
      student: ``[n]`` finite student scores, higher is better.
      teacher: ``[n]`` finite teacher scores.
      relative: divide the gaps by ``|t_i|`` (a zero teacher score gives 0 when the student
        ties or wins, ``inf`` otherwise).

    Returns:
      ``float64[n]`` gaps.

    Raises:
      ValueError: if the scores are not finite non-empty vectors of one length.
    """
    s, t = _scores(student, teacher)
    deficit = np.maximum(t - s, 0.0)
    if not relative:
        return deficit
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = deficit / np.abs(t)
    return np.where(deficit == 0.0, 0.0, np.where(t == 0.0, np.inf, gap))


def win_and_tie_rate(student, teacher, alpha: float, *, relative: bool = False) -> float:
    """``C_alpha``: the fraction of tasks with ``s_i >= t_i - alpha`` (module docstring).

    Args:
      student: ``[n]`` student scores, higher is better.
      teacher: ``[n]`` teacher scores.
      alpha: the tolerance, finite and ``>= 0``.
      relative: use ``s_i >= t_i - alpha |t_i|``.

    Returns:
      ``C_alpha``, a float in ``[0, 1]``.

    Raises:
      ValueError: if ``alpha`` is out of range, or as :func:`tolerance_gaps`.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590.
    """
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
    return float(np.mean(tolerance_gaps(student, teacher, relative=relative) <= alpha))


def critical_tolerance(student, teacher, *, relative: bool = False, target: float = 1.0
                       ) -> float:
    """``alpha*``: the smallest ``alpha >= 0`` with ``C_alpha >= target``, i.e. the
    ``ceil(target n)``-th smallest per-task gap (module docstring).

    Args:
      student: ``[n]`` student scores, higher is better.
      teacher: ``[n]`` teacher scores.
      relative: use relative gaps (:func:`tolerance_gaps`).
      target: the required ``C_alpha``, in ``(0, 1]``.

    Returns:
      ``alpha*``, a float (``inf`` possible with relative gaps).

    Raises:
      ValueError: if ``target`` is out of range, or as :func:`tolerance_gaps`.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590.
    """
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target must be in (0, 1], got {target}")
    gaps = np.sort(tolerance_gaps(student, teacher, relative=relative))
    k = max(1, math.ceil(target * len(gaps) - 1e-9))
    return float(gaps[k - 1])


def _scores(student, teacher):
    s = np.asarray(student, np.float64)
    t = np.asarray(teacher, np.float64)
    if s.ndim != 1 or s.shape != t.shape or s.size == 0:
        raise ValueError(
            f"student and teacher must be non-empty score vectors of one length, got "
            f"{s.shape} and {t.shape}"
        )
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))):
        raise ValueError("student and teacher scores must be finite")
    return s, t


# --------------------------------------------------------------------------- the suite


@dataclasses.dataclass(frozen=True)
class SuiteConfig:
    """Sizes of the suite.

    Attributes:
      seq_len: tokens per next-token window, ``>= 2``.
      n_windows: next-token windows evenly spaced through each domain's held-out tokens.
      batch_size: rows per model call.
      cloze_items: the most cloze items per domain.
      cloze_context_chars: characters of context before each cloze word.
      cloze_max_tokens: the most tokens per cloze item.
      n_prompts: greedy prompts per domain.
      prompt_len: tokens per greedy prompt.
      n_new: new tokens per greedy continuation.
      alphas: the tolerances at which ``C_alpha`` is reported (absolute and relative), finite
        and ``>= 0``.
      target: the ``C_alpha`` that ``alpha*`` must reach, in ``(0, 1]``.

    Raises:
      ValueError: if a size is not a positive int (``seq_len >= 2``), or ``alphas`` or
        ``target`` is out of range.
    """

    seq_len: int = 128
    n_windows: int = 16
    batch_size: int = 8
    cloze_items: int = 32
    cloze_context_chars: int = 400
    cloze_max_tokens: int = 128
    n_prompts: int = 8
    prompt_len: int = 32
    n_new: int = 16
    alphas: tuple[float, ...] = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1)
    target: float = 1.0

    def __post_init__(self):
        for name in ("seq_len", "n_windows", "batch_size", "cloze_items", "cloze_context_chars",
                     "cloze_max_tokens", "n_prompts", "prompt_len", "n_new"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SuiteConfig.{name} must be a positive int, got {value!r}")
        if self.seq_len < 2:
            raise ValueError(f"SuiteConfig.seq_len must be >= 2, got {self.seq_len}")
        if not self.alphas or any(not (np.isfinite(a) and a >= 0) for a in self.alphas):
            raise ValueError(f"SuiteConfig.alphas must be finite numbers >= 0, got {self.alphas}")
        if not 0.0 < self.target <= 1.0:
            raise ValueError(f"SuiteConfig.target must be in (0, 1], got {self.target}")


@dataclasses.dataclass(frozen=True)
class TaskScore:
    """One row of the suite.

    Attributes:
      domain: the domain's name.
      task: a task of :data:`TASKS`.
      teacher: the teacher's score.
      student: the student's score.
      higher_is_better: whether a higher score is better (False for perplexity).
    """

    domain: str
    task: str
    teacher: float
    student: float
    higher_is_better: bool = True

    @property
    def difference(self) -> float:
        """``student - teacher``."""
        return self.student - self.teacher


@dataclasses.dataclass(frozen=True)
class SuiteReport:
    """The suite's rows and the Win-and-Tie summary over the rows of :data:`WIN_AND_TIE_TASKS`.

    Attributes:
      rows: the :class:`TaskScore` rows.
      c_alpha: ``c_alpha[kind][alpha]``, ``kind`` ``"absolute"`` or ``"relative"``.
      alpha_star: ``alpha_star[kind]``.
      target: the ``C_alpha`` that ``alpha*`` reaches.
    """

    rows: tuple[TaskScore, ...]
    c_alpha: dict
    alpha_star: dict
    target: float

    def to_dict(self) -> dict:
        """The report as a JSON-ready dict (rows with their difference, the summary)."""
        return {
            "rows": [dict(dataclasses.asdict(r), difference=r.difference) for r in self.rows],
            "c_alpha": {k: {str(a): c for a, c in v.items()} for k, v in self.c_alpha.items()},
            "alpha_star": dict(self.alpha_star),
            "target": self.target,
            "win_and_tie_tasks": list(WIN_AND_TIE_TASKS),
        }

    def save_json(self, path) -> pathlib.Path:
        """Writes :meth:`to_dict` as JSON to ``path`` (parents created); returns the path."""
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def to_markdown(self) -> str:
        """The rows and the ``C_alpha`` / ``alpha*`` summary as markdown tables."""
        lines = [
            "| domain | task | teacher | student | student - teacher |",
            "|---|---|---:|---:|---:|",
        ]
        for r in self.rows:
            note = "" if r.higher_is_better else " (lower is better)"
            lines.append(f"| {r.domain} | {r.task}{note} | {r.teacher:.4f} | {r.student:.4f} | "
                         f"{r.difference:+.4f} |")
        alphas = list(self.c_alpha["absolute"])
        lines += [
            "",
            "| tolerance | " + " | ".join(f"alpha={a:g}" for a in alphas) + " | alpha* |",
            "|---|" + "---:|" * (len(alphas) + 1),
        ]
        for kind in ("absolute", "relative"):
            cells = " | ".join(f"{self.c_alpha[kind][a]:.3f}" for a in alphas)
            lines.append(f"| C_alpha, {kind} | {cells} | {self.alpha_star[kind]:.4f} |")
        lines.append("")
        lines.append(f"alpha*: smallest alpha with C_alpha >= {self.target:g} over "
                     f"{', '.join(WIN_AND_TIE_TASKS)}.")
        return "\n".join(lines)


def _windows(tokens: np.ndarray, length: int, n: int) -> np.ndarray:
    """``n`` windows of ``length`` tokens evenly spaced through ``tokens`` (fewer when short)."""
    if tokens.size < length:
        raise ValueError(f"held-out text of {tokens.size} tokens is shorter than {length}")
    starts = np.unique(np.linspace(0, tokens.size - length, n).astype(int))
    return np.stack([tokens[s : s + length] for s in starts]).astype(np.int32)


def evaluate_suite(teacher: Callable, student: Callable, held_out: Mapping[str, Sequence[int]],
                   *, held_out_text: Mapping[str, str] | None = None, tokenizer=None,
                   config: SuiteConfig | None = None) -> SuiteReport:
    """Runs the suite (module docstring) on a teacher and a student over one vocabulary.

    Args:
      teacher: a callable ``tokens [B, T] -> logits [B, T, V]``.
      student: a callable ``tokens [B, T] -> logits [B, T, V]``.
      held_out: domain name -> held-out token ids ``[N]`` (next-token and greedy tasks).
      held_out_text: domain name -> held-out text; with ``tokenizer`` the domain gets the
        cloze task (domains without text have none).
      tokenizer: anything with ``encode(str) -> ids``; needed with ``held_out_text``.
      config: a :class:`SuiteConfig` (default sizes).

    Returns:
      A :class:`SuiteReport` (``to_markdown()``, ``save_json(path)``).

    Raises:
      ValueError: if ``held_out`` is empty or not integer ``[N]`` ids, its text is shorter
        than a window, or ``held_out_text`` comes without a ``tokenizer``.
    """
    config = SuiteConfig() if config is None else config
    if not held_out:
        raise ValueError("held_out: give at least one domain's held-out tokens")
    if held_out_text and tokenizer is None:
        raise ValueError("tokenizer: the cloze task of held_out_text needs a tokenizer")
    c = config
    rows = []
    for domain, tokens in held_out.items():
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"held_out[{domain!r}]: expected integer token ids [N], got "
                             f"{tokens.dtype}{list(tokens.shape)}")
        windows = _windows(tokens, c.seq_len, c.n_windows)
        t_m = next_token_metrics(teacher, windows, batch_size=c.batch_size)
        s_m = next_token_metrics(student, windows, batch_size=c.batch_size)
        rows.append(TaskScore(domain, "next_token_accuracy", t_m["accuracy"], s_m["accuracy"]))
        rows.append(TaskScore(domain, "perplexity", t_m["perplexity"], s_m["perplexity"],
                              higher_is_better=False))
        if held_out_text and domain in held_out_text:
            items = cloze_items(held_out_text[domain], tokenizer, n_items=c.cloze_items,
                                context_chars=c.cloze_context_chars,
                                max_tokens=c.cloze_max_tokens)
            rows.append(TaskScore(domain, "cloze",
                                  cloze_accuracy(teacher, items, batch_size=c.batch_size),
                                  cloze_accuracy(student, items, batch_size=c.batch_size)))
        prompts = _windows(tokens, c.prompt_len, c.n_prompts)
        ref = greedy_continuations(teacher, prompts, c.n_new, batch_size=c.batch_size)
        out = greedy_continuations(student, prompts, c.n_new, batch_size=c.batch_size)
        rows.append(TaskScore(domain, "greedy_agreement", 1.0, continuation_agreement(out, ref)))
    return summarize(rows, alphas=c.alphas, target=c.target)


def summarize(rows: Sequence[TaskScore], *, alphas=SuiteConfig.alphas, target: float = 1.0
              ) -> SuiteReport:
    """The :class:`SuiteReport` of ``rows``.

    Args:
      rows: the :class:`TaskScore` rows.
      alphas: the tolerances at which ``C_alpha`` is reported.
      target: the ``C_alpha`` that ``alpha*`` must reach.

    Returns:
      The :class:`SuiteReport`, ``C_alpha`` and ``alpha*`` over the rows of
      :data:`WIN_AND_TIE_TASKS`.

    Raises:
      ValueError: if no row is of :data:`WIN_AND_TIE_TASKS`.
    """
    counted = [r for r in rows if r.task in WIN_AND_TIE_TASKS]
    if not counted:
        raise ValueError(f"rows: no task of {WIN_AND_TIE_TASKS} to compute C_alpha over")
    s = [r.student for r in counted]
    t = [r.teacher for r in counted]
    c_alpha, alpha_star = {}, {}
    for kind in ("absolute", "relative"):
        rel = kind == "relative"
        c_alpha[kind] = {float(a): win_and_tie_rate(s, t, a, relative=rel) for a in alphas}
        alpha_star[kind] = critical_tolerance(s, t, relative=rel, target=target)
    return SuiteReport(tuple(rows), c_alpha, alpha_star, float(target))


def _check_tokens(name, tokens, *, min_len):
    arr = np.asarray(tokens)
    if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer) or arr.shape[1] < min_len:
        raise ValueError(f"{name}: expected integer tokens [N, T] with T >= {min_len}, got "
                         f"{arr.dtype}{list(arr.shape)}")
    return arr.astype(np.int32)
