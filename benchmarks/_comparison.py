"""Shared helper for method-versus-baseline comparisons in the benchmarks.

A verdict that rests on one seed at one learning rate shared by every method is not a result:
a rate that suits one method can stall another, and seed noise at benchmark scale is often as
large as the gap being claimed. Every comparison in ``benchmarks/`` therefore follows one rule,
which this module encodes so that a script cannot skip it:

* each method gets the same small learning-rate grid (at least 3 values, neighbours a factor of
  about 3 apart: 2.5 to 4) and the same budget;
* each method's learning rate is picked by the mean *validation* metric over seeds, and the
  *test* metric is reported at that rate (the test split never chooses anything);
* at least 3 seeds, reported as mean ± sample std (ddof 1) and as every seed;
* the whole grid is printed, not only the winners.

Usage::

    from benchmarks._comparison import Comparison, add_arguments, run_comparison

    spec = Comparison(methods=("adamw", "smet"), lrs=(1e-3, 3e-3, 1e-2), seeds=(0, 1, 2),
                      budget="300 steps x batch 8x64")
    result = run_comparison(spec, run)          # run(method, lr, seed) -> {"val", "test", ...}
    print(result.grid_table())
    print(result.summary_table(baseline="adamw"))
    print(result.verdict("smet", "adamw"))

Call :func:`cache_compilations` first when ``run`` jit-compiles: the runs of one learning rate
differ only by seed, so their XLA programs repeat and two of every three compiles are skipped.

``Comparison`` validates itself (a ``ValueError`` names the field at fault). ``run`` is called
once per (method, lr, seed), in that nesting order, and must return a dict with finite or NaN
``val`` and ``test`` entries plus any extra numbers the script wants to report. A NaN (a
diverged run) makes its learning rate the worst choice for that method. Scripts run as
``python -m benchmarks.<script>`` from the repository root.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

MIN_LRS = 3
MIN_SEEDS = 3
#: allowed ratio between neighbouring learning rates of the grid ("a factor of about 3")
LR_RATIO = (2.5, 4.0)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What is compared, under which shared learning-rate grid, seeds and budget.

    Attributes:
      methods: names of the methods (at least 2, distinct); the baseline is one of them.
      lrs: the learning-rate grid every method gets; stored sorted ascending. At least
        ``MIN_LRS`` positive values, neighbours a factor ``LR_RATIO`` apart.
      seeds: at least ``MIN_SEEDS`` distinct integer seeds, the same for every method.
      budget: a description of the training budget every run gets (steps, batch, ...); one
        field for all methods, so the budget is the same by construction.
    """

    methods: tuple[str, ...]
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    budget: str

    def __post_init__(self):
        methods = tuple(self.methods)
        if len(methods) < 2 or not all(isinstance(m, str) and m for m in methods):
            raise ValueError(f"methods: need at least 2 non-empty names, got {methods!r}")
        if len(set(methods)) != len(methods):
            raise ValueError(f"methods: names must be distinct, got {methods!r}")
        try:
            lrs = tuple(sorted(float(lr) for lr in self.lrs))
        except (TypeError, ValueError) as e:
            raise ValueError(f"lrs: not a sequence of numbers: {self.lrs!r}") from e
        if len(lrs) < MIN_LRS:
            raise ValueError(f"lrs: need at least {MIN_LRS} learning rates, got {list(lrs)}")
        if not all(math.isfinite(lr) and lr > 0 for lr in lrs):
            raise ValueError(f"lrs: learning rates must be positive and finite, got {list(lrs)}")
        lo, hi = LR_RATIO
        for a, b in zip(lrs, lrs[1:]):
            if not lo <= b / a <= hi:
                raise ValueError(
                    f"lrs: neighbouring learning rates {a:g} and {b:g} are a factor {b / a:.3g} "
                    f"apart; the grid needs {lo:g} to {hi:g} (e.g. 1e-3,3e-3,1e-2)"
                )
        seeds = tuple(self.seeds)
        if not all(isinstance(s, (int, np.integer)) for s in seeds):
            raise ValueError(f"seeds: must be integers, got {seeds!r}")
        seeds = tuple(int(s) for s in seeds)
        if len(set(seeds)) < MIN_SEEDS or len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds: need at least {MIN_SEEDS} distinct seeds, got {seeds!r}")
        if not isinstance(self.budget, str) or not self.budget.strip():
            raise ValueError(f"budget: describe the shared budget in words, got {self.budget!r}")
        object.__setattr__(self, "methods", methods)
        object.__setattr__(self, "lrs", lrs)
        object.__setattr__(self, "seeds", seeds)

    def describe(self) -> str:
        """One line: the grid, the seeds and the budget."""
        lrs = ", ".join(f"{x:g}" for x in self.lrs)
        seeds = ", ".join(map(str, self.seeds))
        return (f"{len(self.methods)} methods, each on lr grid {{{lrs}}} x seeds {{{seeds}}}, "
                f"lr picked by mean validation metric; budget per run: {self.budget}")


_CACHE_DIR = None


def cache_compilations() -> None:
    """Caches XLA compilations on disk, in a temporary folder removed at exit, for this process.

    A grid repeats the same program for every seed (the learning rate, baked into the optimizer,
    is what changes it), and at benchmark scale compiling can cost more than training. Results
    are unchanged: a cache hit loads the executable the compiler would have produced. Does
    nothing if a compilation cache folder is already configured.
    """
    global _CACHE_DIR
    import tempfile

    import jax

    if jax.config.jax_compilation_cache_dir:
        return
    _CACHE_DIR = tempfile.TemporaryDirectory(prefix="jax-cache-")
    jax.config.update("jax_compilation_cache_dir", _CACHE_DIR.name)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def add_arguments(parser: argparse.ArgumentParser, *, lrs: str = "1e-3,3e-3,1e-2",
                  seeds: int = MIN_SEEDS) -> None:
    """Adds ``--lrs`` (comma list) and ``--seeds`` (a count: seeds ``0 .. n-1``) to a parser."""
    parser.add_argument("--lrs", default=lrs, type=parse_lrs,
                        help=f"comma list, the learning-rate grid of every method (default {lrs})")
    parser.add_argument("--seeds", type=_seed_count, default=seeds,
                        help=f"number of seeds per (method, lr), at least {MIN_SEEDS} "
                             f"(default {seeds})")


def _seed_count(text: str) -> int:
    n = int(text)
    if n < MIN_SEEDS:
        raise argparse.ArgumentTypeError(f"at least {MIN_SEEDS} seeds, got {n}")
    return n


def parse_lrs(text: str) -> tuple[float, ...]:
    """``"1e-3,3e-3,1e-2"`` -> ``(0.001, 0.003, 0.01)``."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--lrs: not a comma list of numbers: {text!r}") from e


def mean_std(values) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1; 0 for a single value)."""
    v = np.asarray(values, dtype=float)
    return float(np.mean(v)), (float(np.std(v, ddof=1)) if v.size > 1 else 0.0)


def format_pm(values, fmt: str = ".4f") -> str:
    """``"mean ± std"`` of ``values`` (see :func:`mean_std`)."""
    m, s = mean_std(values)
    return f"{m:{fmt}} ± {s:{fmt}}"


def format_each(values, fmt: str = ".4f") -> str:
    """Every value, comma separated (one per seed)."""
    return ", ".join(f"{v:{fmt}}" for v in values)


@dataclasses.dataclass(frozen=True)
class ComparisonResult:
    """Every run's record, and each method's learning rate picked by validation.

    Attributes:
      spec: the :class:`Comparison` that was run.
      records: ``(method, lr, seed) -> dict`` as returned by ``run`` (``val``, ``test``, extras).
      seconds: ``(method, lr, seed) -> wall seconds`` of that call.
      higher_is_better: whether a larger metric is better (accuracy) or smaller (loss).
      metric: the metric's name, for table headers.
    """

    spec: Comparison
    records: Mapping[tuple[str, float, int], Mapping]
    seconds: Mapping[tuple[str, float, int], float]
    higher_is_better: bool = False
    metric: str = "loss"

    def values(self, method: str, lr: float, key: str = "val") -> np.ndarray:
        """``key`` of every seed's record at (method, lr), in seed order."""
        return np.array([float(self.records[method, lr, s][key]) for s in self.spec.seeds])

    def _score(self, method: str, lr: float) -> float:
        """Mean validation metric, oriented so that larger is better; NaN counts as worst."""
        m = float(np.mean(self.values(method, lr, "val")))
        if not math.isfinite(m):
            return -math.inf
        return m if self.higher_is_better else -m

    def best_lr(self, method: str) -> float:
        """The grid value with the best mean validation metric (first one on a tie)."""
        return max(self.spec.lrs, key=lambda lr: self._score(method, lr))

    def at_best(self, method: str, key: str = "test") -> np.ndarray:
        """``key`` of every seed at the method's best learning rate."""
        return self.values(method, self.best_lr(method), key)

    def on_edge(self, method: str) -> bool:
        """Whether the best learning rate is the grid's smallest or largest value, so the
        optimum may lie outside the grid (widen it before trusting the comparison)."""
        return self.best_lr(method) in (self.spec.lrs[0], self.spec.lrs[-1])

    def grid_table(self, fmt: str = ".4f", labels: Mapping[str, str] | None = None) -> str:
        """Markdown: every (method, lr), validation mean ± std over seeds and every seed;
        the picked rate is marked **best**. ``labels`` maps method names to display names."""
        labels = labels or {}
        seeds = ", ".join(map(str, self.spec.seeds))
        lines = [f"| method | lr | val {self.metric} (mean ± std) | seeds {seeds} | picked |",
                 "|---|---|---|---|---|"]
        for method in self.spec.methods:
            best = self.best_lr(method)
            for lr in self.spec.lrs:
                v = self.values(method, lr, "val")
                mark = "**best**" if lr == best else ""
                lines.append(f"| {labels.get(method, method)} | {lr:g} | {format_pm(v, fmt)} | "
                             f"{format_each(v, fmt)} | {mark} |")
        return "\n".join(lines)

    def summary_table(self, *, baseline: str | None = None, fmt: str = ".4f",
                      extras: Sequence[tuple[str, str, str]] = (),
                      labels: Mapping[str, str] | None = None) -> str:
        """Markdown: per method, the best lr, the test metric there (mean ± std and every
        seed), the ratio of its mean to ``baseline``'s, and ``extras``: ``(header, key, fmt)``
        columns showing the mean over seeds of a record entry at the best lr. A best lr on the
        grid's edge is marked "(edge)"."""
        if baseline is not None and baseline not in self.spec.methods:
            raise ValueError(f"baseline: {baseline!r} is not one of {self.spec.methods}")
        labels = labels or {}
        head = (f"| method | best lr (by val) | test {self.metric} (mean ± std) | every seed |"
                + (f" vs {labels.get(baseline, baseline)} |" if baseline else "")
                + "".join(f" {h} |" for h, _, _ in extras))
        lines = [head, "|" + "---|" * head.count(" |")]
        base = float(np.mean(self.at_best(baseline))) if baseline else None
        for method in self.spec.methods:
            t = self.at_best(method)
            lr = f"{self.best_lr(method):g}" + (" (edge)" if self.on_edge(method) else "")
            row = (f"| {labels.get(method, method)} | {lr} | {format_pm(t, fmt)} | "
                   f"{format_each(t, fmt)} |")
            if baseline:
                row += f" {float(np.mean(t)) / base:.3f} |"
            for _, key, efmt in extras:
                row += f" {float(np.mean(self.at_best(method, key))):{efmt}} |"
            lines.append(row)
        return "\n".join(lines)

    def verdict(self, a: str, b: str, *, key: str = "test", fmt: str = ".4f") -> str:
        """One line comparing ``a`` and ``b`` at their best rates: a winner only when the
        mean ± std intervals do not overlap, "within spread" when they do, and no verdict
        when a side is not finite on some seed (a diverged run is not a tie)."""
        stats = {m: mean_std(self.at_best(m, key)) for m in (a, b)}
        (ma, sa), (mb, sb) = stats[a], stats[b]
        tail = f"each at its best lr, {len(self.spec.seeds)} seeds"
        bad = [m for m in (a, b) if not all(map(math.isfinite, stats[m]))]
        if bad:
            return (f"{a} vs {b}: no verdict, {' and '.join(bad)} not finite ({key} "
                    f"{self.metric} {ma:{fmt}} ± {sa:{fmt}} vs {mb:{fmt}} ± {sb:{fmt}}, {tail})")
        if abs(ma - mb) <= sa + sb:
            return (f"{a} vs {b}: within spread ({key} {self.metric} {ma:{fmt}} ± {sa:{fmt}} "
                    f"vs {mb:{fmt}} ± {sb:{fmt}}, {tail})")
        winner, loser = (a, b) if (ma > mb) == self.higher_is_better else (b, a)
        (mw, sw), (ml, sl) = stats[winner], stats[loser]
        return (f"{winner} better than {loser} ({key} {self.metric} {mw:{fmt}} ± {sw:{fmt}} vs "
                f"{ml:{fmt}} ± {sl:{fmt}}, {tail})")

    def total_seconds(self) -> float:
        """Wall seconds of all the runs together."""
        return float(sum(self.seconds.values()))


def validation_and_test(corpus, batch_size: int, seq_len: int, eval_batches: int):
    """The rule's two held-out splits of a :class:`jaxlib_ext.core.data.Corpus`: ``(corpus, test)``.

    The corpus's held-out tail is cut in two: the returned corpus keeps the first half as its
    ``eval`` split (what :func:`jaxlib_ext.core.train.fit` evaluates, the validation metric
    that picks each method's learning rate), and ``test`` is ``eval_batches`` fixed windows
    ``[batch_size, seq_len + 1]`` of the second half, on which the picked runs are reported.
    """
    from jaxlib_ext.core import data

    half = corpus.eval.size // 2
    test_tokens = corpus.eval[half:]
    offsets = data.eval_batches(test_tokens, batch_size, seq_len, eval_batches)
    test = [np.stack([test_tokens[o:o + seq_len + 1] for o in offs]) for offs in offsets]
    return dataclasses.replace(corpus, eval=corpus.eval[:half]), test


def run_comparison(spec: Comparison, run: Callable[[str, float, int], Mapping], *,
                   higher_is_better: bool = False, metric: str = "loss",
                   log: Callable[[str], None] | None = None) -> ComparisonResult:
    """Calls ``run(method, lr, seed)`` for every method, lr and seed of ``spec``.

    ``run`` returns a mapping with ``val`` and ``test`` (the validation and test metric of
    that run) and any extra entries. ``log`` (flushed ``print`` by default) gets one line per
    run. Raises ``ValueError`` if a record lacks ``val`` or ``test``.
    """
    log = log or (lambda line: print(line, flush=True))
    records, seconds = {}, {}
    for method in spec.methods:
        for lr in spec.lrs:
            for seed in spec.seeds:
                t0 = time.perf_counter()
                rec = run(method, lr, seed)
                seconds[method, lr, seed] = time.perf_counter() - t0
                missing = {"val", "test"} - set(rec)
                if missing:
                    raise ValueError(f"run: the record of ({method!r}, {lr:g}, {seed}) lacks "
                                     f"{sorted(missing)}; return val and test")
                records[method, lr, seed] = dict(rec)
                log(f"{method} lr {lr:g} seed {seed}: val {float(rec['val']):.4f}, "
                    f"test {float(rec['test']):.4f} ({seconds[method, lr, seed]:.0f} s)")
    return ComparisonResult(spec, records, seconds, higher_is_better, metric)
