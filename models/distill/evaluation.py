"""The task suite of a distilled student against its teacher, and the Win-and-Tie metric.

Every model is a plain callable ``model(tokens int32[B, T]) -> logits [B, T, V]`` (a tuple's
first element is taken, so a :class:`~jaxlib_ext.models.LanguageModel` is accepted as it is;
:func:`logits_fn` turns an NNX model into a compiled one). Tasks, per held-out domain, in
table order (:data:`TASKS`):

* ``next_token_accuracy``: argmax next-token accuracy on held-out windows (teacher forcing);
* ``perplexity``: ``exp`` of the mean next-token negative log-likelihood on the same windows
  (lower is better; a diagnostic);
* ``cloze``: last-word cloze (LAMBADA-style): a passage cut right after a word of at least
  three letters that follows a single space; the item is solved when every token of the space
  and the word is the argmax prediction given the passage before them (:func:`cloze_items`);
* ``next_sentence``: multiple choice scored by log-likelihood, as EleutherAI's
  lm-evaluation-harness scores multiple-choice benchmarks: a held-out passage and
  ``n_choices`` candidate continuations, the passage's actual next sentence (or line, for
  code) and distractors of similar length from the same text; the model picks the candidate
  with the largest sum of token log-probabilities given the passage, and the score is the
  accuracy ``acc`` (``acc_norm``, log-likelihood per character, as an option;
  :func:`multiple_choice_items`, :func:`multiple_choice_accuracy`);
* ``greedy_agreement``: greedy continuations of held-out prompts by each model; the score is
  the mean fraction of the continuation's tokens before the first token that differs from the
  teacher's continuation (a diagnostic: the teacher scores 1 by construction).

**Win-and-Tie rate** (Hauzenberger et al., Effective Distillation to Hybrid xLSTM
Architectures, arXiv 2603.15590). Over ``n`` tasks ``i`` with student score ``s_i = A_S,i``
and teacher score ``t_i = A_T,i``, higher is better, the default (the paper's) is the relative
tolerance::

    C_alpha = (1 / n) #{ i : s_i >= (1 - alpha) t_i }
    alpha*  = inf { alpha >= 0 : C_alpha >= 0.5 }                  (Eq. 17)

and the student is **lossless** when ``C_0 >= 0.5``: it wins or ties on at least half of the
tasks (:attr:`SuiteReport.lossless`, whatever the ``target``). Ties count as wins (``>=``), so
``C_alpha`` is non-decreasing in ``alpha``. Options: the absolute tolerance ``C_alpha = (1 / n)
#{ i : s_i >= t_i - alpha }`` (``relative=False``; accuracy points as fractions), and other
levels ``target`` in ``(0, 1]`` in place of ``0.5`` (``target = 1``: within tolerance on every
task).

In terms of the per-task gaps (:func:`tolerance_gaps`)::

    relative:  d_i = max(0, t_i - s_i) / |t_i|      (d_i = 0 if s_i >= t_i, even when t_i = 0;
                                                     d_i = inf if t_i = 0 > s_i)
    absolute:  d_i = max(0, t_i - s_i)

``C_alpha = #{ i : d_i <= alpha } / n``. For ``t_i >= 0`` (every task counted here) the
relative condition ``d_i <= alpha`` is the paper's ``s_i >= (1 - alpha) t_i``; ``|t_i|`` keeps
``C_alpha`` non-decreasing in ``alpha`` for negative scores. A task where the student wins or
ties has gap 0. ``C_alpha`` is a right-continuous step function of ``alpha``, so the infimum of
Eq. 17 is attained: ``alpha*`` is the ``k``-th smallest gap with ``k = ceil(target n)``
(``target n`` within ``1e-9`` of an integer counts as that integer, so that ``0.6 * 5`` is 3).
With ``target = 0.5`` that is ``k = ceil(n / 2)``: for ``n = 4``, ``C_alpha >= 0.5`` needs 2
tasks within tolerance and ``alpha*`` is the 2nd smallest gap; for ``n = 5``, 3 tasks
(``2 / 5 < 0.5``) and the 3rd smallest gap. A gap within ``1e-12`` above ``alpha`` counts as
within tolerance, so that decimal scores and tolerances are not split by rounding (``s =
0.95``, ``t = 1``, ``alpha = 0.05`` is a tie at the tolerance, though ``(1 - 0.95) / 1`` rounds
above ``0.05``).

Scores enter ``C_alpha`` only for the tasks of :data:`WIN_AND_TIE_TASKS`, accuracies in ``[0,
1]`` (so an absolute ``alpha`` has one unit); the :data:`DIAGNOSTIC_TASKS` (perplexity, which is
lower-is-better and unbounded, and greedy agreement, which scores the teacher 1 by construction
and penalises any early divergence) are reported beside them, not counted.
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
    "DIAGNOSTIC_TASKS",
    "MC_UNITS",
    "ClozeItems",
    "MultipleChoiceItems",
    "SuiteConfig",
    "TaskScore",
    "SuiteReport",
    "logits_fn",
    "next_token_metrics",
    "cloze_items",
    "cloze_accuracy",
    "cloze_texts",
    "multiple_choice_items",
    "multiple_choice_log_likelihoods",
    "multiple_choice_accuracy",
    "multiple_choice_texts",
    "greedy_continuations",
    "continuation_agreement",
    "tolerance_gaps",
    "win_and_tie_rate",
    "critical_tolerance",
    "evaluate_suite",
    "summarize",
]

#: The per-domain tasks, in table order.
TASKS = ("next_token_accuracy", "perplexity", "cloze", "next_sentence", "greedy_agreement")
#: The tasks whose scores (accuracies in [0, 1]) enter ``C_alpha``.
WIN_AND_TIE_TASKS = ("next_token_accuracy", "cloze", "next_sentence")
#: The tasks reported beside ``C_alpha``, not counted in it.
DIAGNOSTIC_TASKS = ("perplexity", "greedy_agreement")
#: The units of :func:`multiple_choice_items`.
MC_UNITS = ("auto", "sentences", "lines")

_LOSSLESS_RATE = 0.5  # the paper's: lossless when C_0 >= 0.5
_GAP_TOL = 1e-12  # gaps this close above alpha count as within tolerance


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
    return _texts_with_items(texts, lambda text: cloze_items(
        text, tokenizer, n_items=c.cloze_items, context_chars=c.cloze_context_chars,
        max_tokens=c.cloze_max_tokens))


def _texts_with_items(texts: Mapping[str, str], make_items) -> dict[str, str]:
    """The entries of ``texts`` for which ``make_items(text)`` raises no ``ValueError``."""
    kept = {}
    for name, text in texts.items():
        try:
            make_items(text)
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


# --------------------------------------------------------------------------- multiple choice


@dataclasses.dataclass(frozen=True)
class MultipleChoiceItems:
    """Multiple-choice items (:func:`multiple_choice_items`), right-padded to one length ``L``;
    ``len(items)`` is ``N``, each with ``C`` candidates.

    Attributes:
      tokens: ``int32[N, C, L]``: the item's context, then the candidate, zeros after; the
        context tokens are the same for the ``C`` candidates of an item.
      target: ``bool[N, C, L]``, True at the candidate's tokens.
      answer: ``int64[N]``, the index of the true continuation among the candidates.
      char_lengths: ``int64[N, C]``, the candidates' lengths in characters (the divisor of
        ``acc_norm``).
      contexts: the ``N`` context strings (before the cut that fits them into ``L`` tokens).
      choices: ``N`` tuples of the ``C`` candidate strings; ``contexts[i] +
        choices[i][answer[i]]`` is a piece of the text.
    """

    tokens: np.ndarray
    target: np.ndarray
    answer: np.ndarray
    char_lengths: np.ndarray
    contexts: tuple[str, ...] = ()
    choices: tuple[tuple[str, ...], ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_choices(self) -> int:
        """``C``, the candidates per item."""
        return self.tokens.shape[1]


# A sentence ends at ". ", "? " or "! " (any whitespace after the mark); a blank line ends any
# piece of text.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n[ \t]*\n\s*")
_MIN_UNIT_CHARS = 8
_MIN_SENTENCE_WORDS = 3
_PROSE_SHARE = 0.4  # "auto": sentences when they hold this share of the visible characters
_NEAREST_PER_DISTRACTOR = 4  # distractors are drawn from the 4 (C - 1) nearest in length


def _visible(text: str) -> int:
    return len("".join(text.split()))


def _key(text: str) -> str:
    """``text`` with its whitespace runs collapsed: units with one key are one unit."""
    return " ".join(text.split())


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    spans, pos = [], 0
    breaks = [(m.start(), m.end()) for m in _SENTENCE_BREAK.finditer(text)]
    for stop, after in [*breaks, (len(text), len(text))]:
        piece = text[pos:stop]
        start = pos + len(piece) - len(piece.lstrip())
        end = pos + len(piece.rstrip())
        unit = text[start:end]
        if (len(unit) >= _MIN_UNIT_CHARS and unit[0].isupper() and unit[-1] in ".!?"
                and len(unit.split()) >= _MIN_SENTENCE_WORDS):
            spans.append((start, end))
        pos = after
    return spans


def _line_spans(text: str) -> list[tuple[int, int]]:
    spans = []
    for m in re.finditer(r"[^\n]+", text):
        line = m.group()
        start = m.start() + len(line) - len(line.lstrip())
        end = m.start() + len(line.rstrip())
        if end - start >= _MIN_UNIT_CHARS:
            spans.append((start, end))
    return spans


def _unit_spans(text: str, unit: str, n_choices: int) -> tuple[list[tuple[int, int]], str]:
    if unit == "lines":
        return _line_spans(text), "lines"
    sentences = _sentence_spans(text)
    if unit == "sentences":
        return sentences, "sentences"
    covered = sum(_visible(text[a:b]) for a, b in sentences)
    distinct = len({_key(text[a:b]) for a, b in sentences})
    if distinct >= n_choices and covered >= _PROSE_SHARE * _visible(text):
        return sentences, "sentences"
    return _line_spans(text), "lines"


def _context_end(text: str, start: int) -> int:
    """The end of the text before ``start`` without the whitespace right before ``start``."""
    end = start
    while end > 0 and text[end - 1].isspace():
        end -= 1
    return end


def _ids(tokenizer, text: str) -> list[int]:
    return list(np.asarray(tokenizer.encode(text)).tolist())


def multiple_choice_items(text: str, tokenizer, *, n_items: int = 32, n_choices: int = 4,
                          context_chars: int = 400, max_tokens: int = 128, seed: int = 0,
                          unit: str = "auto") -> MultipleChoiceItems:
    """Up to ``n_items`` next-sentence multiple-choice items cut from ``text``.

    **Units.** The text is cut into units, either sentences or lines:

    * ``"sentences"``: the pieces of text between sentence ends (``.``, ``?`` or ``!`` followed
      by whitespace) and blank lines that start with an upper-case letter, end with ``.``,
      ``?`` or ``!`` and hold at least 3 words;
    * ``"lines"``: the non-empty lines, without their leading and trailing whitespace;
    * ``"auto"`` (the default): sentences when there are at least ``n_choices`` distinct ones
      and they hold at least 40% of the text's non-whitespace characters (prose), else lines
      (code: CPython's source has sentences only in its comments and docstrings).

    Units shorter than 8 characters are left out, and units that are equal up to whitespace
    are one unit; the units that fit the candidate budget, at most ``max_tokens // 2`` tokens
    when tokenised alone, make the pool.

    **Items.** Each unit of the pool with at least ``context_chars`` characters of text before
    it (``n_items`` of them, evenly spaced through the text) makes an item: its context is the
    ``context_chars`` characters before it, less the whitespace right before the unit (``sep``),
    and its candidates are ``sep + u`` for the true unit ``u`` and ``n_choices - 1``
    distractors, other units of the pool of similar length: drawn without replacement from
    the ``4 (n_choices - 1)`` units nearest in character length (ties in length in random
    order), never equal to the true unit or to each other up to whitespace, and never a piece
    of the context. All candidates of an item share its ``sep`` (for lines: the newline and
    the true line's indentation), so whitespace tells nothing. The answer's position is drawn
    uniformly, so a tie-break towards the first candidate does not favour it. The draws of an
    item come from ``numpy.random.default_rng([seed, start])``, ``start`` the true unit's
    character offset: the items are a function of ``text``, the sizes and ``seed``.

    **Tokens** (as :func:`cloze_items`): an item is kept when, for every candidate ``c``, the
    tokenisation of ``context + c`` starts with the tokenisation of ``context`` and is longer;
    the candidate's tokens are the rest. The context is cut from the left to fit the longest
    candidate into ``max_tokens``, and every row is padded to ``max_tokens``, so item sets of
    one ``max_tokens`` have one shape (the model compiles once).

    Args:
      text: the held-out text.
      tokenizer: anything with ``encode(str) -> ids``.
      n_items: the most items, ``>= 1``.
      n_choices: candidates per item, ``>= 2``.
      context_chars: characters of text before each true unit, ``>= 1``.
      max_tokens: tokens per row, ``>= 2``.
      seed: the seed of the draws, an int ``>= 0``.
      unit: one of :data:`MC_UNITS`: ``"auto"``, ``"sentences"`` or ``"lines"``.

    Returns:
      The :class:`MultipleChoiceItems`.

    Raises:
      ValueError: if a size, ``seed`` or ``unit`` is out of range, the text has fewer than
        ``n_choices`` distinct units, or no item can be made.
    """
    if n_items < 1 or n_choices < 2 or context_chars < 1 or max_tokens < 2:
        raise ValueError(
            f"n_items, context_chars must be >= 1, n_choices and max_tokens >= 2, got "
            f"{n_items}, {context_chars}, {n_choices}, {max_tokens}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    if unit not in MC_UNITS:
        raise ValueError(f"unit must be one of {MC_UNITS}, got {unit!r}")
    spans, kind = _unit_spans(text, unit, n_choices)
    pool: dict[str, str] = {}
    for a, b in spans:
        pool.setdefault(_key(text[a:b]), text[a:b])
    budget = max_tokens // 2
    pool = {k: u for k, u in pool.items() if len(_ids(tokenizer, u)) <= budget}
    if len(pool) < n_choices:
        raise ValueError(f"text: {len(pool)} distinct {kind} of at most {budget} tokens, fewer "
                         f"than n_choices = {n_choices}")
    keys, units = list(pool), list(pool.values())
    lengths = np.array([len(u) for u in units])
    trues = [(a, b) for a, b in spans
             if _context_end(text, a) >= context_chars and _key(text[a:b]) in pool]
    if not trues:
        raise ValueError(f"text: no {kind[:-1]} with {context_chars} characters of context "
                         "before it")
    picks = np.unique(np.linspace(0, len(trues) - 1, min(n_items, len(trues))).astype(int))
    items = []
    for i in picks:
        start, end = trues[i]
        stop = _context_end(text, start)
        context, sep, true = text[stop - context_chars : stop], text[stop:start], text[start:end]
        rng = np.random.default_rng([seed, start])
        others = np.array([j for j, (k, u) in enumerate(zip(keys, units))
                           if k != _key(true) and u not in context], int)
        if len(others) < n_choices - 1:
            continue
        order = np.lexsort((rng.random(len(others)), np.abs(lengths[others] - len(true))))
        near = others[order[: _NEAREST_PER_DISTRACTOR * (n_choices - 1)]]
        choices = [sep + units[j] for j in rng.choice(near, n_choices - 1, replace=False)]
        answer = int(rng.integers(n_choices))
        choices.insert(answer, sep + true)
        ids_ctx = _ids(tokenizer, context)
        cands = []
        for choice in choices:
            ids = _ids(tokenizer, context + choice)
            if ids[: len(ids_ctx)] != ids_ctx or len(ids) == len(ids_ctx):
                break
            cands.append(ids[len(ids_ctx) :])
        else:
            longest = max(map(len, cands))
            if longest < max_tokens and ids_ctx:
                items.append((ids_ctx[-(max_tokens - longest) :], cands, answer, context,
                              tuple(choices)))
    if not items:
        raise ValueError("text: no multiple-choice item survives tokenisation")
    tokens = np.zeros((len(items), n_choices, max_tokens), np.int32)
    target = np.zeros((len(items), n_choices, max_tokens), bool)
    for r, (ctx, cands, _, _, _) in enumerate(items):
        for c, cand in enumerate(cands):
            tokens[r, c, : len(ctx) + len(cand)] = ctx + cand
            target[r, c, len(ctx) : len(ctx) + len(cand)] = True
    return MultipleChoiceItems(
        tokens=tokens,
        target=target,
        answer=np.array([it[2] for it in items], np.int64),
        char_lengths=np.array([[len(c) for c in it[4]] for it in items], np.int64),
        contexts=tuple(it[3] for it in items),
        choices=tuple(it[4] for it in items),
    )


def multiple_choice_log_likelihoods(model: Callable, items: MultipleChoiceItems, *,
                                    batch_size: int = 8) -> np.ndarray:
    """Each candidate's log-likelihood given its context,
    ``ll[i, c] = sum_j log p(x_j | x_<j)`` over the candidate's tokens ``x_j``.

    The per-token log-probabilities (``log_softmax`` in float32) are summed in float64, so
    candidates with equal per-token log-probabilities have exactly proportional sums.

    Args:
      model: a causal callable ``tokens [B, T] -> logits [B, T, V]``.
      items: the :class:`MultipleChoiceItems`.
      batch_size: rows (one candidate of one item each) per call.

    Returns:
      ``float64[N, C]``.
    """
    n, c, length = items.tokens.shape
    rows = np.concatenate([items.tokens.reshape(n * c, length),
                           items.target.reshape(n * c, length).astype(np.int32)], axis=1)
    out = []
    for batch, k in _batches(rows, batch_size):
        tokens, target = batch[:, :length], batch[:, length + 1 :].astype(bool)
        logp = jax.nn.log_softmax(_logits(model, tokens)[:, :-1].astype(jnp.float32), axis=-1)
        token_logp = jnp.take_along_axis(logp, jnp.asarray(tokens[:, 1:, None]), axis=-1)
        token_logp = np.asarray(token_logp[..., 0], np.float64)
        out.append(np.where(target, token_logp, 0.0)[:k].sum(axis=1))
    return np.concatenate(out).reshape(n, c)


def multiple_choice_accuracy(model: Callable, items: MultipleChoiceItems, *,
                             normalize: bool = False, batch_size: int = 8) -> float:
    """The fraction of items whose true candidate has the largest score.

    The score is the log-likelihood (:func:`multiple_choice_log_likelihoods`), lm-evaluation-
    harness's ``acc``, or with ``normalize`` the log-likelihood per character,
    ``ll[i, c] / len(candidate)``, its ``acc_norm``. Ties go to the first of the tied
    candidates (``argmax``), so a model that scores every candidate alike scores the fraction
    of items whose answer is at position 0 (``1 / C`` in expectation: the answer's position is
    drawn uniformly).

    Args:
      model: a causal callable ``tokens [B, T] -> logits [B, T, V]``.
      items: the :class:`MultipleChoiceItems`.
      normalize: divide the log-likelihoods by the candidates' character lengths.
      batch_size: rows per call.

    Returns:
      The accuracy, a float in ``[0, 1]``.
    """
    score = multiple_choice_log_likelihoods(model, items, batch_size=batch_size)
    if normalize:
        score = score / items.char_lengths
    return float(np.mean(np.argmax(score, axis=1) == items.answer))


def _suite_mc_items(text: str, tokenizer, c: SuiteConfig) -> MultipleChoiceItems:
    return multiple_choice_items(text, tokenizer, n_items=c.mc_items, n_choices=c.mc_choices,
                                 context_chars=c.mc_context_chars, max_tokens=c.mc_max_tokens,
                                 seed=c.mc_seed, unit=c.mc_unit)


def multiple_choice_texts(texts: Mapping[str, str], tokenizer, config: SuiteConfig | None = None
                          ) -> dict[str, str]:
    """The entries of ``texts`` that yield at least one multiple-choice item
    (:func:`multiple_choice_items` with the ``mc_*`` sizes of ``config``).

    :func:`evaluate_suite` runs the ``next_sentence`` task on exactly these domains of its
    ``held_out_text`` and leaves the others out.

    Args:
      texts: domain name -> held-out text.
      tokenizer: anything with ``encode(str) -> ids``.
      config: the suite's sizes; ``None`` means ``SuiteConfig()``.

    Returns:
      The kept entries, domain name -> text.
    """
    c = SuiteConfig() if config is None else config
    return _texts_with_items(texts, lambda text: _suite_mc_items(text, tokenizer, c))


# --------------------------------------------------------------------------- Win-and-Tie


def tolerance_gaps(student, teacher, *, relative: bool = True) -> np.ndarray:
    """Per-task gaps ``d_i``, with ``C_alpha = #{ i : d_i <= alpha } / n`` (module docstring).

    Relative (the default, the paper's): ``d_i = max(0, t_i - s_i) / |t_i|``, which is
    ``<= alpha`` exactly when ``s_i >= (1 - alpha) t_i`` for ``t_i >= 0``. Absolute: ``d_i =
    max(0, t_i - s_i)``. A task where the student wins or ties has ``d_i = 0``, also when
    ``t_i = 0``; a zero teacher score with ``s_i < 0`` has the relative gap ``inf`` (no
    tolerance ``alpha |t_i| = 0`` covers it).

    Args:
      student: ``[n]`` finite student scores, higher is better.
      teacher: ``[n]`` finite teacher scores.
      relative: relative gaps (else absolute).

    Returns:
      ``float64[n]`` gaps, ``>= 0``.

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


def win_and_tie_rate(student, teacher, alpha: float, *, relative: bool = True) -> float:
    """``C_alpha``, the fraction of tasks the student wins or ties within tolerance ``alpha``.

    Relative (the default; Hauzenberger et al., arXiv 2603.15590)::

        C_alpha = (1 / n) #{ i : s_i >= (1 - alpha) t_i }

    (with ``|t_i|``, ``s_i >= t_i - alpha |t_i|``, for negative scores), or absolute::

        C_alpha = (1 / n) #{ i : s_i >= t_i - alpha }

    Ties count as wins, so ``C_0`` is the fraction of tasks where ``s_i >= t_i``. A gap
    (:func:`tolerance_gaps`) within ``1e-12`` above ``alpha`` counts as within tolerance
    (float rounding of decimal scores).

    Args:
      student: ``[n]`` student scores, higher is better.
      teacher: ``[n]`` teacher scores.
      alpha: the tolerance, finite and ``>= 0``.
      relative: the relative tolerance (else absolute).

    Returns:
      ``C_alpha``, a float in ``[0, 1]``.

    Raises:
      ValueError: if ``alpha`` is out of range, or as :func:`tolerance_gaps`.
    """
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
    gaps = tolerance_gaps(student, teacher, relative=relative)
    return float(np.mean(gaps <= alpha + _GAP_TOL))


def critical_tolerance(student, teacher, *, relative: bool = True, target: float = 0.5
                       ) -> float:
    """``alpha*``, the critical tolerance of Eq. 17 of arXiv 2603.15590::

        alpha* = inf { alpha >= 0 : C_alpha >= target }      (the paper: target = 0.5)

    ``C_alpha`` is a right-continuous step function rising at the gaps ``d_i``
    (:func:`tolerance_gaps`), so ``alpha*`` is the ``k``-th smallest gap, ``k = ceil(target
    n)`` (``target n`` within ``1e-9`` of an integer counts as that integer). With ``target =
    0.5``, ``k = ceil(n / 2)``: the 2nd smallest of 4 gaps, the 3rd smallest of 5. ``alpha* =
    0`` when the student wins or ties on ``k`` tasks; ``inf`` is possible with relative gaps
    (zero teacher scores).

    Args:
      student: ``[n]`` student scores, higher is better.
      teacher: ``[n]`` teacher scores.
      relative: relative gaps (the default) or absolute ones.
      target: the required ``C_alpha``, in ``(0, 1]``.

    Returns:
      ``alpha*``, a float.

    Raises:
      ValueError: if ``target`` is out of range, or as :func:`tolerance_gaps`.
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
    """Sizes of the suite and its Win-and-Tie summary.

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
      alphas: the tolerances at which ``C_alpha`` is reported (relative and absolute), finite
        and ``>= 0``.
      target: the ``C_alpha`` that ``alpha*`` must reach, in ``(0, 1]`` (the paper's 0.5).
      mc_items: the most ``next_sentence`` items per domain.
      mc_choices: candidates per ``next_sentence`` item, ``>= 2``.
      mc_context_chars: characters of context before each true unit.
      mc_max_tokens: tokens per ``next_sentence`` row, ``>= 2``.
      mc_seed: the seed of the distractor and answer-position draws, ``>= 0``.
      mc_unit: the unit of the candidates, one of :data:`MC_UNITS`.
      mc_normalize: score ``next_sentence`` by ``acc_norm`` (log-likelihood per character)
        rather than ``acc``.

    Raises:
      ValueError: if a size is not a positive int (``seq_len``, ``mc_choices``,
        ``mc_max_tokens >= 2``; ``mc_seed >= 0``), or ``alphas``, ``target`` or ``mc_unit`` is
        out of range.
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
    alphas: tuple[float, ...] = (0.0, 0.01, 0.02, 0.05, 0.1)
    target: float = 0.5
    mc_items: int = 32
    mc_choices: int = 4
    mc_context_chars: int = 400
    mc_max_tokens: int = 128
    mc_seed: int = 0
    mc_unit: str = "auto"
    mc_normalize: bool = False

    def __post_init__(self):
        for name in ("seq_len", "n_windows", "batch_size", "cloze_items", "cloze_context_chars",
                     "cloze_max_tokens", "n_prompts", "prompt_len", "n_new", "mc_items",
                     "mc_choices", "mc_context_chars", "mc_max_tokens", "mc_seed"):
            value = getattr(self, name)
            low = 0 if name == "mc_seed" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                kind = "an int >= 0" if low == 0 else "a positive int"
                raise ValueError(f"SuiteConfig.{name} must be {kind}, got {value!r}")
        for name in ("seq_len", "mc_choices", "mc_max_tokens"):
            if getattr(self, name) < 2:
                raise ValueError(f"SuiteConfig.{name} must be >= 2, got {getattr(self, name)}")
        if not self.alphas or any(not (np.isfinite(a) and a >= 0) for a in self.alphas):
            raise ValueError(f"SuiteConfig.alphas must be finite numbers >= 0, got {self.alphas}")
        if not 0.0 < self.target <= 1.0:
            raise ValueError(f"SuiteConfig.target must be in (0, 1], got {self.target}")
        if self.mc_unit not in MC_UNITS:
            raise ValueError(f"SuiteConfig.mc_unit must be one of {MC_UNITS}, got "
                             f"{self.mc_unit!r}")


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
      rows: the :class:`TaskScore` rows, the diagnostic ones included.
      c_alpha: ``c_alpha[kind][alpha]``, ``kind`` ``"relative"`` (the paper's) or
        ``"absolute"``.
      alpha_star: ``alpha_star[kind]``, Eq. 17 of arXiv 2603.15590 at level ``target``.
      target: the ``C_alpha`` that ``alpha*`` reaches.
      c_zero: ``C_0``, the fraction of counted tasks the student wins or ties (``None`` when
        not computed).
      lossless: ``C_0 >= 0.5``, the paper's lossless student (``None`` when not computed).
      diagnostic_tasks: the tasks of ``rows`` reported but not counted in ``C_alpha``.
    """

    rows: tuple[TaskScore, ...]
    c_alpha: dict
    alpha_star: dict
    target: float
    c_zero: float | None = None
    lossless: bool | None = None
    diagnostic_tasks: tuple[str, ...] = DIAGNOSTIC_TASKS

    @property
    def counted_rows(self) -> tuple[TaskScore, ...]:
        """The rows of :data:`WIN_AND_TIE_TASKS`, those ``C_alpha`` is computed over."""
        return tuple(r for r in self.rows if r.task in WIN_AND_TIE_TASKS)

    def to_dict(self) -> dict:
        """The report as a JSON-ready dict (rows with their difference, the summary)."""
        return {
            "rows": [dict(dataclasses.asdict(r), difference=r.difference,
                          counted=r.task in WIN_AND_TIE_TASKS) for r in self.rows],
            "c_alpha": {k: {str(a): c for a, c in v.items()} for k, v in self.c_alpha.items()},
            "alpha_star": dict(self.alpha_star),
            "target": self.target,
            "c_zero": self.c_zero,
            "lossless": self.lossless,
            "lossless_rule": f"C_0 >= {_LOSSLESS_RATE:g}",
            "n_tasks": len(self.counted_rows),
            "win_and_tie_tasks": list(WIN_AND_TIE_TASKS),
            "diagnostic_tasks": list(self.diagnostic_tasks),
            "reference": "Hauzenberger et al., arXiv 2603.15590, Eq. 17",
        }

    def save_json(self, path) -> pathlib.Path:
        """Writes :meth:`to_dict` as JSON to ``path`` (parents created); returns the path."""
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def to_markdown(self) -> str:
        """The rows, then ``C_alpha`` and ``alpha*`` (relative, the paper's, first; absolute
        second), ``C_0`` and the lossless verdict, as markdown."""
        lines = [
            "| domain | task | teacher | student | student - teacher |",
            "|---|---|---:|---:|---:|",
        ]
        for r in self.rows:
            notes = [] if r.task in WIN_AND_TIE_TASKS else ["diagnostic"]
            if not r.higher_is_better:
                notes.append("lower is better")
            note = f" ({', '.join(notes)})" if notes else ""
            lines.append(f"| {r.domain} | {r.task}{note} | {r.teacher:.4f} | {r.student:.4f} | "
                         f"{r.difference:+.4f} |")
        kinds = [k for k in ("relative", "absolute") if k in self.c_alpha]
        alphas = list(self.c_alpha[kinds[0]])
        rules = {"relative": "s >= (1 - alpha) t", "absolute": "s >= t - alpha"}
        lines += [
            "",
            "| tolerance | " + " | ".join(f"alpha={a:g}" for a in alphas)
            + f" | alpha* (C_alpha >= {self.target:g}) |",
            "|---|" + "---:|" * (len(alphas) + 1),
        ]
        for kind in kinds:
            cells = " | ".join(f"{self.c_alpha[kind][a]:.3f}" for a in alphas)
            lines.append(f"| C_alpha, {kind}: {rules[kind]} | {cells} | "
                         f"{self.alpha_star[kind]:.4f} |")
        counted = self.counted_rows
        lines.append("")
        if self.c_zero is not None:
            verdict = ("lossless" if self.lossless else "not lossless") + (
                f" (C_0 {'>=' if self.lossless else '<'} {_LOSSLESS_RATE:g})")
            lines.append(f"C_0 = {self.c_zero:.3f}: the student wins or ties on "
                         f"{round(self.c_zero * len(counted))} of {len(counted)} tasks; "
                         f"{verdict}.")
        lines.append(f"alpha* = inf{{alpha >= 0 : C_alpha >= {self.target:g}}} (arXiv "
                     f"2603.15590, Eq. 17) over {', '.join(WIN_AND_TIE_TASKS)}; diagnostic rows "
                     f"({', '.join(self.diagnostic_tasks) or 'none'}) are not counted.")
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

    Per domain of ``held_out``, in :data:`TASKS` order: ``next_token_accuracy`` and
    ``perplexity``; with its text in ``held_out_text``, ``cloze`` and ``next_sentence`` (the
    latter left out where the text yields no multiple-choice item, see
    :func:`multiple_choice_texts`); ``greedy_agreement``.

    Args:
      teacher: a callable ``tokens [B, T] -> logits [B, T, V]``.
      student: a callable ``tokens [B, T] -> logits [B, T, V]``.
      held_out: domain name -> held-out token ids ``[N]`` (next-token and greedy tasks).
      held_out_text: domain name -> held-out text; with ``tokenizer`` the domain gets the
        text tasks (domains without text have none).
      tokenizer: anything with ``encode(str) -> ids``; needed with ``held_out_text``.
      config: a :class:`SuiteConfig` (default sizes, the paper's ``C_alpha``).

    Returns:
      A :class:`SuiteReport` (``to_markdown()``, ``save_json(path)``).

    Raises:
      ValueError: if ``held_out`` is empty or not integer ``[N]`` ids, its text is shorter
        than a window, a text of ``held_out_text`` yields no cloze item (see
        :func:`cloze_texts`), or ``held_out_text`` comes without a ``tokenizer``.
    """
    config = SuiteConfig() if config is None else config
    if not held_out:
        raise ValueError("held_out: give at least one domain's held-out tokens")
    if held_out_text and tokenizer is None:
        raise ValueError("tokenizer: the text tasks of held_out_text need a tokenizer")
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
            text = held_out_text[domain]
            items = cloze_items(text, tokenizer, n_items=c.cloze_items,
                                context_chars=c.cloze_context_chars,
                                max_tokens=c.cloze_max_tokens)
            rows.append(TaskScore(domain, "cloze",
                                  cloze_accuracy(teacher, items, batch_size=c.batch_size),
                                  cloze_accuracy(student, items, batch_size=c.batch_size)))
            try:  # the sizes are checked by SuiteConfig: this is a text without items
                mc = _suite_mc_items(text, tokenizer, c)
            except ValueError:
                mc = None
            if mc is not None:
                kw = {"normalize": c.mc_normalize, "batch_size": c.batch_size}
                rows.append(TaskScore(domain, "next_sentence",
                                      multiple_choice_accuracy(teacher, mc, **kw),
                                      multiple_choice_accuracy(student, mc, **kw)))
        prompts = _windows(tokens, c.prompt_len, c.n_prompts)
        ref = greedy_continuations(teacher, prompts, c.n_new, batch_size=c.batch_size)
        out = greedy_continuations(student, prompts, c.n_new, batch_size=c.batch_size)
        rows.append(TaskScore(domain, "greedy_agreement", 1.0, continuation_agreement(out, ref)))
    return summarize(rows, alphas=c.alphas, target=c.target)


def summarize(rows: Sequence[TaskScore], *, alphas=SuiteConfig.alphas, target: float = 0.5
              ) -> SuiteReport:
    """The :class:`SuiteReport` of ``rows``: ``C_alpha`` (relative and absolute), ``alpha*``
    (Eq. 17 of arXiv 2603.15590 at level ``target``), ``C_0`` and ``lossless = C_0 >= 0.5``,
    over the rows of :data:`WIN_AND_TIE_TASKS`; the other rows are diagnostics.

    Args:
      rows: the :class:`TaskScore` rows.
      alphas: the tolerances at which ``C_alpha`` is reported.
      target: the ``C_alpha`` that ``alpha*`` must reach, in ``(0, 1]``.

    Returns:
      The :class:`SuiteReport`.

    Raises:
      ValueError: if no row is of :data:`WIN_AND_TIE_TASKS`, or an ``alpha`` or ``target``
        is out of range.
    """
    counted = [r for r in rows if r.task in WIN_AND_TIE_TASKS]
    if not counted:
        raise ValueError(f"rows: no task of {WIN_AND_TIE_TASKS} to compute C_alpha over")
    s = [r.student for r in counted]
    t = [r.teacher for r in counted]
    c_alpha, alpha_star = {}, {}
    for kind in ("relative", "absolute"):
        rel = kind == "relative"
        c_alpha[kind] = {float(a): win_and_tie_rate(s, t, a, relative=rel) for a in alphas}
        alpha_star[kind] = critical_tolerance(s, t, relative=rel, target=target)
    c_zero = win_and_tie_rate(s, t, 0.0)
    diagnostic = tuple(dict.fromkeys(r.task for r in rows if r.task not in WIN_AND_TIE_TASKS))
    return SuiteReport(tuple(rows), c_alpha, alpha_star, float(target), c_zero=c_zero,
                       lossless=c_zero >= _LOSSLESS_RATE, diagnostic_tasks=diagnostic)


def _check_tokens(name, tokens, *, min_len):
    arr = np.asarray(tokens)
    if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer) or arr.shape[1] < min_len:
        raise ValueError(f"{name}: expected integer tokens [N, T] with T >= {min_len}, got "
                         f"{arr.dtype}{list(arr.shape)}")
    return arr.astype(np.int32)
