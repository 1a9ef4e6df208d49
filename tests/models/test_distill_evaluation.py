"""Task suite and Win-and-Tie metric of the distillation evaluation: hand-made score tables,
oracle models, and the suite on a tiny Llama teacher and its xLSTM student."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.core.data import ByteTokenizer, embedded_text
from jaxlib_ext.models import LanguageModel, lm_config
from jaxlib_ext.models.distill.evaluation import (
    SuiteConfig,
    TaskScore,
    cloze_accuracy,
    cloze_items,
    cloze_texts,
    continuation_agreement,
    critical_tolerance,
    evaluate_suite,
    greedy_continuations,
    logits_fn,
    next_token_metrics,
    summarize,
    tolerance_gaps,
    win_and_tie_rate,
)
from jaxlib_ext.models.xlstm import XLSTMConfig, student_from_teacher

TEACHER = np.array([0.50, 0.70, 0.30, 0.90, 0.62])
STUDENT = np.array([0.52, 0.65, 0.30, 0.80, 0.61])  # gaps 0, .05, 0, .10, .01


# --------------------------------------------------------------------------- Win-and-Tie


def test_c_zero_is_the_win_or_tie_fraction():
    assert win_and_tie_rate(STUDENT, TEACHER, 0.0) == pytest.approx(np.mean(STUDENT >= TEACHER))
    assert win_and_tie_rate(STUDENT, TEACHER, 0.0) == pytest.approx(0.4)


def test_c_alpha_is_monotone_and_steps_at_the_gaps():
    alphas = np.linspace(0.0, 0.2, 81)
    for relative in (False, True):
        c = [win_and_tie_rate(STUDENT, TEACHER, a, relative=relative) for a in alphas]
        assert all(b >= a for a, b in zip(c, c[1:]))
        assert c[-1] == 1.0
    # absolute: steps at 0.01, 0.05, 0.10
    expected = {0.0: 0.4, 0.009: 0.4, 0.0101: 0.6, 0.049: 0.6, 0.0501: 0.8, 0.0999: 0.8,
                0.1001: 1.0}
    for a, want in expected.items():
        assert win_and_tie_rate(STUDENT, TEACHER, a) == pytest.approx(want), a


def test_alpha_star_absolute_is_the_largest_deficit():
    a_star = critical_tolerance(STUDENT, TEACHER)
    assert a_star == pytest.approx(np.max(TEACHER - STUDENT))
    assert win_and_tie_rate(STUDENT, TEACHER, a_star) == 1.0
    assert win_and_tie_rate(STUDENT, TEACHER, a_star - 1e-9) < 1.0


def test_alpha_star_relative_and_partial_targets():
    rel = (TEACHER - STUDENT) / TEACHER
    a_star = critical_tolerance(STUDENT, TEACHER, relative=True)
    assert a_star == pytest.approx(np.max(np.maximum(rel, 0)))
    assert win_and_tie_rate(STUDENT, TEACHER, a_star, relative=True) == 1.0
    # target 0.6: the third-smallest absolute gap (0, 0, 0.01, 0.05, 0.10)
    assert critical_tolerance(STUDENT, TEACHER, target=0.6) == pytest.approx(0.01)
    assert critical_tolerance(STUDENT, TEACHER, target=0.4) == 0.0
    for target in (0.2, 0.5, 0.8, 1.0):
        a = critical_tolerance(STUDENT, TEACHER, target=target)
        assert win_and_tie_rate(STUDENT, TEACHER, a) >= target
        smaller = [g for g in tolerance_gaps(STUDENT, TEACHER) if g < a]
        if smaller:  # any smaller tolerance misses the target
            assert win_and_tie_rate(STUDENT, TEACHER, max(smaller)) < target


def test_student_better_everywhere_and_zero_teacher_scores():
    assert critical_tolerance(TEACHER + 0.01, TEACHER) == 0.0
    assert win_and_tie_rate(TEACHER + 0.01, TEACHER, 0.0) == 1.0
    gaps = tolerance_gaps([0.0, -0.1, 0.2], [0.0, 0.0, 0.1], relative=True)
    np.testing.assert_array_equal(gaps, [0.0, np.inf, 0.0])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: win_and_tie_rate([0.1, 0.2], [0.1], 0.0), "one length"),
        (lambda: win_and_tie_rate([], [], 0.0), "non-empty"),
        (lambda: win_and_tie_rate([0.1], [0.2], -0.1), "alpha"),
        (lambda: win_and_tie_rate([np.nan], [0.2], 0.1), "finite"),
        (lambda: critical_tolerance([0.1], [0.2], target=0.0), "target"),
        (lambda: critical_tolerance([0.1], [0.2], target=1.5), "target"),
        (lambda: SuiteConfig(seq_len=1), "seq_len"),
        (lambda: SuiteConfig(alphas=(-0.1,)), "alphas"),
        (lambda: summarize([TaskScore("d", "perplexity", 2.0, 3.0, False)]), "rows"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------------------- tasks


def oracle(vocab):
    """A 'model' that reads the next token off its input: exact teacher-forced predictions."""

    def model(tokens):
        nxt = jnp.roll(tokens, -1, axis=1)
        return 30.0 * jax.nn.one_hot(nxt, vocab)

    return model


def test_next_token_metrics_of_an_oracle_and_of_uniform_logits():
    windows = np.random.default_rng(0).integers(0, 50, size=(5, 17)).astype(np.int32)
    m = next_token_metrics(oracle(50), windows, batch_size=2)
    assert m["accuracy"] == 1.0 and m["perplexity"] == pytest.approx(1.0, abs=1e-6)
    uniform = next_token_metrics(lambda t: jnp.zeros((*t.shape, 50)), windows, batch_size=4)
    assert uniform["perplexity"] == pytest.approx(50.0, rel=1e-5)


def test_next_token_metrics_match_a_direct_computation_on_a_llama():
    model = LanguageModel(lm_config(None, None, "llama-tiny", vocab_size=61), rngs=nnx.Rngs(0))
    windows = np.random.default_rng(1).integers(0, 61, size=(3, 12)).astype(np.int32)
    m = next_token_metrics(logits_fn(model), windows, batch_size=2)
    logits = model(jnp.asarray(windows))
    logp = np.asarray(jax.nn.log_softmax(logits[:, :-1]), np.float64)
    nll = -np.take_along_axis(logp, windows[:, 1:, None], axis=-1).mean()
    assert m["nll"] == pytest.approx(nll, rel=1e-5)
    assert m["accuracy"] == pytest.approx(np.mean(logp.argmax(-1) == windows[:, 1:]))


def test_cloze_items_target_the_last_word():
    text = embedded_text()[:20000]
    tok = ByteTokenizer()
    items = cloze_items(text, tok, n_items=10, context_chars=80, max_tokens=60)
    assert 1 <= len(items) <= 10 and items.tokens.shape[1] <= 60
    for row, target in zip(items.tokens, items.target):
        word = tok.decode(row[target])
        assert word[0] == " " and word[1:].isalpha() and len(word) >= 4
        before = tok.decode(row[: np.argmax(target)])
        assert not before[-1].isspace()
    assert cloze_accuracy(oracle(256), items, batch_size=4) == 1.0
    assert cloze_accuracy(lambda t: jnp.zeros((*t.shape, 256)), items) == 0.0
    with pytest.raises(ValueError, match="text"):
        cloze_items("short", tok, context_chars=80)


def test_cloze_texts_keep_the_domains_that_yield_items():
    text = embedded_text()[:20000]
    config = SuiteConfig(cloze_context_chars=80, cloze_max_tokens=60)
    kept = cloze_texts({"prose": text, "numbers": "1 2 3 " * 200}, ByteTokenizer(), config)
    assert kept == {"prose": text}


def test_greedy_continuations_and_agreement():
    # a model that always predicts (last token + 1) mod V from each position
    model = lambda t: 10.0 * jax.nn.one_hot((t + 1) % 13, 13)  # noqa: E731
    prompts = np.array([[1, 2, 3], [7, 8, 9], [12, 0, 5]], np.int32)
    out = greedy_continuations(model, prompts, 4, batch_size=2)
    np.testing.assert_array_equal(out[0], [4, 5, 6, 7])
    np.testing.assert_array_equal(out[2], [6, 7, 8, 9])
    assert continuation_agreement(out, out) == 1.0
    other = out.copy()
    other[0, 2] = 0  # first difference at 2 of 4
    other[1, 0] = 0  # at 0
    assert continuation_agreement(other, out) == pytest.approx((0.5 + 0.0 + 1.0) / 3)


# --------------------------------------------------------------------------- the suite


@pytest.fixture(scope="module")
def tiny_pair():
    cfg = lm_config(None, None, "llama-tiny", d_model=48, head_dim=12, mlp_hidden=96,
                    max_seq_len=512)
    teacher = LanguageModel(cfg, rngs=nnx.Rngs(0))
    student = student_from_teacher(teacher, XLSTMConfig(window=16, chunk_size=16),
                                   rngs=nnx.Rngs(1))
    return teacher, student


SMALL = SuiteConfig(seq_len=32, n_windows=4, batch_size=4, cloze_items=4,
                    cloze_context_chars=60, cloze_max_tokens=48, n_prompts=4, prompt_len=8,
                    n_new=4, alphas=(0.0, 0.05))


def _held_out():
    tok = ByteTokenizer()
    text = {"docs": embedded_text()[:3000], "code": "def f(x):\n    return x + offset\n" * 60}
    return {d: tok.encode(t) for d, t in text.items()}, text, tok


def test_suite_of_a_model_against_itself_is_lossless(tiny_pair, tmp_path):
    teacher, _ = tiny_pair
    held, text, tok = _held_out()
    fn = logits_fn(teacher)
    report = evaluate_suite(fn, fn, held, held_out_text=text, tokenizer=tok, config=SMALL)
    tasks = {(r.domain, r.task) for r in report.rows}
    assert len(report.rows) == 8 and ("code", "cloze") in tasks
    assert all(r.difference == 0.0 for r in report.rows)
    assert report.alpha_star == {"absolute": 0.0, "relative": 0.0}
    assert report.c_alpha["absolute"][0.0] == 1.0
    saved = json.loads(report.save_json(tmp_path / "eval.json").read_text())
    assert saved["alpha_star"]["absolute"] == 0.0 and len(saved["rows"]) == 8


def test_suite_of_a_student(tiny_pair):
    teacher, student = tiny_pair
    held, _, _ = _held_out()
    report = evaluate_suite(logits_fn(teacher), logits_fn(student), held, config=SMALL)
    assert [r.task for r in report.rows[:3]] == ["next_token_accuracy", "perplexity",
                                                 "greedy_agreement"]
    for r in report.rows:
        assert np.isfinite(r.teacher) and np.isfinite(r.student)
    counted = [r for r in report.rows if r.task != "perplexity"]
    gaps = [max(0.0, r.teacher - r.student) for r in counted]
    assert report.alpha_star["absolute"] == pytest.approx(max(gaps))
    c = report.c_alpha["absolute"]
    assert c[0.0] <= c[0.05]
    table = report.to_markdown()
    assert "| docs | perplexity (lower is better) |" in table and "alpha*" in table
    with pytest.raises(ValueError, match="tokenizer"):
        evaluate_suite(teacher, student, held, held_out_text={"docs": "x"}, config=SMALL)
    with pytest.raises(ValueError, match="held_out"):
        evaluate_suite(teacher, student, {}, config=SMALL)
