"""The distillation pipeline with a tiny random Llama as the teacher: losses, merging, the teacher
cache, stages I and II (resume included), domains and bad inputs."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.core import loop
from jaxlib_ext.core.schedule import ScheduleMismatchError
from jaxlib_ext.models import Attention, LanguageModel
from jaxlib_ext.models import distill as D
from jaxlib_ext.models.distill import stages as stages_lib

SEQ = 24


@pytest.fixture(scope="module")
def teacher():
    return D.tiny_teacher(0, n_layers=2, dim=32)


@pytest.fixture(scope="module")
def cache(teacher, tmp_path_factory):
    corpus = D.domain_corpus("docs", teacher.tokenizer, max_chars=20_000)
    windows = D.make_windows(corpus.train, 6, SEQ)
    return D.build_teacher_cache(teacher.model, teacher.tokenizer, windows,
                                 tmp_path_factory.mktemp("cache"), top_k=8, progress=False)


def _stage(steps, **kw):
    return D.StageConfig(steps=steps, batch_size=3, log_every=1, checkpoint_every=3,
                         progress=False, **kw)


# --------------------------------------------------------------------------- losses


def _logits(seed, shape):
    return 3.0 * jax.random.normal(jax.random.key(seed), shape)


def test_sparse_kd_equals_the_full_kl_when_k_is_the_vocabulary():
    s, t = _logits(0, (2, 5, 37)), _logits(1, (2, 5, 37))
    lp, ids = D.top_k_log_probs(t, 37)
    np.testing.assert_allclose(D.sparse_kd_loss(s, lp, ids), D.full_kl(s, t), rtol=1e-5)
    # an explicit float64 oracle of the full KL
    p = jax.nn.softmax(np.asarray(t, np.float64), -1)
    q = jax.nn.softmax(np.asarray(s, np.float64), -1)
    np.testing.assert_allclose(D.full_kl(s, t), np.mean(np.sum(p * np.log(p / q), -1)),
                               rtol=1e-5)


@pytest.mark.parametrize("k", [1, 4, 20])
def test_sparse_kd_is_a_nonnegative_coarsened_kl_with_zero_gradient_at_the_teacher(k):
    t = _logits(2, (3, 4, 29))
    lp, ids = D.top_k_log_probs(t, k)
    assert np.all(np.diff(np.asarray(lp), axis=-1) <= 0)
    kd = jax.jit(D.sparse_kd_loss)
    for seed in range(4):
        assert float(kd(_logits(10 + seed, t.shape), lp, ids)) >= 0.0
    # the coarsened KL in float64: k top tokens + "any other token"
    s = _logits(3, t.shape)
    p = np.asarray(jax.nn.softmax(np.asarray(t, np.float64), -1))
    q = np.asarray(jax.nn.softmax(np.asarray(s, np.float64), -1))
    top = np.asarray(ids)
    ps, qs = np.take_along_axis(p, top, -1), np.take_along_axis(q, top, -1)
    pr, qr = 1 - ps.sum(-1), 1 - qs.sum(-1)
    ref = np.mean(np.sum(ps * np.log(ps / qs), -1) + pr * np.log(pr / qr))
    np.testing.assert_allclose(kd(s, lp, ids), ref, rtol=1e-4)
    # at student = teacher: zero loss and zero gradient
    loss, grad = jax.jit(jax.value_and_grad(D.sparse_kd_loss))(t, lp, ids)
    assert abs(float(loss)) < 1e-6
    assert float(jnp.max(jnp.abs(grad))) < 1e-6


def test_stage2_loss_is_point_nine_ce_plus_point_one_kl_by_hand():
    # two positions over a vocabulary of 4, the teacher's top 2
    s = np.array([[1.0, 0.0, -1.0, 2.0], [0.5, 0.5, 0.0, -2.0]])
    t = np.array([[2.0, 1.0, 0.0, 0.0], [0.0, 3.0, 0.0, 1.0]])
    targets = np.array([3, 1])
    q = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
    p = np.exp(t) / np.exp(t).sum(-1, keepdims=True)
    ce = -np.mean(np.log(q[[0, 1], targets]))
    top = np.argsort(-p, -1)[:, :2]
    ps, qs = np.take_along_axis(p, top, -1), np.take_along_axis(q, top, -1)
    pr, qr = 1 - ps.sum(-1), 1 - qs.sum(-1)
    kl = np.mean(np.sum(ps * np.log(ps / qs), -1) + pr * np.log(pr / qr))
    lp, ids = D.top_k_log_probs(jnp.asarray(t), 2)
    loss, parts = D.distillation_loss(jnp.asarray(s), jnp.asarray(targets), lp, ids)
    np.testing.assert_allclose(parts["ce"], ce, rtol=1e-5)
    np.testing.assert_allclose(parts["kl"], kl, rtol=1e-5)
    np.testing.assert_allclose(loss, 0.9 * ce + 0.1 * kl, rtol=1e-5)
    assert D.CE_WEIGHT == 0.9
    pure, _ = D.distillation_loss(jnp.asarray(s), jnp.asarray(targets), lp, ids, ce_weight=0.0)
    np.testing.assert_allclose(pure, kl, rtol=1e-5)
    with pytest.raises(ValueError, match="ce_weight"):
        D.distillation_loss(jnp.asarray(s), jnp.asarray(targets), lp, ids, ce_weight=1.5)
    with pytest.raises(ValueError, match="targets"):
        D.next_token_cross_entropy(jnp.asarray(s), jnp.asarray(targets[:1]))


def test_alignment_loss_is_a_relative_mse():
    y = _logits(4, (2, 3, 8))
    assert float(D.alignment_loss(y, y)) == 0.0
    np.testing.assert_allclose(D.alignment_loss(jnp.zeros_like(y), y), 1.0, rtol=1e-6)


# --------------------------------------------------------------------------- merging


def test_merging_identical_students_is_the_identity_and_merging_is_linear(teacher):
    a = teacher.model
    b = nnx.clone(a)
    nnx.update(b, jax.tree.map(lambda p: p + 0.5, nnx.state(b, nnx.Param)))
    c = nnx.clone(a)
    nnx.update(c, jax.tree.map(lambda p: -p, nnx.state(c, nnx.Param)))
    pa, pb, pc = (nnx.state(m, nnx.Param) for m in (a, b, c))

    def leaves(tree):
        return [np.asarray(x) for x in jax.tree.leaves(tree)]

    for method in D.MERGE_METHODS:
        merged = D.merge_models([a, a, a], method=method, weights=[0.2, 0.3, 0.5], base=a)
        for x, y in zip(leaves(nnx.state(merged, nnx.Param)), leaves(pa), strict=True):
            np.testing.assert_array_equal(x, y)
    # linear in the weights: avg(w) = sum w_d theta_d
    for w in (0.0, 0.25, 0.9):
        got = D.weighted_average([pb, pc], [w, 1 - w])
        for x, y, z in zip(leaves(got), leaves(pb), leaves(pc), strict=True):
            np.testing.assert_allclose(x, w * y + (1 - w) * z, rtol=1e-6, atol=1e-6)
    # task arithmetic: scale 1 is the average, and it is affine in the scale
    ta = D.task_arithmetic(pa, [pb, pc], [0.5, 0.5], scale=1.0)
    for x, y in zip(leaves(ta), leaves(D.weighted_average([pb, pc])), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
    t0, t2 = (D.task_arithmetic(pa, [pb, pc], scale=s) for s in (0.0, 2.0))
    for x0, x1, x2 in zip(leaves(t0), leaves(ta), leaves(t2), strict=True):
        np.testing.assert_allclose(x1, (x0 + x2) / 2, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="weights"):
        D.weighted_average([pb, pc], [1.0])
    with pytest.raises(ValueError, match="base"):
        D.merge_models([a, b], method="task_arithmetic")


def test_lora_starts_at_the_base_model_and_merges_exactly(teacher):
    model = nnx.clone(teacher.model)
    tokens = jnp.asarray([[1, 50, 200, 7, 9]], jnp.int32)
    ref = model(tokens)
    D.add_lora_to_mlps(model, 3, rngs=nnx.Rngs(1))
    np.testing.assert_allclose(model(tokens), ref, rtol=1e-6, atol=1e-6)
    for block in model.blocks:  # move B away from 0 so that the adapters matter
        for lin in (block.mlp.gate, block.mlp.up, block.mlp.down):
            lin.lora_b.set_value(jnp.full(lin.lora_b[...].shape, 0.05))
    adapted = model(tokens)
    assert float(jnp.max(jnp.abs(adapted - ref))) > 1e-3
    D.merge_lora(model)
    assert isinstance(model.blocks[0].mlp.gate, nnx.Linear)
    np.testing.assert_allclose(model(tokens), adapted, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- cache and stages


def test_teacher_cache_holds_the_teachers_outputs_and_is_built_once(teacher, cache):
    tokens = jnp.asarray(cache.tokens[:2, :SEQ])
    io, logits = teacher.model.mixer_io(tokens, with_logits=True)
    lp, ids = D.top_k_log_probs(logits, 8)
    np.testing.assert_allclose(cache.top_log_probs[:2], lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cache.top_ids[:2], ids)
    for layer in (0, 1):
        x, y = cache.layer_io(layer)
        np.testing.assert_allclose(x[:2], io[layer][0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y[:2], io[layer][1], rtol=1e-5, atol=1e-5)
    stamp = (cache.directory / "tokens.npy").stat().st_mtime_ns
    again = D.build_teacher_cache(teacher.model, teacher.tokenizer, np.asarray(cache.tokens),
                                  cache.directory, top_k=8, progress=False)
    assert (again.directory / "tokens.npy").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="other settings"):
        D.build_teacher_cache(teacher.model, teacher.tokenizer, np.asarray(cache.tokens),
                              cache.directory, top_k=4, progress=False)


def test_stage1_on_a_student_initialised_as_the_teacher_has_loss_zero(teacher, cache, tmp_path):
    """The xLSTM student with its gate fixed to attention and a window covering the sequence is
    its teacher layer (weights copied): stage I starts, and stays, at loss 0."""
    student = D.initial_student(teacher.model, student=dict(gate="attention", window=SEQ,
                                                            n_sinks=0, chunk_size=16))
    mixers = [b.attn for b in student.blocks]
    result = D.align_layers(mixers, cache, [0, 1], _stage(2), tmp_path)
    assert [r["step"] for r in result.metrics] == [1, 2]  # steps done
    for row in result.metrics:
        assert max(row["loss"]) < 1e-10
    # stage II on the teacher itself: zero sparse KD (pure KD: ce_weight 0)
    result = D.distill_end_to_end(teacher.model, cache, _stage(1), tmp_path / "kd",
                                  ce_weight=0.0)
    assert abs(result.metrics[0]["loss"]) < 1e-6 and abs(result.metrics[0]["kl"]) < 1e-6
    assert result.metrics[0]["ce"] > 0


def test_stage1_trains_only_the_new_parameters_by_default(teacher, cache, tmp_path):
    """The pipeline's stage I leaves the copied q, k, v, o projections at the teacher's and
    trains the feature maps and gates; ``stage1_train="all"`` trains the copies too."""
    student = D.initial_student(teacher.model, student=dict(window=8, n_sinks=2, chunk_size=16,
                                                            gate_bias_init=0.0))
    mixers = [b.attn for b in student.blocks]
    new = D.new_parameters(mixers[0], teacher.model.blocks[0].attn)
    names = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(mixers[0], new))}
    assert "qkv.kernel" not in names and "out.kernel" not in names
    assert {"i_proj.kernel", "f_proj.kernel", "g_proj.kernel"} <= names
    trained = D.align_layers(mixers, cache, [0, 1], _stage(2, learning_rate=1e-2),
                             tmp_path / "new", trainable=new).trained
    every = D.align_layers(mixers, cache, [0, 1], _stage(2, learning_rate=1e-2),
                           tmp_path / "all").trained
    for j in (0, 1):
        t_attn = teacher.model.blocks[j].attn
        for name in ("qkv", "out"):
            np.testing.assert_array_equal(getattr(trained[j], name).kernel[...],
                                          getattr(t_attn, name).kernel[...])
            assert not np.array_equal(getattr(every[j], name).kernel[...],
                                      getattr(t_attn, name).kernel[...])
        assert not np.array_equal(trained[j].i_proj.kernel[...], mixers[j].i_proj.kernel[...])
    with pytest.raises(ValueError, match="trainable"):
        D.align_layers(mixers, cache, [0, 1], _stage(1), tmp_path / "none",
                       trainable=nnx.PathContains("absent"))


def test_stage1_trains_and_resumes_exactly(teacher, cache, tmp_path, monkeypatch):
    def fresh():
        cfg = teacher.config
        return [Attention(cfg.mixer, d_model=cfg.d_model, n_layers=cfg.n_layers,
                          rngs=nnx.Rngs(10 + i)) for i in range(2)]

    cfg = _stage(6, learning_rate=1e-2)
    whole = D.align_layers(fresh(), cache, [0, 1], cfg, tmp_path / "whole")
    losses = np.array([r["loss"] for r in whole.metrics])
    assert np.all(losses[-1] < losses[0])

    real = stages_lib._batch_indices

    def interrupted(seed, step, *a):
        if step == 4:
            raise KeyboardInterrupt
        return real(seed, step, *a)

    monkeypatch.setattr(stages_lib, "_batch_indices", interrupted)
    with pytest.raises(KeyboardInterrupt):
        D.align_layers(fresh(), cache, [0, 1], cfg, tmp_path / "split")
    monkeypatch.setattr(stages_lib, "_batch_indices", real)
    resumed = D.align_layers(fresh(), cache, [0, 1], cfg, tmp_path / "split")
    assert resumed.start_step == 3

    def rows(result):
        return [(r["step"], r["loss"]) for r in result.metrics]

    assert rows(resumed) == rows(whole)
    for a, b in zip(whole.trained, resumed.trained, strict=True):
        for x, y in zip(jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b)),
                        strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    # the layer axis sharded over devices: the same training
    sharded = D.align_layers(fresh(), cache, [0, 1], cfg, tmp_path / "sharded", shard_layers=True)
    placed = stages_lib._shard_layer_axis(jnp.zeros((2, 3)), 2)  # 2 layers on 2 of 8 devices
    assert len(placed.devices()) == 2 and placed.sharding.spec[0] == "layers"
    for a, b in zip(whole.trained, sharded.trained, strict=True):
        for x, y in zip(jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b)),
                        strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    # a finished stage is loaded, not trained again; other settings are refused
    again = D.align_layers(fresh(), cache, [0, 1], cfg, tmp_path / "whole")
    assert again.start_step == 6
    with pytest.raises(ValueError, match="steps"):
        D.align_layers(fresh(), cache, [0, 1], _stage(8), tmp_path / "whole")


def test_stage2_records_its_schedule_and_stops_on_a_non_finite_loss(teacher, cache, tmp_path,
                                                                     monkeypatch):
    # a short run on a longer curve, continued: one run of the whole curve
    lora = dict(train="lora", lora_rank=2)
    whole = D.distill_end_to_end(teacher.model, cache, _stage(4), tmp_path / "whole", **lora)
    D.distill_end_to_end(teacher.model, cache, _stage(2), tmp_path / "split", schedule_steps=4,
                         **lora)
    split = D.distill_end_to_end(teacher.model, cache, _stage(4), tmp_path / "split", **lora)
    assert split.start_step == 2
    assert [r["loss"] for r in split.metrics] == [r["loss"] for r in whole.metrics]
    for x, y in zip(jax.tree.leaves(nnx.state(whole.trained, nnx.Param)),
                    jax.tree.leaves(nnx.state(split.trained, nnx.Param)), strict=True):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ScheduleMismatchError, match="peak_lr"):
        D.distill_end_to_end(teacher.model, cache, _stage(4, learning_rate=1.0),
                             tmp_path / "whole", **lora)
    with pytest.raises(ValueError, match="lora_rank"):
        D.distill_end_to_end(teacher.model, cache, _stage(4), tmp_path / "whole", train="lora",
                             lora_rank=3)
    with pytest.raises(ValueError, match="train"):
        D.distill_end_to_end(teacher.model, cache, _stage(4), tmp_path / "whole")
    for bad, match in ((dict(train="peft"), "train must be one of"),
                       (dict(lora_rank=2), "lora_rank"), (dict(train="lora"), "lora_rank"),
                       (dict(ce_weight=-0.1), "ce_weight")):
        with pytest.raises(ValueError, match=match):
            D.distill_end_to_end(teacher.model, cache, _stage(1), tmp_path / "bad", **bad)

    real, calls = stages_lib._kd_step, []

    def nan_at_the_fifth(*args):
        p, o, loss, parts = real(*args)
        calls.append(1)
        return p, o, loss * (jnp.nan if len(calls) == 5 else 1.0), parts

    monkeypatch.setattr(stages_lib, "_kd_step", nan_at_the_fifth)
    with pytest.raises(D.NonFiniteLossError, match="at step 5") as err:  # one compiled step
        D.distill_end_to_end(teacher.model, cache, _stage(6), tmp_path / "nan", **lora,
                             schedule_steps=4)
    assert D.NonFiniteLossError is loop.NonFiniteLossError
    assert (err.value.step, err.value.last_good) == (5, 3)


# --------------------------------------------------------------------------- domains, errors


def test_domains(tmp_path):
    docs = D.domain_text("docs", max_chars=5000)
    code = D.domain_text("python", max_chars=5000)
    assert len(docs) == 5000 and len(code) == 5000
    assert "def " in D.domain_text("python", max_chars=50_000)
    (tmp_path / "a.txt").write_text("first file")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("second file")
    assert D.domain_text(str(tmp_path)) == "first file\n\nsecond file"
    assert D.domain_name(str(tmp_path)) == tmp_path.name
    with pytest.raises(ValueError, match="unknown domain 'klingon'"):
        D.domain_text("klingon")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no"):
        D.domain_text(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="unknown domain 'klingon'"):
        D.DistillConfig(domains=("docs", "klingon"))
    full = D.domain_text("docs", max_chars=5000)
    assert D.held_out_text("docs", max_chars=5000, eval_fraction=0.2) == full[4000:]
    with pytest.raises(ValueError, match="eval_fraction"):
        D.held_out_text("docs", eval_fraction=1.0)


class _Vocab:
    def __init__(self, tokens):
        self.tokens, self.vocab_size = tokens, len(tokens)

    def token_strings(self):
        return list(self.tokens)


def test_tokenizer_mismatch_is_refused(teacher, cache, tmp_path):
    with pytest.raises(ValueError, match="teacher has 3 tokens, the student 2"):
        D.check_vocabularies(_Vocab(["a", "b", "c"]), _Vocab(["a", "b"]))
    with pytest.raises(ValueError, match="token 1 is 'b' for the teacher, 'x'"):
        D.check_vocabularies(_Vocab(["a", "b", "c"]), _Vocab(["a", "x", "c"]))
    D.check_vocabularies(_Vocab(["a", "b"]), _Vocab(["a", "b"]))
    other = D.tiny_teacher(1, n_layers=2, dim=32).model
    student = LanguageModel(other.cfg.replace(vocab_size=300), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="share one tokenizer"):
        D.distill_end_to_end(student, cache, _stage(1), tmp_path)
    with pytest.raises(ValueError, match="tokenizer"):
        D.build_teacher_cache(student, teacher.tokenizer, np.asarray(cache.tokens), tmp_path,
                              top_k=8, progress=False)
    with pytest.raises(ValueError, match="tokenizer mismatch"):
        D.run_distillation(teacher, D.DistillConfig(out_dir=str(tmp_path / "run")),
                           student_tokenizer=_Vocab(["a"]))


def test_pipeline_runs_and_resumes(teacher, tmp_path):
    def student_mixer(attention, rngs):  # any mixer with the attention signature
        return Attention(attention.cfg, d_model=attention.d_model, n_layers=2, rngs=rngs)

    cfg = D.DistillConfig(
        out_dir=str(tmp_path), domains=("docs", "python"), max_chars=8000, seq_len=SEQ,
        n_sequences=4, top_k=8, stage1=_stage(2), stage2=_stage(2), stage2_train="lora",
        lora_rank=2)
    result = D.run_distillation(teacher, cfg, student_mixer=student_mixer, progress=False)
    assert set(result.students) == set(result.aligned) == {"docs", "python"}
    # stage I changes only the mixers of the initial student; stage II moves on from there
    def params(model):
        return {jax.tree_util.keystr(k): np.asarray(v) for k, v in
                jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))}

    init, aligned = params(result.initial), params(result.aligned["docs"])
    final = params(result.students["docs"])
    assert all(np.array_equal(init[k], aligned[k]) for k in init if "'attn'" not in k)
    assert any(not np.array_equal(init[k], aligned[k]) for k in init if "'attn'" in k)
    assert any(not np.array_equal(aligned[k], final[k]) for k in aligned if k in final)
    assert json.loads((tmp_path / "config.json").read_text())["domains"] == ["docs", "python"]
    merged = D.merge_models(list(result.students.values()))
    for x, y in zip(jax.tree.leaves(nnx.state(merged, nnx.Param)),
                    jax.tree.leaves(nnx.state(result.merged, nnx.Param)), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6)
    windows = D.held_out_windows(
        D.domain_corpus("docs", teacher.tokenizer, max_chars=8000), SEQ, 2)
    report = D.kd_and_perplexity(result.merged, teacher.model, windows, top_k=8)
    assert report["kd"] > 0 and report["teacher_ppl"] > 1
    # a rerun loads every finished part; another configuration is refused
    again = D.run_distillation(teacher, dataclasses.replace(cfg, merge="task_arithmetic"),
                               student_mixer=student_mixer, progress=False)
    assert again.metrics == result.metrics  # read back from the stages' metrics files
    with pytest.raises(ValueError, match="another DistillConfig"):
        D.run_distillation(teacher, dataclasses.replace(cfg, top_k=4),
                           student_mixer=student_mixer, progress=False)
    with pytest.raises(ValueError, match="top_k: 300 exceeds the teacher's vocabulary of 256"):
        D.run_distillation(teacher, dataclasses.replace(cfg, top_k=300,
                                                        out_dir=str(tmp_path / "k")),
                           progress=False)


def test_stage2_trains_every_parameter_by_default(teacher, cache, tmp_path):
    student = D.initial_student(teacher.model, student=dict(window=8, n_sinks=2, chunk_size=16))

    def changed(trained):
        before = dict(nnx.to_flat_state(nnx.state(student, nnx.Param)))
        after = dict(nnx.to_flat_state(nnx.state(trained, nnx.Param)))
        return {".".join(map(str, k)) for k in before
                if not np.array_equal(before[k][...], after[k][...])}

    full = changed(D.distill_end_to_end(student, cache, _stage(2), tmp_path / "full").trained)
    mixers = changed(D.distill_end_to_end(student, cache, _stage(2), tmp_path / "mixers",
                                          train="mixers").trained)
    assert "embed.embedding" in full or any("embed" in k for k in full)
    assert any("mlp" in k for k in full) and any("attn" in k for k in full)
    assert mixers and all("attn" in k for k in mixers)


def test_distill_config_refuses_bad_recipes():
    for bad, match in ((dict(stage1_train="copied"), "stage1_train"),
                       (dict(stage2_train="peft"), "stage2_train"),
                       (dict(stage2_train="lora"), "lora_rank"),
                       (dict(lora_rank=4), "lora_rank"),
                       (dict(ce_weight=2.0), "ce_weight")):
        with pytest.raises(ValueError, match=match):
            D.DistillConfig(**bad)
    cfg = D.DistillConfig()
    assert (cfg.top_k, cfg.stage1_train, cfg.stage2_train, cfg.ce_weight) == (256, "new",
                                                                               "full", 0.9)


def test_cli(tmp_path, capsys):
    from jaxlib_ext.cli import distill as cli_distill

    assert cli_distill.main(["--tiny-teacher", "--domains", "klingon"]) == 2
    assert "unknown domain 'klingon'" in capsys.readouterr().err
    assert cli_distill.main(["--tiny-teacher", "--student", "bogus=1"]) == 2
    assert "unknown key 'bogus'" in capsys.readouterr().err
    assert cli_distill.main(["--tiny-teacher", "--student", "window=0"]) == 2
    assert "XLSTMConfig.window" in capsys.readouterr().err
    assert cli_distill.main(["--teacher", str(tmp_path / "absent.gguf")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli_distill.parse_student(["window=64", "gate=static", "mlstm_rope=false"]) == {
        "window": 64, "gate": "static", "mlstm_rope": False}
    assert cli_distill.parse_student(["feature_map=none", "gate_soft_cap=none"]) == {
        "feature_map": "none", "gate_soft_cap": None}
    for argv, message in (
            (["--student", "feature_map=relu"], "XLSTMConfig.feature_map must be one of"),
            (["--student", "window=2", "--student", "n_sinks=4"], "at least n_sinks"),
            (["--top-k", "300", "--out-dir", str(tmp_path / "k")],
             "top_k: 300 exceeds the teacher's vocabulary of 256"),
            (["--stage2-train", "lora"], "lora_rank"),
            (["--ce-weight", "1.5"], "ce_weight")):
        assert cli_distill.main(["--tiny-teacher", *argv]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.slow
def test_cli_runs_a_tiny_distillation_with_the_xlstm_student(tmp_path, capsys):
    from jaxlib_ext.cli import distill as cli_distill

    # uncapped gates: under this suite's XLA flags (LLVM optimisation off, conftest.py) the
    # soft-capped gate projections' gradients come out NaN on the tiny teacher, with the
    # default compiler flags they do not
    argv = ["--tiny-teacher", "--out-dir", str(tmp_path), "--max-chars", "20000", "--seq-len",
            "32", "--n-sequences", "4", "--top-k", "8", "--student", "window=8", "--student",
            "n_sinks=2", "--student", "chunk_size=16", "--student", "gate_soft_cap=none",
            "--stage1-steps", "3", "--stage2-steps", "2", "--no-progress", "--evaluate",
            "--eval-windows", "2"]
    assert cli_distill.main(argv) == 0
    out = capsys.readouterr().out
    assert "| merged | docs |" in out and "C_alpha, absolute" in out
    assert json.loads((tmp_path / "evaluation.json").read_text())["rows"]
