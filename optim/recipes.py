"""Training recipes: AdamW, FOAM, SMET and POET-X as full optax transforms, by name.

:func:`make_optimizer` builds ``chain(clip_by_global_norm(clip_norm), <optimizer>)`` with the
hyperparameters the papers train with; any of them can be overridden by keyword. Weight decay
follows each optimizer's own convention:

* ``"adamw"``: :func:`optax.adamw` with ``mask=decay_mask`` (matrices only);
* ``"foam"``: FOAM's decoupled decay of the already-updated parameters, on every leaf
  (arXiv 2512.07112, reference code);
* ``"smet"``: :func:`optax.add_decayed_weights` on every leaf before SMET's preconditioner
  (arXiv 2606.00888);
* ``"poet_x"``: HF decoupled decay of the matrices that are not POET layers (arXiv 2603.05500,
  the authors' parameter groups). Its model is :func:`prepare_model`'s: the model's dense layers
  replaced by POET layers of ``block_size``; the rotations train at ``learning_rate *
  poet_lr_scale`` and the other leaves at ``learning_rate * base_lr_scale`` (the authors' 3B
  script: POET lr 5e-4, base lr 1e-3). Its clipping is the authors' merge warm-up
  (:func:`jaxlib_ext.optim.clip_by_global_norm_merge_warmup`): after each merge the threshold
  ramps linearly from ``clip_warmup_start * clip_norm`` (0.1) to ``clip_norm`` over
  ``clip_warmup_steps`` (10) steps, up to step ``clip_warmup_until`` (2000, the authors'
  ``gd_warmup_steps``), over the same leaves the constant clip sees; ``clip_warmup=False`` is
  our variant, the constant ``optax.clip_by_global_norm(clip_norm)`` of the other recipes.

SMET's schedule scales with the run: the topology is updated about six times a run, every
``max(1, min(100, total_steps // 6))`` steps, and each update is followed by the per-slot warm-up
of the same length (``optimizer_warmup_steps = update_every``), as in the authors' configs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax

from jaxlib_ext.optim import _common
from jaxlib_ext.optim.foam import foam
from jaxlib_ext.optim.poet import clip_by_global_norm_merge_warmup, poet_x
from jaxlib_ext.optim.smet import smet

__all__ = [
    "OPTIMIZER_NAMES", "build_optimizer", "decay_mask", "make_optimizer", "prepare_model",
    "recipe_defaults",
]

OPTIMIZER_NAMES: tuple[str, ...] = ("adamw", "foam", "smet", "poet_x")

#: poet_x hyperparameters that shape the model (:func:`prepare_model`), not the optimizer
_POET_MODEL_KEYS = ("block_size", "method", "memory_saving")
#: poet_x hyperparameters of the clipping that precedes the optimizer
_POET_CLIP_KEYS = ("clip_warmup", "clip_warmup_start", "clip_warmup_steps", "clip_warmup_until")


def decay_mask(params) -> Any:
    """Which parameters take weight decay.

    Matrices (``ndim >= 2``) do, unless their NNX variable's metadata says ``weight_decay=False``
    (gate vectors, norms and biases are left alone).

    Args:
      params: a tree of arrays or of ``nnx.Variable``.

    Returns:
      A tree of the structure of ``params`` with Python bool leaves.
    """
    from flax import nnx  # imported here: `import jaxlib_ext.optim` does not load flax

    def one(x):
        if isinstance(x, nnx.Variable):
            if x.get_metadata().get("weight_decay", True) is False:
                return False
            x = x.get_value()
        return bool(np.ndim(x) >= 2)

    return jax.tree.map(one, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def prepare_model(name: str, model, **hyperparams):
    """The model recipe ``name`` trains.

    ``model`` itself for every recipe that trains the model's own parameters; for ``"poet_x"``,
    ``model`` with its eligible dense layers replaced in place by POET layers
    (:func:`jaxlib_ext.optim.poetize`). Call it on a freshly built model before building the
    optimizer.

    Args:
      name: recipe name, one of :data:`OPTIMIZER_NAMES`.
      model: the freshly built ``nnx.Module``.
      **hyperparams: recipe overrides; for ``"poet_x"``, ``block_size``, ``method`` and
        ``memory_saving`` are read (the recipe's defaults otherwise); the optimizer's other
        hyperparameters are ignored here.

    Returns:
      The model to train (``model``, modified in place for ``"poet_x"``).

    Raises:
      ValueError: if ``name`` is not one of :data:`OPTIMIZER_NAMES`.
    """
    _check_name(name)
    if name != "poet_x":
        return model
    from jaxlib_ext.optim.poet_layer import poetize  # loads flax

    hp = {**recipe_defaults(name), **hyperparams}
    return poetize(model, block_size=hp["block_size"], method=hp["method"],
                   memory_saving=bool(hp["memory_saving"]))


def _smet_update_every(total_steps: int) -> int:
    return max(1, min(100, total_steps // 6))


def recipe_defaults(name: str, total_steps: int = 1000) -> dict[str, Any]:
    """The hyperparameters of recipe ``name`` a caller may override, with their defaults.

    Args:
      name: recipe name, one of :data:`OPTIMIZER_NAMES`.
      total_steps: training length, an int ``>= 1``; it only matters for SMET's ``update_every``
        and ``optimizer_warmup_steps``.

    Returns:
      A fresh ``dict`` from hyperparameter name to default. Values are Python ``float``, ``int``
      or ``str``; the type of a default is the type the override should have.

    Raises:
      ValueError: if ``name`` is not one of :data:`OPTIMIZER_NAMES`, or ``total_steps < 1``.
    """
    _check_name(name)
    total_steps = _common.check_int("total_steps", total_steps, lo=1)
    if name == "adamw":
        return {"b1": 0.9, "b2": 0.999, "eps": 1e-8}
    if name == "foam":
        return {
            "b1": 0.9, "b2": 0.95, "eps": 1e-8, "level": 2, "scale": 1.0, "res_scale": 1.0,
            "fold_axis": -2, "second_moment": "mean_of_squares",
        }
    if name == "poet_x":
        return {
            "b1": 0.9, "b2": 0.999, "eps": 1e-6, "merge_every": 200, "poet_lr_scale": 0.5,
            "base_lr_scale": 2.0, "block_size": 256, "method": "auto", "memory_saving": False,
            "clip_warmup": True, "clip_warmup_start": 0.1, "clip_warmup_steps": 10,
            "clip_warmup_until": 2000,
        }
    every = _smet_update_every(total_steps)
    return {
        "b1": 0.9, "b2": 0.999, "eps": 1e-8, "density": 0.5, "update_every": every,
        "prune_rate": 0.2, "final_prune_rate": 0.005, "optimizer_warmup_steps": every,
        "lr_density_power": 1.0, "block_size": 1, "warmup_mode": "code",
    }


def _check_name(name) -> None:
    if name not in OPTIMIZER_NAMES:
        raise ValueError(f"name: unknown optimizer {name!r}; choose from {OPTIMIZER_NAMES}")


def make_optimizer(
    name: str,
    learning_rate: optax.ScalarOrSchedule,
    *,
    total_steps: int,
    key: jax.Array | int = 0,
    weight_decay: float = 0.0,
    clip_norm: float | None = 1.0,
    **hyperparams,
) -> optax.GradientTransformation:
    """Optimizer ``name`` with its recipe's defaults, global-norm clipping first.

    Args:
      name: one of :data:`OPTIMIZER_NAMES`.
      learning_rate: a float or an optax schedule ``step -> float``.
      total_steps: length of the run (SMET's prune-rate horizon and topology schedule).
      key: PRNG key of SMET's initial masks and regrowth and of POET-X's permutations at
        merges: a ``jax.random.key``, a raw ``uint32[2]`` key or an int seed
        (``jax.random.key(seed)``).
      weight_decay: decoupled weight decay, applied as the module docstring says per optimizer.
      clip_norm: ``optax.clip_by_global_norm`` threshold applied first; ``None`` for no clipping.
        For ``"poet_x"`` the threshold outside the merge warm-up (module docstring).
      **hyperparams: overrides of :func:`recipe_defaults` (e.g. ``level=4``, ``density=0.1``).
        For SMET, ``optimizer_warmup_steps`` defaults to ``update_every`` (overridden or not).

    Returns:
      ``optax.chain(<clipping>, <optimizer>)``, or the optimizer alone with ``clip_norm=None``.

    Raises:
      ValueError: on an unknown ``name`` or hyperparameter key, or an out-of-range value
        (``key`` included).
    """
    _check_name(name)
    total_steps = _common.check_int("total_steps", total_steps, lo=1)
    key = _common.prng_key(key)
    _common.check_scalar("weight_decay", weight_decay, lo=0.0)
    if clip_norm is not None:
        _common.check_scalar("clip_norm", clip_norm, lo=0.0, lo_open=True)
    known = recipe_defaults(name, total_steps)
    unknown = sorted(set(hyperparams) - set(known))
    if unknown:
        raise ValueError(
            f"hyperparams: unknown key {unknown[0]!r} for optimizer {name!r}; "
            f"known keys: {sorted(known)}"
        )
    if name == "smet" and "update_every" in hyperparams:
        known["optimizer_warmup_steps"] = hyperparams["update_every"]
    hp = {**known, **hyperparams}
    parts = _PARTS[name](learning_rate, total_steps, key, weight_decay, hp)
    if clip_norm is not None:
        parts = [_clip(name, clip_norm, hp), *parts]
    return parts[0] if len(parts) == 1 else optax.chain(*parts)


#: clip_by_global_norm_merge_warmup's argument -> the poet_x recipe's key, for error messages
_CLIP_ARG_KEYS = {"start_fraction": "clip_warmup_start", "warmup_steps": "clip_warmup_steps",
                  "until": "clip_warmup_until", "max_norm": "clip_norm"}


def _clip(name, clip_norm, hp) -> optax.GradientTransformation:
    if name != "poet_x" or not hp["clip_warmup"]:
        return optax.clip_by_global_norm(clip_norm)
    try:
        return clip_by_global_norm_merge_warmup(
            clip_norm, merge_every=hp["merge_every"], start_fraction=hp["clip_warmup_start"],
            warmup_steps=hp["clip_warmup_steps"], until=hp["clip_warmup_until"])
    except ValueError as e:
        arg, sep, rest = str(e).partition(":")
        if sep and arg in _CLIP_ARG_KEYS:
            raise ValueError(f"{_CLIP_ARG_KEYS[arg]}:{rest}") from None
        raise


def _adamw(learning_rate, total_steps, key, weight_decay, hp):
    del total_steps, key
    return [optax.adamw(learning_rate, weight_decay=weight_decay, mask=decay_mask, **hp)]


def _foam(learning_rate, total_steps, key, weight_decay, hp):
    del total_steps, key
    return [foam(learning_rate, weight_decay=weight_decay, **hp)]


def _smet(learning_rate, total_steps, key, weight_decay, hp):
    decay = [optax.add_decayed_weights(weight_decay)] if weight_decay else []
    return [*decay, smet(learning_rate, total_steps=total_steps, key=key, **hp)]


def _poet_x(learning_rate, total_steps, key, weight_decay, hp):
    del total_steps
    hp = {k: v for k, v in hp.items() if k not in (*_POET_MODEL_KEYS, *_POET_CLIP_KEYS)}
    scale = hp.pop("base_lr_scale")
    if callable(learning_rate):
        base = lambda count: scale * learning_rate(count)  # noqa: E731
    else:
        base = scale * learning_rate
    return [poet_x(learning_rate, weight_decay=weight_decay, base_learning_rate=base, key=key,
                   **hp)]


#: name -> the transforms that follow the clipping, in chain order
_PARTS: dict[str, Callable[..., list[optax.GradientTransformation]]] = {
    "adamw": _adamw,
    "foam": _foam,
    "smet": _smet,
    "poet_x": _poet_x,
}


def build_optimizer(name: str, lr: optax.ScalarOrSchedule, *, steps: int,
                    key: jax.Array | int = 0, weight_decay: float = 0.0,
                    **hyperparams) -> optax.GradientTransformation:
    """Recipe ``name`` of :func:`make_optimizer` on the default learning-rate schedule.

    Args:
      name: one of :data:`OPTIMIZER_NAMES`.
      lr: a number, the peak of :func:`jaxlib_ext.core.schedule.warmup_cosine` over ``steps``
        (linear warm-up over 10% of the steps, cosine decay to ``lr / 10``), the schedule of
        ``python -m jaxlib_ext train``; or an optax schedule, taken as is.
      steps: length of the run (``total_steps`` of :func:`make_optimizer`).
      key: PRNG key or int seed, as in :func:`make_optimizer`.
      weight_decay: as in :func:`make_optimizer`.
      **hyperparams: overrides of :func:`recipe_defaults`.

    Returns:
      The ``optax.GradientTransformation`` of :func:`make_optimizer`.
    """
    if isinstance(lr, (int, float)):
        from jaxlib_ext.core.schedule import warmup_cosine

        lr = warmup_cosine(lr, steps).to_optax()
    return make_optimizer(name, lr, total_steps=steps, key=key, weight_decay=weight_decay,
                          **hyperparams)
