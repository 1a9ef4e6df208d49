"""Task suite and Win-and-Tie metric of the distillation evaluation: hand-made score tables
(Eq. 17 of arXiv 2603.15590), oracle models, the multiple-choice task, and the suite on a tiny
Llama teacher and its xLSTM student."""

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
    DIAGNOSTIC_TASKS,
    TASKS,
    WIN_AND_TIE_TASKS,
    MultipleChoiceItems,
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
    multiple_choice_accuracy,
    multiple_choice_items,
    multiple_choice_log_likelihoods,
    multiple_choice_texts,
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
    for relative in (True, False):
        c0 = win_and_tie_rate(STUDENT, TEACHER, 0.0, relative=relative)
        assert c0 == pytest.approx(np.mean(STUDENT >= TEACHER)) == pytest.approx(0.4)


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
        assert win_and_tie_rate(STUDENT, TEACHER, a, relative=False) == pytest.approx(want), a
    # relative: steps at .01 / .62, .05 / .7, .1 / .9
    expected = {0.016: 0.4, 0.0162: 0.6, 0.071: 0.6, 0.0715: 0.8, 0.111: 0.8, 0.1112: 1.0}
    for a, want in expected.items():
        assert win_and_tie_rate(STUDENT, TEACHER, a) == pytest.approx(want), a


def test_defaults_are_the_papers_relative_tolerance_and_target_one_half():
    # relative gaps 0, .05/.7, 0, .1/.9, .01/.62; n = 5: alpha* is the 3rd smallest
    assert critical_tolerance(STUDENT, TEACHER) == pytest.approx(0.01 / 0.62)
    assert critical_tolerance(STUDENT, TEACHER) == critical_tolerance(
        STUDENT, TEACHER, relative=True, target=0.5)
    assert win_and_tie_rate(STUDENT, TEACHER, 0.05) == win_and_tie_rate(
        STUDENT, TEACHER, 0.05, relative=True) == pytest.approx(0.6)
    np.testing.assert_allclose(tolerance_gaps(STUDENT, TEACHER),
                               [0.0, 0.05 / 0.7, 0.0, 0.1 / 0.9, 0.01 / 0.62])
    config = SuiteConfig()
    assert config.target == 0.5 and config.alphas == (0.0, 0.01, 0.02, 0.05, 0.1)


def test_alpha_star_absolute_is_the_largest_deficit_at_target_one():
    a_star = critical_tolerance(STUDENT, TEACHER, relative=False, target=1.0)
    assert a_star == pytest.approx(np.max(TEACHER - STUDENT))
    assert win_and_tie_rate(STUDENT, TEACHER, a_star, relative=False) == 1.0
    assert win_and_tie_rate(STUDENT, TEACHER, a_star - 1e-9, relative=False) < 1.0


def test_alpha_star_relative_and_partial_targets():
    rel = (TEACHER - STUDENT) / TEACHER
    a_star = critical_tolerance(STUDENT, TEACHER, target=1.0)
    assert a_star == pytest.approx(np.max(np.maximum(rel, 0)))
    assert win_and_tie_rate(STUDENT, TEACHER, a_star) == 1.0
    # target 0.6: the third-smallest absolute gap (0, 0, 0.01, 0.05, 0.10)
    assert critical_tolerance(STUDENT, TEACHER, relative=False, target=0.6) == pytest.approx(0.01)
    assert critical_tolerance(STUDENT, TEACHER, relative=False, target=0.4) == 0.0
    for relative in (False, True):
        for target in (0.2, 0.5, 0.8, 1.0):
            a = critical_tolerance(STUDENT, TEACHER, relative=relative, target=target)
            assert win_and_tie_rate(STUDENT, TEACHER, a, relative=relative) >= target
            smaller = [g for g in tolerance_gaps(STUDENT, TEACHER, relative=relative) if g < a]
            if smaller:  # any smaller tolerance misses the target
                assert win_and_tie_rate(STUDENT, TEACHER, max(smaller),
                                        relative=relative) < target


def test_eq17_by_hand_with_four_tasks():
    teacher = [0.8, 0.5, 0.6, 0.4]
    # a tie, a win, relative gaps .12 / .6 = .2 and .1 / .4 = .25
    student = [0.8, 0.55, 0.48, 0.3]
    np.testing.assert_allclose(tolerance_gaps(student, teacher), [0.0, 0.0, 0.2, 0.25])
    assert win_and_tie_rate(student, teacher, 0.0) == 0.5  # 2 of 4: C_0 >= 0.5
    assert critical_tolerance(student, teacher) == 0.0  # ceil(4 / 2) = 2nd smallest gap
    # one tie only: gaps 0, .1, .2, .25 -> alpha* = .1 (2 of 4 within .1, 1 of 4 below)
    student = [0.8, 0.45, 0.48, 0.3]
    assert critical_tolerance(student, teacher) == pytest.approx(0.1)
    assert win_and_tie_rate(student, teacher, 0.0) == 0.25
    assert win_and_tie_rate(student, teacher, 0.1) == 0.5
    assert win_and_tie_rate(student, teacher, 0.099) == 0.25
    # absolute: gaps 0, .05, .12, .1 -> 2nd smallest .05
    assert critical_tolerance(student, teacher, relative=False) == pytest.approx(0.05)
    assert win_and_tie_rate(student, teacher, 0.05, relative=False) == 0.5


def test_eq17_by_hand_with_five_tasks():
    teacher = [0.5, 0.5, 0.5, 0.5, 0.5]
    student = [0.5, 0.45, 0.4, 0.3, 0.6]  # relative gaps 0, .1, .2, .4, 0 (a tie, a win)
    assert win_and_tie_rate(student, teacher, 0.0) == pytest.approx(0.4)  # 2 of 5 < 0.5
    assert win_and_tie_rate(student, teacher, 0.1) == pytest.approx(0.6)
    assert critical_tolerance(student, teacher) == pytest.approx(0.1)  # 3rd smallest gap
    assert critical_tolerance(student, teacher, target=0.4) == 0.0  # 2nd
    assert critical_tolerance(student, teacher, target=1.0) == pytest.approx(0.4)
    # absolute: gaps 0, .05, .1, .2, 0
    assert critical_tolerance(student, teacher, relative=False) == pytest.approx(0.05)
    assert critical_tolerance(student, teacher, relative=False, target=0.6) == pytest.approx(0.05)


def test_ties_wins_and_zero_teacher_scores():
    assert critical_tolerance(TEACHER + 0.01, TEACHER) == 0.0
    assert win_and_tie_rate(TEACHER + 0.01, TEACHER, 0.0) == 1.0
    np.testing.assert_array_equal(tolerance_gaps(TEACHER + 0.3, TEACHER), 0.0)  # wins: gap 0
    np.testing.assert_array_equal(tolerance_gaps(TEACHER, TEACHER), 0.0)  # ties: gap 0
    gaps = tolerance_gaps([0.0, -0.1, 0.2], [0.0, 0.0, 0.1])
    np.testing.assert_array_equal(gaps, [0.0, np.inf, 0.0])
    assert win_and_tie_rate([0.0, -0.1, 0.2], [0.0, 0.0, 0.1], 1e6) == pytest.approx(2 / 3)
    assert critical_tolerance([0.0, -0.1, 0.2], [0.0, 0.0, 0.1]) == 0.0
    assert critical_tolerance([0.0, -0.1, 0.2], [0.0, 0.0, 0.1], target=1.0) == np.inf
    np.testing.assert_allclose(tolerance_gaps([0.0, -0.1, 0.2], [0.0, 0.0, 0.1],
                                              relative=False), [0.0, 0.1, 0.0])


def test_a_gap_equal_to_alpha_is_not_lost_to_rounding():
    assert (1.0 - 0.95) / 1.0 > 0.05  # the float gap
    assert win_and_tie_rate([0.95], [1.0], 0.05) == 1.0  # s >= (1 - alpha) t with equality
    assert win_and_tie_rate([0.85], [0.9], 0.05, relative=False) == 1.0
    assert win_and_tie_rate([0.9499], [1.0], 0.05) == 0.0


def _rows(ns_student):
    return [
        TaskScore("d", "next_token_accuracy", 0.5, 0.5),  # a tie
        TaskScore("d", "perplexity", 2.0, 9.0, higher_is_better=False),
        TaskScore("d", "cloze", 0.4, 0.3),  # relative gap .25
        TaskScore("d", "next_sentence", 0.6, ns_student),
        TaskScore("d", "greedy_agreement", 1.0, 0.1),
    ]


def test_the_diagnostics_are_rows_but_not_counted_and_the_lossless_flag():
    assert "greedy_agreement" not in WIN_AND_TIE_TASKS and "perplexity" not in WIN_AND_TIE_TASKS
    assert set(DIAGNOSTIC_TASKS) == {"perplexity", "greedy_agreement"}
    assert sorted(TASKS) == sorted(WIN_AND_TIE_TASKS + DIAGNOSTIC_TASKS)
    report = summarize(_rows(0.62))  # next_sentence: a win -> C_0 = 2 / 3
    assert [r.task for r in report.rows] == list(TASKS)
    assert report.c_zero == pytest.approx(2 / 3) and report.lossless is True
    assert report.c_alpha["relative"][0.0] == pytest.approx(2 / 3)
    assert report.alpha_star == {"relative": 0.0, "absolute": 0.0}
    assert report.target == 0.5 and report.diagnostic_tasks == ("perplexity", "greedy_agreement")
    assert [r.task for r in report.counted_rows] == ["next_token_accuracy", "cloze",
                                                     "next_sentence"]
    # at target 1 the largest counted gap, cloze's .25 (greedy_agreement's .9 is not counted)
    assert summarize(_rows(0.62), target=1.0).alpha_star["relative"] == pytest.approx(0.25)
    table = report.to_markdown()
    assert "| d | greedy_agreement (diagnostic) |" in table
    assert "| d | perplexity (diagnostic, lower is better) |" in table
    assert "| d | cloze | 0.4000 | 0.3000 |" in table
    assert table.index("| C_alpha, relative: s >= (1 - alpha) t |") < table.index(
        "| C_alpha, absolute: s >= t - alpha |")
    assert "2 of 3 tasks; lossless (C_0 >= 0.5)" in table and "Eq. 17" in table
    saved = report.to_dict()
    assert saved["lossless"] is True and saved["n_tasks"] == 3
    assert [r["counted"] for r in saved["rows"]] == [True, False, True, True, False]

    lossy = summarize(_rows(0.5))  # next_sentence gap .1 / .6: C_0 = 1 / 3
    assert lossy.lossless is False and lossy.c_zero == pytest.approx(1 / 3)
    assert lossy.alpha_star["relative"] == pytest.approx(0.1 / 0.6)  # 2nd of 0, 1/6, 1/4
    assert "not lossless (C_0 < 0.5)" in lossy.to_markdown()


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
        (lambda: SuiteConfig(mc_choices=1), "mc_choices"),
        (lambda: SuiteConfig(mc_unit="words"), "mc_unit"),
        (lambda: SuiteConfig(mc_seed=-1), "mc_seed"),
        (lambda: summarize([TaskScore("d", "perplexity", 2.0, 3.0, False)]), "rows"),
        (lambda: summarize([TaskScore("d", "greedy_agreement", 1.0, 1.0)]), "rows"),
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


# --------------------------------------------------------------------------- multiple choice

PROSE = embedded_text()[:30000].encode("ascii", "ignore").decode()  # bytes = characters
MC = {"n_items": 12, "n_choices": 4, "context_chars": 200, "max_tokens": 96}


def text_oracle(text):
    """A byte-level 'model' that knows ``text``: where its input up to a position is a piece of
    the text, it predicts the byte that follows that piece's first occurrence (logit 30), and
    nothing (uniform logits) elsewhere."""
    data = text.encode()

    def model(tokens):
        tokens = np.asarray(tokens)
        logits = np.zeros((*tokens.shape, 256), np.float32)
        for b, row in enumerate(tokens):
            for j in range(len(row)):
                at = data.find(bytes(row[: j + 1].astype(np.uint8).tolist()))
                if at < 0:
                    break  # so is every longer prefix
                if at + j + 1 < len(data):
                    logits[b, j, data[at + j + 1]] = 30.0
        return jnp.asarray(logits)

    return model


def uniform(tokens):
    return jnp.zeros((*tokens.shape, 256))


@pytest.fixture(scope="module")
def prose_items():
    return multiple_choice_items(PROSE, ByteTokenizer(), **MC)


def _key(s):
    return " ".join(s.split())


def test_multiple_choice_items_shapes_padding_and_choices(prose_items):
    items, tok = prose_items, ByteTokenizer()
    n = len(items)
    assert 8 <= n <= 12 and items.n_choices == 4
    assert items.tokens.shape == items.target.shape == (n, 4, 96)
    assert items.tokens.dtype == np.int32 and items.target.dtype == bool
    assert items.answer.shape == (n,) and items.char_lengths.shape == (n, 4)
    assert set(items.answer.tolist()) <= {0, 1, 2, 3} and len(set(items.answer.tolist())) > 1
    for i in range(n):
        choices, context = items.choices[i], items.contexts[i]
        true = choices[items.answer[i]]
        assert context + true in PROSE  # the actual continuation
        assert len({_key(c) for c in choices}) == 4  # distinct, none equal to the answer
        sep = true[: len(true) - len(true.lstrip())]
        assert sep and all(c.startswith(sep) and not c[len(sep)].isspace() for c in choices)
        for c in choices:
            if c is not true:
                assert c[len(sep):] not in context
        starts = {int(np.argmax(t)) for t in items.target[i]}
        assert len(starts) == 1  # one context for all candidates
        start = starts.pop()
        assert (items.tokens[i, :, :start] == items.tokens[i, :1, :start]).all()
        assert tok.decode(items.tokens[i, 0, :start]) in context
        for c in range(4):
            target, row = items.target[i, c], items.tokens[i, c]
            end = start + int(target.sum())
            assert target[start:end].all() and not target[end:].any()  # contiguous
            assert (row[end:] == 0).all()  # padding
            assert tok.decode(row[target]) == choices[c]
            assert items.char_lengths[i, c] == len(choices[c])
            assert int(target.sum()) <= 48 + len(sep)
    again = multiple_choice_items(PROSE, tok, **MC)
    np.testing.assert_array_equal(again.tokens, items.tokens)
    other = multiple_choice_items(PROSE, tok, **MC, seed=1)
    assert other.choices != items.choices


def test_multiple_choice_a_model_that_knows_the_text_scores_one(prose_items):
    model = text_oracle(PROSE)
    assert multiple_choice_accuracy(model, prose_items, batch_size=8) == 1.0
    assert multiple_choice_accuracy(model, prose_items, normalize=True, batch_size=8) == 1.0


def test_multiple_choice_a_uniform_model_ties_and_the_first_candidate_wins(prose_items):
    items = prose_items
    ll = multiple_choice_log_likelihoods(uniform, items, batch_size=5)
    np.testing.assert_allclose(ll, -items.target.sum(-1) * np.log(256.0), rtol=1e-6)
    per_char = ll / items.char_lengths  # one byte per character: exact ties
    assert (per_char == per_char[:, :1]).all()
    tie_break = np.mean(items.answer == 0)
    assert 0.0 < tie_break < 1.0  # the answer's position is shuffled
    assert multiple_choice_accuracy(uniform, items, normalize=True) == pytest.approx(tie_break)
    # acc: the fewest tokens wins under uniform logits
    shortest = np.argmin(items.target.sum(-1), axis=1)
    assert multiple_choice_accuracy(uniform, items) == pytest.approx(
        np.mean(shortest == items.answer))


def test_multiple_choice_units_lines_for_code_and_sentences_for_prose():
    import inspect
    import json.decoder

    code = inspect.getsource(json.decoder)
    tok = ByteTokenizer()
    items = multiple_choice_items(code, tok, n_items=6, context_chars=120, max_tokens=96)
    assert len(items) >= 3
    for choices in items.choices:  # a newline, the true line's indentation, a stripped line
        assert all(c.startswith("\n") and "\n" not in c.strip() for c in choices)
        seps = {c[: len(c) - len(c.lstrip())] for c in choices}
        assert len(seps) == 1
    as_lines = multiple_choice_items(PROSE, tok, **MC, unit="lines")
    assert all("\n" not in c.strip() for cs in as_lines.choices for c in cs)
    auto = multiple_choice_items(PROSE, tok, **MC)
    sentences = multiple_choice_items(PROSE, tok, **MC, unit="sentences")
    assert auto.choices == sentences.choices != as_lines.choices
    assert all(c.rstrip()[-1] in ".?!" for cs in sentences.choices for c in cs)


def test_multiple_choice_texts_keep_the_domains_that_yield_items():
    config = SuiteConfig(mc_items=4, mc_context_chars=200, mc_max_tokens=96)
    texts = {"prose": PROSE, "repeated": "def f(x):\n    return x + offset\n" * 60}
    assert multiple_choice_texts(texts, ByteTokenizer(), config) == {"prose": PROSE}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_choices": 1}, "n_choices"),
        ({"n_items": 0}, "n_items"),
        ({"max_tokens": 1}, "max_tokens"),
        ({"seed": -1}, "seed"),
        ({"unit": "words"}, "unit"),
        ({"text": "short"}, "text"),
        ({"text": "def f(x):\n    return x + offset\n" * 60}, "fewer than n_choices"),
        ({"context_chars": 10**6}, "context"),
    ],
)
def test_multiple_choice_bad_input(kwargs, match):
    kwargs = {"text": PROSE, **kwargs}
    with pytest.raises(ValueError, match=match):
        multiple_choice_items(kwargs.pop("text"), ByteTokenizer(), **kwargs)


def test_multiple_choice_items_is_a_frozen_dataclass(prose_items):
    assert isinstance(prose_items, MultipleChoiceItems)
    with pytest.raises(AttributeError):
        prose_items.answer = None


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
                    n_new=4, alphas=(0.0, 0.05), mc_items=4, mc_context_chars=60,
                    mc_max_tokens=128)


def _held_out():
    tok = ByteTokenizer()
    text = {"docs": embedded_text()[:6000], "code": "def f(x):\n    return x + offset\n" * 60}
    return {d: tok.encode(t) for d, t in text.items()}, text, tok


def test_suite_of_a_model_against_itself_is_lossless(tiny_pair, tmp_path):
    teacher, _ = tiny_pair
    held, text, tok = _held_out()
    fn = logits_fn(teacher)
    report = evaluate_suite(fn, fn, held, held_out_text=text, tokenizer=tok, config=SMALL)
    tasks = [(r.domain, r.task) for r in report.rows]
    # the repeated code has two distinct lines: no next_sentence items, the task is left out
    assert tasks == [("docs", t) for t in TASKS] + [
        ("code", t) for t in TASKS if t != "next_sentence"]
    assert all(r.difference == 0.0 for r in report.rows)
    assert report.alpha_star == {"relative": 0.0, "absolute": 0.0}
    assert report.c_alpha["relative"][0.0] == report.c_alpha["absolute"][0.0] == 1.0
    assert report.lossless is True and report.c_zero == 1.0 and report.target == 0.5
    saved = json.loads(report.save_json(tmp_path / "eval.json").read_text())
    assert saved["alpha_star"]["relative"] == 0.0 and len(saved["rows"]) == 9
    assert saved["lossless"] is True and saved["n_tasks"] == 5
    assert saved["diagnostic_tasks"] == ["perplexity", "greedy_agreement"]


def test_suite_of_a_student(tiny_pair):
    teacher, student = tiny_pair
    held, text, tok = _held_out()
    t_fn, s_fn = logits_fn(teacher), logits_fn(student)
    report = evaluate_suite(t_fn, s_fn, held, config=SMALL)
    assert [r.task for r in report.rows[:3]] == ["next_token_accuracy", "perplexity",
                                                 "greedy_agreement"]
    for r in report.rows:
        assert np.isfinite(r.teacher) and np.isfinite(r.student)
    counted = [r for r in report.rows if r.task in WIN_AND_TIE_TASKS]
    assert [r.task for r in counted] == ["next_token_accuracy"] * 2
    s, t = [r.student for r in counted], [r.teacher for r in counted]
    assert report.alpha_star["absolute"] == pytest.approx(
        critical_tolerance(s, t, relative=False, target=0.5))
    gaps = sorted(max(0.0, (r.teacher - r.student) / r.teacher) for r in counted)
    assert report.alpha_star["relative"] == pytest.approx(gaps[0])  # ceil(2 / 2) = 1st
    assert report.lossless == (report.c_zero >= 0.5)
    c = report.c_alpha["relative"]
    assert c[0.0] <= c[0.05]
    table = report.to_markdown()
    assert "| docs | perplexity (diagnostic, lower is better) |" in table and "alpha*" in table
    assert "| docs | greedy_agreement (diagnostic) |" in table
    # with text: the next_sentence task, scored as a multiple-choice accuracy
    docs = {"docs": held["docs"]}
    with_text = evaluate_suite(t_fn, s_fn, docs, held_out_text={"docs": text["docs"]},
                               tokenizer=tok, config=SMALL)
    row = next(r for r in with_text.rows if r.task == "next_sentence")
    items = multiple_choice_items(text["docs"], tok, n_items=4, context_chars=60,
                                  max_tokens=128)
    assert row.teacher == multiple_choice_accuracy(t_fn, items, batch_size=4)
    assert row.student == multiple_choice_accuracy(s_fn, items, batch_size=4)
    with pytest.raises(ValueError, match="tokenizer"):
        evaluate_suite(teacher, student, held, held_out_text={"docs": "x"}, config=SMALL)
    with pytest.raises(ValueError, match="held_out"):
        evaluate_suite(teacher, student, {}, config=SMALL)
