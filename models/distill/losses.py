"""Distillation losses: layer alignment (stage I) and stage II's mix of next-token cross-entropy
and sparse top-k knowledge distillation (:func:`distillation_loss`, ``0.9 CE + 0.1 KL``) of
arXiv 2603.15590.

Sparse KD keeps, per position, only the teacher's ``k`` most likely tokens ``S`` with their
log-probabilities ``log p_i`` (cached once, :func:`top_k_log_probs`). The paper states the loss
as the KL divergence restricted to the teacher's top-k logits without giving the treatment of
the rest of the vocabulary; we take the KL between the teacher's and the student's distributions
*coarsened* to the ``k + 1`` outcomes ``S`` and "any other token":

    KL_S(p || q) = sum_{i in S} p_i log(p_i / q_i) + p_rest log(p_rest / q_rest),
    p_rest = 1 - sum_{i in S} p_i,   q_rest = 1 - sum_{i in S} q_i

with ``q = softmax(student logits)`` over the full vocabulary. Being a KL divergence it is
``>= 0``; it equals the full KL when ``k`` is the vocabulary size (``p_rest = 0``); and its
gradient vanishes when the student equals the teacher (for every ``k``). Renormalising the
teacher over ``S`` alone (dropping ``p_rest``) would have none of the last two properties.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "top_k_log_probs",
    "sparse_kd_loss",
    "next_token_cross_entropy",
    "distillation_loss",
    "full_kl",
    "alignment_loss",
]

#: The weight of the next-token cross-entropy in stage II's loss (arXiv 2603.15590, stage II:
#: ``0.9 CE + 0.1 KL``; pure KL is reported there as worse).
CE_WEIGHT = 0.9

# below this teacher tail mass the tail term is dropped: float32 cannot resolve 1 - sum(p_S)
_TAIL_FLOOR = 1e-6


def top_k_log_probs(logits: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """The teacher's ``k`` largest log-probabilities and their token ids over the last axis.

    Args:
      logits: ``[..., V]`` logits.
      k: the number kept, in ``[1, V]``.

    Returns:
      ``(log_probs float32[..., k], ids int32[..., k])``, in decreasing order.

    Raises:
      ValueError: if ``k`` is not in ``[1, V]``.
    """
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k must be in [1, vocab_size={logits.shape[-1]}], got {k}")
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    values, ids = jax.lax.top_k(logp, k)
    return values, ids.astype(jnp.int32)


def _log1mexp(x):
    """``log(1 - exp(x))`` for ``x <= 0`` (Maechler's two branches)."""
    x = jnp.minimum(x, -1e-30)
    far = jnp.minimum(x, -0.6931)  # keeps the untaken branch (and its gradient) finite
    return jnp.where(x > -0.6931, jnp.log(-jnp.expm1(x)), jnp.log1p(-jnp.exp(far)))


def sparse_kd_loss(student_logits: jax.Array, teacher_log_probs: jax.Array,
                   teacher_ids: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean over positions of ``KL_S(p || q)`` (module docstring), in nats.

    Args:
      student_logits: ``[..., V]``.
      teacher_log_probs: ``[..., k]`` teacher log-probabilities of its top-k tokens.
      teacher_ids: ``[..., k]`` their token ids (distinct per position).
      mask: optional ``[...]`` weights (1 = position counts).

    Returns:
      The float32 scalar loss (the mask-weighted mean with ``mask``).

    Raises:
      ValueError: if ``teacher_log_probs`` and ``teacher_ids`` differ in shape, or their
        leading axes differ from ``student_logits``'s.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590 (stage II).
    """
    if teacher_log_probs.shape != teacher_ids.shape:
        raise ValueError(
            f"teacher_log_probs {teacher_log_probs.shape} and teacher_ids {teacher_ids.shape} "
            "must have the same shape"
        )
    if student_logits.shape[:-1] != teacher_ids.shape[:-1]:
        raise ValueError(
            f"student_logits {student_logits.shape} and teacher_ids {teacher_ids.shape} must "
            "agree on the leading axes"
        )
    logq_all = jax.nn.log_softmax(student_logits.astype(jnp.float32), axis=-1)
    logq = jnp.take_along_axis(logq_all, teacher_ids, axis=-1)  # [..., k]
    logp = teacher_log_probs.astype(jnp.float32)
    p = jnp.exp(logp)
    head = jnp.sum(p * (logp - logq), axis=-1)
    p_rest = jnp.clip(1.0 - jnp.sum(p, axis=-1), 0.0, 1.0)
    log_q_rest = _log1mexp(jax.nn.logsumexp(logq, axis=-1))
    use = p_rest > _TAIL_FLOOR
    safe_p = jnp.where(use, p_rest, 1.0)
    tail = jnp.where(use, safe_p * (jnp.log(safe_p) - log_q_rest), 0.0)
    kl = head + tail
    if mask is None:
        return jnp.mean(kl)
    mask = mask.astype(jnp.float32)
    return jnp.sum(kl * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def next_token_cross_entropy(logits: jax.Array, targets: jax.Array,
                             mask: jax.Array | None = None) -> jax.Array:
    """Mean negative log-likelihood of ``targets`` under ``softmax(logits)``, in nats.

    Args:
      logits: ``[..., V]``.
      targets: ``int[...]`` token ids in ``[0, V)``.
      mask: optional ``[...]`` weights (1 = position counts).

    Returns:
      The float32 scalar loss (the mask-weighted mean with ``mask``).

    Raises:
      ValueError: if ``targets``'s shape is not ``logits``'s leading axes.
    """
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets {targets.shape} must be the leading axes of logits "
                         f"{logits.shape}")
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    if mask is None:
        return jnp.mean(nll)
    mask = mask.astype(jnp.float32)
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def distillation_loss(student_logits: jax.Array, targets: jax.Array,
                      teacher_log_probs: jax.Array, teacher_ids: jax.Array, *,
                      ce_weight: float = CE_WEIGHT, mask: jax.Array | None = None
                      ) -> tuple[jax.Array, dict]:
    """Stage II's loss: ``w CE + (1 - w) KL_S`` (arXiv 2603.15590, stage II, ``w = 0.9``).

    ``CE`` is the next-token cross-entropy on the data (:func:`next_token_cross_entropy`),
    ``KL_S`` the sparse top-k KD against the teacher (:func:`sparse_kd_loss`), both means over
    positions in nats. ``ce_weight = 0`` is pure KD.

    Args:
      student_logits: ``[..., V]``.
      targets: ``int[...]``, the next tokens.
      teacher_log_probs: ``[..., k]`` teacher log-probabilities of its top-k tokens.
      teacher_ids: ``[..., k]`` their token ids.
      ce_weight: ``w``, in ``[0, 1]``.
      mask: optional ``[...]`` weights (1 = position counts).

    Returns:
      ``(loss, {"ce": CE, "kl": KL_S})``, float32 scalars.

    Raises:
      ValueError: if ``ce_weight`` is outside ``[0, 1]``, or as the two losses.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590 (stage II).
    """
    if not 0.0 <= ce_weight <= 1.0:
        raise ValueError(f"ce_weight must be in [0, 1], got {ce_weight}")
    ce = next_token_cross_entropy(student_logits, targets, mask)
    kl = sparse_kd_loss(student_logits, teacher_log_probs, teacher_ids, mask)
    return ce_weight * ce + (1.0 - ce_weight) * kl, {"ce": ce, "kl": kl}


def full_kl(student_logits: jax.Array, teacher_logits: jax.Array) -> jax.Array:
    """Mean over positions of ``KL(softmax(teacher) || softmax(student))`` over the whole
    vocabulary, in nats (the dense reference of :func:`sparse_kd_loss`).

    Args:
      student_logits: ``[..., V]``.
      teacher_logits: ``[..., V]``.

    Returns:
      The float32 scalar loss.
    """
    logp = jax.nn.log_softmax(teacher_logits.astype(jnp.float32), axis=-1)
    logq = jax.nn.log_softmax(student_logits.astype(jnp.float32), axis=-1)
    return jnp.mean(jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1))


def alignment_loss(student_out: jax.Array, teacher_out: jax.Array) -> jax.Array:
    """Stage I layer alignment (arXiv 2603.15590): the MSE between the student mixer's and the
    teacher attention's outputs, divided by the teacher output's mean square
    (``||y_s - y_t||^2 / ||y_t||^2``) so that every layer trains at one learning rate whatever
    its output scale; the divisor carries no gradient.

    Args:
      student_out: the student mixer's outputs, any shape.
      teacher_out: the teacher attention's outputs, the same shape.

    Returns:
      The float32 scalar loss.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590 (stage I).
    """
    ys, yt = student_out.astype(jnp.float32), teacher_out.astype(jnp.float32)
    power = jax.lax.stop_gradient(jnp.mean(yt * yt))
    return jnp.mean((ys - yt) ** 2) / jnp.maximum(power, 1e-12)
