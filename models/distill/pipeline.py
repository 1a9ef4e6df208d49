"""The distillation pipeline of arXiv 2603.15590 end to end: per domain, teacher cache, stage I
(layer alignment of the new parameters) and stage II (full fine-tuning on ``0.9 CE + 0.1 KL``)
from one initial student, then stage III (merging).

Folder layout under ``DistillConfig.out_dir``::

    config.json                      the run's DistillConfig
    <domain>/teacher_cache/          teacher activations and top-k (teacher_cache module)
    <domain>/stage1/, <domain>/stage2/   checkpoints and metrics.jsonl of each stage
    merged/                          the merged student's parameters (Orbax) and its record

Every part is resumable: a rerun of :func:`run_distillation` with the same configuration
reuses finished caches and stages and continues unfinished ones from their newest checkpoint;
stage III is cheap and redone on every run, so a rerun may change only the merge settings.
The initial student is a pure function of the teacher, the student settings and the seed.

The student is the teacher with the attention of blocks ``layers`` replaced: by default the
hybrid mLSTM + sliding-window-attention mixer of :mod:`jaxlib_ext.models.xlstm`
(:func:`~jaxlib_ext.models.xlstm.from_teacher`, settings ``DistillConfig.student``), or any
``student_mixer(teacher_attention, rngs) -> mixer`` with the token-mixer interface of
:mod:`jaxlib_ext.models.llama`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import shutil
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlib_ext.core.checkpoint import Checkpointer
from jaxlib_ext.core.data import ByteTokenizer
from jaxlib_ext.models._backbone import LanguageModel
from jaxlib_ext.models._saved_methods import read_saved_methods
from jaxlib_ext.models.distill.domains import check_domain, domain_corpus, domain_name
from jaxlib_ext.models.distill.losses import CE_WEIGHT, sparse_kd_loss
from jaxlib_ext.models.distill.merging import MERGE_METHODS, merge_models
from jaxlib_ext.models.distill.stages import (
    StageConfig,
    _check_stage2_recipe,
    align_layers,
    distill_end_to_end,
)
from jaxlib_ext.models.distill.teacher_cache import (
    build_teacher_cache,
    make_windows,
    tokenizer_fingerprint,
)
from jaxlib_ext.models.lm import LMConfig, lm_config

__all__ = [
    "DistillConfig",
    "DistillResult",
    "STUDENT_DEFAULTS",
    "STAGE1_TRAIN",
    "Teacher",
    "tiny_teacher",
    "check_vocabularies",
    "initial_student",
    "new_parameters",
    "run_distillation",
    "held_out_windows",
    "kd_and_perplexity",
]


class Teacher(NamedTuple):
    """A teacher (:func:`~jaxlib_ext.models.llama.load_gguf` returns one).

    Attributes:
      model: the teacher :class:`~jaxlib_ext.models.LanguageModel`.
      tokenizer: its tokenizer (``encode``, ``decode``, ``vocab_size``).
      config: its :class:`~jaxlib_ext.models.LMConfig`.
    """

    model: LanguageModel
    tokenizer: object
    config: LMConfig


def tiny_teacher(seed: int = 0, *, n_layers: int = 2, dim: int = 64) -> Teacher:
    """A small randomly initialised Llama over UTF-8 bytes (:class:`~jaxlib_ext.core.data.
    ByteTokenizer`): a stand-in teacher for tests and quick runs where the real one is absent.

    Its matrices are scaled by 8 from the initialisation, for sharper next-token
    distributions.

    Args:
      seed: the seed of the initialisation.
      n_layers: the number of blocks.
      dim: the model width (4 heads of ``dim // 4``, SwiGLU width ``2 dim``).

    Returns:
      The :class:`Teacher` of the ``"llama-tiny"`` preset at these sizes, vocabulary 256 and
      ``max_seq_len`` 1024.
    """
    cfg = lm_config(None, None, "llama-tiny", vocab_size=256, d_model=dim, n_layers=n_layers,
                    head_dim=dim // 4, mlp_hidden=2 * dim, max_seq_len=1024)
    model = LanguageModel(cfg, rngs=nnx.Rngs(seed))
    # a random model at dense_init is nearly uniform; larger weights give it sharper
    # (more teacher-like) next-token distributions
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda p: p * 8.0 if p.ndim == 2 else p, params))
    return Teacher(model, ByteTokenizer(), cfg)


def check_vocabularies(teacher_tokenizer, student_tokenizer, *, teacher_vocab: int | None = None,
                       student_vocab: int | None = None) -> None:
    """Checks that teacher and student share one vocabulary.

    They must have the same size and, when the tokenizers list their tokens, the same token
    strings. KD compares distributions token by token, so nothing else can be distilled.

    Args:
      teacher_tokenizer: the teacher's tokenizer.
      student_tokenizer: the student's tokenizer.
      teacher_vocab: the teacher's vocabulary size; ``None`` means the tokenizer's.
      student_vocab: the student's vocabulary size; ``None`` means the tokenizer's.

    Raises:
      ValueError: if the sizes or the token strings differ (the first difference is named).
    """
    sizes = (teacher_vocab or teacher_tokenizer.vocab_size,
             student_vocab or student_tokenizer.vocab_size)
    if sizes[0] != sizes[1]:
        raise ValueError(
            f"tokenizer mismatch: the teacher has {sizes[0]} tokens, the student {sizes[1]}; "
            "teacher and student must share one tokenizer"
        )
    if tokenizer_fingerprint(teacher_tokenizer) == tokenizer_fingerprint(student_tokenizer):
        return
    a = getattr(teacher_tokenizer, "token_strings", lambda: None)()
    b = getattr(student_tokenizer, "token_strings", lambda: None)()
    where = ""
    if a is not None and b is not None:
        i = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
        where = f" (first difference: token {i} is {a[i]!r} for the teacher, {b[i]!r})"
    raise ValueError(f"tokenizer mismatch: teacher and student vocabularies differ{where}")


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    """A distillation run (module docstring).

    Attributes:
      out_dir: the run's folder.
      domains: the domains, ``"docs"``, ``"python"`` or paths, with distinct names.
      max_chars: characters read per domain, positive.
      eval_fraction: the last fraction of each domain's text held out.
      seq_len: tokens per cached window, positive.
      n_sequences: cached windows per domain, positive.
      top_k: the teacher's log-probabilities kept per position, in ``[1, vocabulary]``
        (default 256, the paper's stage II).
      cache_dtype: the dtype the teacher activations are stored in.
      layers: the blocks that get a student mixer; ``None`` means all.
      student: :class:`~jaxlib_ext.models.xlstm.XLSTMConfig` fields that update
        :data:`STUDENT_DEFAULTS`.
      stage1: stage I's :class:`~jaxlib_ext.models.distill.stages.StageConfig`.
      stage2: stage II's :class:`~jaxlib_ext.models.distill.stages.StageConfig`.
      stage1_train: what stage I trains, one of :data:`STAGE1_TRAIN`: ``"new"`` (the
        parameters the teacher layer does not have: feature maps, mLSTM gates, mixing gate;
        the paper's stage I, default; :func:`new_parameters`) or ``"all"`` (the copied
        projections too).
      stage2_train: what stage II trains, one of
        :data:`~jaxlib_ext.models.distill.stages.STAGE2_TRAIN` (``"full"``: every parameter,
        the paper's full fine-tuning, default; ``"mixers"``; ``"lora"``: the mixers and
        LoRA adapters on the MLPs).
      ce_weight: the cross-entropy's weight in stage II's ``w CE + (1 - w) KL`` (default 0.9,
        the paper's; 0 is pure sparse KD).
      lora_rank: the rank of the LoRA adapters on the MLPs in stage II, positive exactly when
        ``stage2_train="lora"``.
      merge: stage III's method, ``"average"`` or ``"task_arithmetic"``.
      merge_weights: one weight per domain; ``None`` means uniform.
      merge_scale: the scale of task arithmetic.
      seed: the seed of the initial student's fresh parameters.
      shard_layers: whether stage I splits the layer axis over the devices.

    Raises:
      ValueError: if ``domains`` is empty, unknown or has two of one name, ``merge``,
        ``stage1_train`` or ``stage2_train`` is unknown, ``lora_rank`` does not fit
        ``stage2_train``, ``ce_weight`` is outside ``[0, 1]``, ``merge_weights`` does not have
        one weight per domain, or a count is not positive.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590.
    """

    out_dir: str = "runs/distill"
    domains: tuple[str, ...] = ("docs", "python")
    max_chars: int = 400_000
    eval_fraction: float = 0.1
    seq_len: int = 128
    n_sequences: int = 32
    top_k: int = 256
    cache_dtype: str = "float32"
    layers: tuple[int, ...] | None = None
    student: dict = dataclasses.field(default_factory=dict)
    stage1: StageConfig = StageConfig(steps=100, learning_rate=1e-3)
    stage2: StageConfig = StageConfig(steps=50, learning_rate=3e-4, batch_size=2)
    stage1_train: str = "new"
    stage2_train: str = "full"
    ce_weight: float = CE_WEIGHT
    lora_rank: int = 0
    merge: str = "average"
    merge_weights: tuple[float, ...] | None = None
    merge_scale: float = 1.0
    seed: int = 0
    shard_layers: bool = False

    def __post_init__(self):
        if not self.domains:
            raise ValueError("DistillConfig.domains must name at least one domain")
        for d in self.domains:
            check_domain(d)
        names = [domain_name(d) for d in self.domains]
        if len(set(names)) != len(names):
            raise ValueError(f"DistillConfig.domains: two domains share a name: {names}")
        if self.merge not in MERGE_METHODS:
            raise ValueError(f"DistillConfig.merge must be one of {MERGE_METHODS}, got "
                             f"{self.merge!r}")
        if self.merge_weights is not None and len(self.merge_weights) != len(self.domains):
            raise ValueError(
                f"DistillConfig.merge_weights: {len(self.merge_weights)} weights for "
                f"{len(self.domains)} domains"
            )
        for name in ("seq_len", "n_sequences", "top_k", "max_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"DistillConfig.{name} must be positive")
        if self.stage1_train not in STAGE1_TRAIN:
            raise ValueError(f"DistillConfig.stage1_train must be one of {STAGE1_TRAIN}, got "
                             f"{self.stage1_train!r}")
        _check_stage2_recipe(self.stage2_train, self.lora_rank, self.ce_weight,
                            prefix="DistillConfig.", train_name="stage2_train")

    def to_json(self) -> dict:
        """The fields as a dict for ``config.json`` (``domains`` as a list)."""
        d = dataclasses.asdict(self)
        d["domains"] = list(self.domains)
        return d


# fields a rerun may change: stage III is redone on every run from the finished stages
_REMERGE_FIELDS = ("merge", "merge_weights", "merge_scale", "out_dir")


class DistillResult(NamedTuple):
    """A finished run.

    Attributes:
      initial: the initial student.
      students: the per-domain students after stage II, by domain name.
      merged: the merged student (stage III).
      metrics: each stage's metrics rows by domain (``{"stage1": rows, "stage2": rows}``).
      caches: the per-domain teacher caches.
      aligned: the per-domain students after stage I alone.
    """

    initial: LanguageModel
    students: dict
    merged: LanguageModel
    metrics: dict
    caches: dict
    aligned: dict


#: Settings of the xLSTM student mixer that the pipeline changes from the mixer's own defaults:
#: the mixing gate starts at ``sigmoid(-3)``, about 5 % mLSTM and 95 % sliding-window attention,
#: so that the initial student (teacher projections, fresh mLSTM) stays close to the teacher and
#: the untrained mLSTM branch does not swamp the copied attention; stage I then moves the gate.
STUDENT_DEFAULTS = {"gate_bias_init": -3.0}

#: What stage I trains: the parameters the teacher layer does not have, or all of the mixer's.
STAGE1_TRAIN = ("new", "all")


def new_parameters(mixer: nnx.Module, teacher_attention: nnx.Module):
    """The ``nnx`` filter of the parameters of ``mixer`` that ``teacher_attention`` lacks.

    A parameter is the teacher's when the teacher layer has one at the same path with the same
    value (the copied ``qkv`` and ``out`` projections of
    :func:`~jaxlib_ext.models.xlstm.from_teacher`); every other parameter (the feature maps,
    the mLSTM gates, the mixing gate, or all of a freshly initialised mixer) is new. Stage I
    of arXiv 2603.15590 trains the new ones only.

    Args:
      mixer: the initial student mixer.
      teacher_attention: the teacher's attention layer it replaces.

    Returns:
      A filter ``(path, value) -> bool`` for ``nnx.split`` and ``nnx.state``.
    """
    return _outside(_copied_paths(mixer, teacher_attention))


def _outside(copied: frozenset):
    """The filter of the parameters whose path is not in ``copied``."""
    return nnx.All(nnx.Param, lambda path, _: tuple(path) not in copied)


def _copied_paths(mixer, teacher_attention) -> frozenset:
    teacher = {tuple(path): np.asarray(value[...]) for path, value in
               nnx.to_flat_state(nnx.state(teacher_attention, nnx.Param))}
    copied = set()
    for path, value in nnx.to_flat_state(nnx.state(mixer, nnx.Param)):
        have = teacher.get(tuple(path))
        if have is not None and have.shape == value[...].shape and np.array_equal(
                have, np.asarray(value[...])):
            copied.add(tuple(path))
    return frozenset(copied)


def initial_student(teacher: LanguageModel, layers=None, *, student: dict | None = None,
                    seed: int = 0, student_mixer: Callable | None = None) -> LanguageModel:
    """The teacher with the attention of some blocks replaced by student mixers.

    Everything else is copied; the teacher is not changed.

    Args:
      teacher: the teacher language model.
      layers: the blocks to replace; ``None`` means all.
      student: :class:`~jaxlib_ext.models.xlstm.XLSTMConfig` fields that update
        :data:`STUDENT_DEFAULTS` (for the default mixer).
      seed: the seed of the fresh mixer parameters.
      student_mixer: ``student_mixer(attention, rngs) -> mixer``; ``None`` means the xLSTM
        hybrid mixer (:func:`~jaxlib_ext.models.xlstm.from_teacher`).

    Returns:
      The initial student :class:`~jaxlib_ext.models.LanguageModel`.
    """
    layers = range(len(teacher.blocks)) if layers is None else layers
    rngs = nnx.Rngs(seed)
    if student_mixer is None:
        from jaxlib_ext.models import xlstm

        config = xlstm.XLSTMConfig(**{**STUDENT_DEFAULTS, **(student or {})})

        def student_mixer(attention, rngs):
            return xlstm.from_teacher(attention, config, rngs)

    model = nnx.clone(teacher)
    for i in layers:
        model.blocks[i].attn = student_mixer(teacher.blocks[i].attn, rngs)
    return model


def held_out_windows(corpus, seq_len: int, n: int) -> np.ndarray:
    """Up to ``n`` windows of ``seq_len + 1`` tokens from the held-out split of ``corpus``.

    Args:
      corpus: a corpus with an ``eval`` token array (:func:`domain_corpus`).
      seq_len: tokens per window, before the one extra target token.
      n: the most windows to return.

    Returns:
      ``int32[min(n, available), seq_len + 1]``.

    Raises:
      ValueError: if the held-out split is shorter than ``seq_len + 1`` tokens.
    """
    available = len(corpus.eval) // (seq_len + 1)
    if available < 1:
        raise ValueError(f"the held-out split ({len(corpus.eval)} tokens) is shorter than "
                         f"seq_len + 1 = {seq_len + 1}")
    return make_windows(corpus.eval, min(n, available), seq_len)


@functools.partial(jax.jit, static_argnums=(0, 1, 4))
def _kd_and_nll(s_graph, t_graph, s_state, t_state, top_k, tokens):
    from jaxlib_ext.models.distill.losses import top_k_log_probs

    s, t = nnx.merge(s_graph, s_state), nnx.merge(t_graph, t_state)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    ls, lt = s(inputs), t(inputs)
    lp, ids = top_k_log_probs(lt, top_k)

    def nll(logits):  # per sequence
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1)[..., 0], axis=-1)

    return jnp.stack([jax.vmap(sparse_kd_loss)(ls, lp, ids), nll(ls), nll(lt)], axis=-1)


def kd_and_perplexity(student: LanguageModel, teacher: LanguageModel, windows: np.ndarray, *,
                      top_k: int, batch_size: int = 4) -> dict:
    """The student's sparse KD against the teacher and both models' perplexities.

    Compiled once per pair of architectures, so students of one architecture share the
    compilation.

    Args:
      student: the student language model.
      teacher: the teacher language model.
      windows: ``int32[N, T + 1]`` token windows.
      top_k: the teacher's top-k of the sparse KD.
      batch_size: windows per compiled call.

    Returns:
      A dict of floats: ``kd`` (nats per token), ``student_ppl`` and ``teacher_ppl`` (of the
      next tokens).
    """
    s_graph, s_state = nnx.split(student)
    t_graph, t_state = nnx.split(teacher)
    windows = np.asarray(windows)
    rows = []
    for i in range(0, len(windows), batch_size):
        batch = windows[i : i + batch_size]
        n = len(batch)
        if n < batch_size:  # one shape for every batch: pad by repeating, then drop
            batch = np.concatenate([batch, np.repeat(batch[-1:], batch_size - n, 0)])
        out = _kd_and_nll(s_graph, t_graph, s_state, t_state, top_k,
                          jnp.asarray(batch, jnp.int32))
        rows.append(np.asarray(out)[:n])
    kd, s_nll, t_nll = np.concatenate(rows).mean(axis=0)
    return {"kd": float(kd), "student_ppl": float(np.exp(s_nll)),
            "teacher_ppl": float(np.exp(t_nll))}


def _save_merged(directory: pathlib.Path, model: LanguageModel, record: dict) -> None:
    shutil.rmtree(directory, ignore_errors=True)  # stage III is redone on every run
    with Checkpointer(directory, max_to_keep=1, async_save=False) as ckpt:
        ckpt.save(0, nnx.state(model, nnx.Param), record)


def run_distillation(teacher: Teacher, config: DistillConfig, *,
                     student_mixer: Callable | None = None, student_tokenizer=None,
                     progress: bool = True) -> DistillResult:
    """Runs (or resumes) the whole pipeline for ``teacher`` (module docstring).

    Args:
      teacher: the teacher, its model and tokenizer.
      config: the run's settings.
      student_mixer: ``student_mixer(attention, rngs) -> mixer``; ``None`` means the xLSTM
        hybrid mixer.
      student_tokenizer: the student's tokenizer, checked to be the teacher's
        (:func:`check_vocabularies`); ``None``: the student reads the teacher's.
      progress: whether to show progress bars.

    Returns:
      The :class:`DistillResult`.

    Raises:
      ValueError: if the teacher's tokenizer and model disagree on the vocabulary, the
        vocabularies differ, or ``config.out_dir`` holds a run of another configuration.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590.
    """
    model, tokenizer = teacher.model, teacher.tokenizer
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise ValueError(f"teacher: tokenizer of {tokenizer.vocab_size} tokens for a model of "
                         f"{model.cfg.vocab_size}")
    if student_tokenizer is not None:
        check_vocabularies(tokenizer, student_tokenizer)
    if config.top_k > model.cfg.vocab_size:
        raise ValueError(f"DistillConfig.top_k: {config.top_k} exceeds the teacher's vocabulary "
                         f"of {model.cfg.vocab_size} tokens")
    out = pathlib.Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    recorded = out / "config.json"
    if recorded.exists():
        have = json.loads(recorded.read_text())
        if isinstance(have.get("student"), dict):  # saved per-op method names, read as ours
            have["student"] = read_saved_methods(have["student"])
        want = json.loads(json.dumps(config.to_json()))
        differ = sorted(k for k in set(have) | set(want)
                        if k not in _REMERGE_FIELDS and have.get(k) != want.get(k))
        if differ:
            raise ValueError(
                f"out_dir {str(out)!r} holds a run with another DistillConfig (fields "
                f"{differ}); use another out_dir to start a new run"
            )
    recorded.write_text(json.dumps(config.to_json(), indent=1))
    layers = list(range(model.cfg.n_layers)) if config.layers is None else list(config.layers)
    init = initial_student(model, layers, student=config.student, seed=config.seed,
                           student_mixer=student_mixer)
    trainable = nnx.Param
    if config.stage1_train == "new":  # one filter for the stacked layers: it must fit them all
        copied = {_copied_paths(init.blocks[i].attn, model.blocks[i].attn) for i in layers}
        if len(copied) > 1:
            raise ValueError("stage1_train='new': the student layers copy different teacher "
                             "parameters; use stage1_train='all'")
        trainable = _outside(copied.pop())
    s1 = dataclasses.replace(config.stage1, progress=progress and config.stage1.progress)
    s2 = dataclasses.replace(config.stage2, progress=progress and config.stage2.progress)
    students, metrics, caches, aligned_students = {}, {}, {}, {}
    for domain in config.domains:
        name = domain_name(domain)
        corpus = domain_corpus(domain, tokenizer, max_chars=config.max_chars,
                               eval_fraction=config.eval_fraction)
        windows = make_windows(corpus.train, config.n_sequences, config.seq_len)
        cache = build_teacher_cache(model, tokenizer, windows, out / name / "teacher_cache",
                                    top_k=config.top_k, layers=layers, dtype=config.cache_dtype,
                                    progress=progress, desc=f"{name}: teacher cache")
        caches[name] = cache
        stage1 = align_layers([init.blocks[i].attn for i in layers], cache, layers, s1,
                              out / name / "stage1", shard_layers=config.shard_layers,
                              desc=f"{name}: stage I", trainable=trainable)
        aligned = nnx.clone(init)
        for i, mixer in zip(layers, stage1.trained, strict=True):
            aligned.blocks[i].attn = mixer
        aligned_students[name] = aligned
        stage2 = distill_end_to_end(aligned, cache, s2, out / name / "stage2",
                                    train=config.stage2_train, ce_weight=config.ce_weight,
                                    lora_rank=config.lora_rank, desc=f"{name}: stage II")
        students[name] = stage2.trained
        metrics[name] = {"stage1": stage1.metrics, "stage2": stage2.metrics}
    merged = merge_models(list(students.values()), method=config.merge,
                          weights=config.merge_weights, base=init, scale=config.merge_scale)
    _save_merged(out / "merged", merged, {"domains": list(students), "merge": config.merge})
    return DistillResult(init, students, merged, metrics, caches, aligned_students)

