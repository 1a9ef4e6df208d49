"""The benchmark package: its registry agrees with the scripts and with the README's method
table, and the shared harness measures and tabulates as documented (no wall-clock asserts)."""

import importlib.util
import math
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(name):
    # by path: the repository root stays off sys.path (it would expose the bare family folders)
    spec = importlib.util.spec_from_file_location(f"benchmarks.{name}",
                                                  ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_harness, registry = _load("_harness"), _load("registry")
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")
                 if not p.stem.startswith("_") and p.stem != "registry")


def _method_rows():
    text = (ROOT / "README.md").read_text()
    start = text.index("| method | paper |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_every_script_is_registered_and_every_registered_script_exists():
    registered = {s for v in registry.SCRIPTS.values() for s in v} | set(registry.LIBRARY_SCRIPTS)
    assert set(SCRIPTS) - registered == set(), "scripts no method names"
    assert registered - set(SCRIPTS) == set(), "registered scripts that do not exist"
    assert registry.methods_of("samplers_energy") == ["Normalized energy prior"]


def test_readme_benchmark_column_names_the_registered_scripts():
    rows = _method_rows()
    assert rows, "README.md has no method table"
    seen = set()
    for row in rows:
        keys = [k for k in registry.SCRIPTS if row[0].startswith(k)]
        assert len(keys) == 1, f"README row {row[0][:40]!r} matches registry keys {keys}"
        named = set(re.findall(r"benchmarks/(\w+)\.py", row[5]))
        assert named == set(registry.SCRIPTS[keys[0]]), row[0][:40]
        seen.add(keys[0])
    assert seen == set(registry.SCRIPTS), "registry keys without a README row"


def test_markdown_table_and_its_checks():
    table = _harness.markdown_table(["a", "b"], [[1, "x"], [2, "y"]])
    assert table.splitlines() == ["| a | b |", "|---|---:|", "| 1 | x |", "| 2 | y |"]
    with pytest.raises(ValueError, match="align"):
        _harness.markdown_table(["a", "b"], [], align="l")
    with pytest.raises(ValueError, match="row"):
        _harness.markdown_table(["a", "b"], [[1]])


def test_timing_counts_calls_and_orders_its_quantiles():
    calls = []

    def fn(x):
        calls.append(1)
        return x + 1

    t = _harness.time_call(fn, jnp.ones(3), warmup=2, repeats=4)
    assert len(calls) == 6 and t.repeats == 4
    assert 0.0 <= t.q25 <= t.median <= t.q75
    timing, carry = _harness.time_steps(lambda c: c + 1, jnp.zeros(()), warmup=1, repeats=3)
    assert float(carry) == 4.0 and timing.repeats == 3
    with pytest.raises(ValueError, match="repeats"):
        _harness.time_call(fn, 1, repeats=0)
    with pytest.raises(ValueError, match="seconds"):
        _harness.summarize([])
    peak = _harness.peak_bytes(jax.jit(lambda a: a * 2), jnp.ones((4, 4)))
    assert math.isnan(peak) or peak >= 2 * 4 * 4 * 4  # at least the argument and the output


def test_comparison_verdicts_name_a_winner_a_tie_or_a_diverged_side():
    comparison = _load("_comparison")
    spec = comparison.Comparison(methods=("a", "b", "c"), lrs=(1 / 3, 1.0, 3.0),
                                 seeds=(0, 1, 2), budget="-")
    test = {"a": (10.0, 10.2, 10.1), "b": (12.0, 12.2, 12.1), "c": (10.1, math.nan, 10.0)}
    records = {(m, lr, s): {"val": v[s], "test": v[s]}
               for m, v in test.items() for lr in spec.lrs for s in spec.seeds}
    result = comparison.ComparisonResult(spec, records, {}, higher_is_better=True,
                                         metric="PSNR")
    assert result.verdict("a", "b").startswith("b better than a")
    assert result.verdict("a", "a").startswith("a vs a: within spread")
    assert result.verdict("a", "c").startswith("a vs c: no verdict, c not finite")
