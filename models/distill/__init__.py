"""Distillation of a pretrained attention LM into an xLSTM student (arXiv 2603.15590).

Stages, each resumable from its checkpoints: the teacher's activations and top-k next-token
distributions cached once (:func:`build_teacher_cache`); stage I, layer-wise alignment of each
student mixer's new parameters to its teacher attention layer (:func:`align_layers`,
:func:`new_parameters`); stage II, end-to-end distillation on ``0.9 CE + 0.1 KL``, the
next-token cross-entropy and the sparse top-k KD (:func:`distill_end_to_end`,
:func:`distillation_loss`), full fine-tuning by default (the mixers alone, or the mixers and
LoRA on the MLPs, as options); stage III, merging of students distilled per domain
(:func:`merge_models`: weighted average or task arithmetic). :func:`run_distillation` runs
them all for the domains of :func:`domain_text` (CPython's documentation and source, or the
user's files); the CLI is ``python -m jaxlib_ext distill``. The task suite and the Win-and-Tie
rate that judge a student against its teacher are in
:mod:`jaxlib_ext.models.distill.evaluation`.
"""

from jaxlib_ext.models.distill.domains import (
    DOMAINS,
    check_domain,
    domain_corpus,
    domain_name,
    domain_text,
    held_out_text,
)
from jaxlib_ext.models.distill.lora import LoRALinear, LoRAParam, add_lora_to_mlps, merge_lora
from jaxlib_ext.models.distill.losses import (
    CE_WEIGHT,
    alignment_loss,
    distillation_loss,
    full_kl,
    next_token_cross_entropy,
    sparse_kd_loss,
    top_k_log_probs,
)
from jaxlib_ext.models.distill.merging import (
    MERGE_METHODS,
    merge_models,
    task_arithmetic,
    weighted_average,
)
from jaxlib_ext.models.distill.pipeline import (
    STAGE1_TRAIN,
    STUDENT_DEFAULTS,
    DistillConfig,
    DistillResult,
    Teacher,
    check_vocabularies,
    held_out_windows,
    initial_student,
    kd_and_perplexity,
    new_parameters,
    run_distillation,
    tiny_teacher,
)
from jaxlib_ext.models.distill.stages import (
    STAGE2_TRAIN,
    NonFiniteLossError,
    StageConfig,
    StageResult,
    align_layers,
    distill_end_to_end,
    read_metrics,
)
from jaxlib_ext.models.distill.teacher_cache import (
    CacheSpec,
    TeacherCache,
    build_teacher_cache,
    make_windows,
    model_fingerprint,
    tokenizer_fingerprint,
)

__all__ = [
    # pipeline
    "DistillConfig",
    "DistillResult",
    "STUDENT_DEFAULTS",
    "STAGE1_TRAIN",
    "Teacher",
    "run_distillation",
    "initial_student",
    "new_parameters",
    "tiny_teacher",
    "check_vocabularies",
    "held_out_windows",
    "kd_and_perplexity",
    # domains
    "DOMAINS",
    "check_domain",
    "domain_text",
    "domain_corpus",
    "domain_name",
    "held_out_text",
    # teacher cache
    "CacheSpec",
    "TeacherCache",
    "build_teacher_cache",
    "make_windows",
    "model_fingerprint",
    "tokenizer_fingerprint",
    # stages
    "STAGE2_TRAIN",
    "StageConfig",
    "StageResult",
    "NonFiniteLossError",
    "align_layers",
    "distill_end_to_end",
    "read_metrics",
    # losses
    "CE_WEIGHT",
    "alignment_loss",
    "distillation_loss",
    "next_token_cross_entropy",
    "sparse_kd_loss",
    "full_kl",
    "top_k_log_probs",
    # merging and LoRA
    "MERGE_METHODS",
    "merge_models",
    "weighted_average",
    "task_arithmetic",
    "LoRALinear",
    "LoRAParam",
    "add_lora_to_mlps",
    "merge_lora",
]
