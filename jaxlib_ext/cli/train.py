"""``python -m jaxlib_ext train ...``: composes a model, an optimizer and the training loop.

The command that knows the method families. Every model is a composed language model
(:func:`jaxlib_ext.models.lm.compose`, imported when the command runs so ``import jaxlib_ext``
stays cheap): ``--mixer`` and ``--ffn`` (and ``--arch key=value`` for any flat
:class:`~jaxlib_ext.models.LMConfig` field); ``--model transformer|mdn|gdn`` are the
``attention|mdn|gdn + swiglu`` presets (:data:`jaxlib_ext.models.lm.MODEL_MIXERS`). The
composed config is recorded with every checkpoint, so that ``--init-from`` (a new run from a
checkpoint's parameters, e.g. one that ``python -m jaxlib_ext grow`` grew) rebuilds its model.
Optimizers are the recipes of :func:`jaxlib_ext.optim.make_optimizer`; ``--opt key=value``
overrides any of a recipe's hyperparameters.

The library raises errors that name its own arguments (``TrainConfig.batch_size``,
``spec: ...``); this module maps them to the flags a user typed (:func:`flag_message`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

__all__ = [
    "FLAGS",
    "build_model",
    "model_config",
    "parse_arch",
    "build_parser",
    "flag_message",
    "main",
    "parse_opt",
    "run_train",
]

#: ``TrainConfig`` field -> the flag that sets it
FLAGS: dict[str, str] = {
    "steps": "--steps",
    "batch_size": "--batch-size",
    "seq_len": "--seq-len",
    "seed": "--seed",
    "parallel": "--parallel",
    "eval_every": "--eval-every",
    "eval_batches": "--eval-batches",
    "log_every": "--log-every",
    "checkpoint_every": "--checkpoint-every",
    "checkpoint_dir": "--checkpoint-dir",
    "out_dir": "--out-dir",
    "resume": "--resume",
    "schedule": "--lr/--steps",
}


def flag_message(message: str) -> str:
    """``message`` with every ``TrainConfig.<field>`` replaced by the field's flag."""
    return re.sub(r"TrainConfig\.(\w+)", lambda m: FLAGS.get(m[1], m[0]), message)


def _renamed(error: Exception, names: dict[str, str]) -> ValueError:
    """``error`` of a library call with its argument names replaced by ``names``' flags."""
    pattern = r"\b(" + "|".join(map(re.escape, names)) + r")\b"
    return ValueError(re.sub(pattern, lambda m: names[m[1]], str(error)))


def build_model(name: str, preset: str = "tiny", *, vocab_size: int = 256, seed: int = 0):
    """The model ``--model name --preset preset`` trains."""
    from flax import nnx

    from jaxlib_ext.models.lm import build_lm, compose

    return build_lm(compose(model=name, preset=preset, vocab_size=vocab_size),
                    rngs=nnx.Rngs(seed))


def parse_arch(items: list[str]) -> dict:
    """``--arch key=value`` items as flat :class:`~jaxlib_ext.models.LMConfig` field overrides
    (a value is read as ``none``, a bool, an int, a float or else a string)."""
    from jaxlib_ext.models.lm import arch_keys

    fields = arch_keys()
    out: dict = {}
    for key, text in _assignments(items, "--arch"):
        if key not in fields:
            raise ValueError(f"--arch: unknown key {key!r}; known keys: {fields}")
        out[key] = None if text.lower() == "none" else _parse_value(text)
    return out


def model_config(args, vocab_size: int):
    """The :class:`~jaxlib_ext.models.LMConfig` the flags select."""
    from jaxlib_ext.models.lm import compose

    try:
        return compose(model=args.model, mixer=args.mixer, ffn=args.ffn, preset=args.preset,
                       vocab_size=vocab_size, overrides=parse_arch(args.arch))
    except (ValueError, TypeError) as e:
        raise _renamed(e, {"preset": "--preset", "mixer": "--mixer", "ffn": "--ffn",
                           "model": "--model"}) from None


def _build_from_args(args, vocab_size: int):
    """``(model, lm_config)`` of the flags."""
    from flax import nnx

    from jaxlib_ext.models.lm import build_lm

    lm_cfg = model_config(args, vocab_size)
    return build_lm(lm_cfg, rngs=nnx.Rngs(args.seed)), lm_cfg


def _assignments(items: list[str], flag: str) -> list[tuple[str, str]]:
    """``flag key=value`` items as stripped ``(key, value text)`` pairs, in order."""
    pairs = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag}: expected key=value, got {item!r}")
        pairs.append((key.strip(), text.strip()))
    return pairs


def _parse_value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_opt(items: list[str], optimizer: str, steps: int) -> dict:
    """``--opt key=value`` items as hyperparameters of recipe ``optimizer``.

    A value is read as a bool (``true``/``false``), an int, a float or else a string, then
    given the type of the recipe's default (an int where a float is expected becomes a
    float). Errors name ``--opt`` and the key.
    """
    from jaxlib_ext.optim import recipe_defaults

    try:
        defaults = recipe_defaults(optimizer, steps)
    except ValueError as e:
        raise _renamed(e, {"name": "--optimizer"}) from None
    out: dict = {}
    for key, text in _assignments(items, "--opt"):
        if key not in defaults:
            raise ValueError(
                f"--opt: unknown key {key!r} for --optimizer {optimizer}; "
                f"known keys: {sorted(defaults)}"
            )
        if key in out:
            raise ValueError(f"--opt: key {key!r} given twice")
        value, want = _parse_value(text), type(defaults[key])
        if want is float and type(value) is int:
            value = float(value)
        if type(value) is not want:
            raise ValueError(
                f"--opt {key}: expected {want.__name__} (default {defaults[key]!r}), "
                f"got {text!r}"
            )
        out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    from jaxlib_ext.core.train import PARALLEL_MODES
    from jaxlib_ext.models import FFNS, MIXERS
    from jaxlib_ext.models.lm import MODEL_MIXERS
    from jaxlib_ext.optim import OPTIMIZER_NAMES
    from jaxlib_ext.pallas_kernels import METHODS, mlstm

    t = argparse.ArgumentParser(prog="python -m jaxlib_ext train",
                                description="train a language model on a text corpus")
    t.add_argument("--model", default=None,
                   help=f"one of {sorted(MODEL_MIXERS)} (default: transformer); transformer, "
                        "mdn and gdn are the attention, mdn and gdn mixers with a swiglu FFN")
    t.add_argument("--mixer", default=None, choices=MIXERS,
                   help="token mixer of every block (composable model); mlstm is the xLSTM "
                        "paper's mLSTM layer")
    t.add_argument("--ffn", default=None, choices=FFNS,
                   help="feed-forward part of every block (composable model)")
    t.add_argument("--arch", action="append", default=[], metavar="KEY=VALUE",
                   help="set a field of the composed model's LMConfig, e.g. --arch "
                        "num_experts=16 --arch latent_dim=32 (repeatable); method= (the "
                        "mixer's op) and moe_method= (the MoE dispatch) take one of "
                        f"{', '.join(METHODS)} (mlstm: {', '.join(mlstm.METHODS)}, with "
                        f"xla_form= one of {', '.join(mlstm.XLA_FORMS)})")
    t.add_argument("--preset", default="tiny",
                   help="model size preset (default: tiny), or a named composed model: "
                        "moe-tiny, latent-moe-tiny, mdn-latent-moe-tiny")
    t.add_argument("--init-from", default=None, metavar="CKPT_DIR",
                   help="start a new run (step 0, fresh optimizer and schedule) from the "
                        "parameters of the newest checkpoint in CKPT_DIR, e.g. one written "
                        "by python -m jaxlib_ext grow; the model is the config "
                        "recorded there (the model flags are not read). With --resume, the "
                        "run continues from its own newest checkpoint when it has one")
    # checked by the recipes themselves (their error names the flag), so no argparse choices
    t.add_argument("--optimizer", default="adamw",
                   help=f"a recipe of jaxlib_ext.optim.make_optimizer: "
                        f"{', '.join(OPTIMIZER_NAMES)} (default: adamw)")
    t.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                   help="set a hyperparameter of the --optimizer recipe, e.g. --opt level=4 "
                        "--opt density=0.1 (repeatable; keys: jaxlib_ext.optim."
                        "recipe_defaults(name))")
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--batch-size", type=int, default=32, help="global batch (sequences)")
    t.add_argument("--seq-len", type=int, default=128)
    t.add_argument("--lr", type=float, default=3e-3,
                   help="peak learning rate: linear warm-up over 10%% of --steps (1 to 100 "
                        "steps), cosine decay to lr/10 at --steps")
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--mesh", default=None, help="e.g. 'data=2,fsdp=2' (default: all on data)")
    t.add_argument("--parallel", choices=PARALLEL_MODES, default="jit",
                   help="jit: sharded state (fsdp/tensor); pmap / shard_map: replicated state")
    t.add_argument("--corpus", default=None, help=".txt file or folder (default: embedded)")
    t.add_argument("--out-dir", default="runs/default", help="metrics.jsonl, loss.png, ...")
    t.add_argument("--checkpoint-dir", default=None, help="default: <out-dir>/checkpoints")
    t.add_argument("--checkpoint-every", type=int, default=100)
    t.add_argument("--resume", action="store_true",
                   help="continue from the newest committed checkpoint (from scratch if "
                        "none); --lr and --steps must be those of the run being resumed")
    t.add_argument("--extend-schedule", action="store_true",
                   help="with --resume and a --steps other than the run's: keep the recorded "
                        "learning-rate schedule, unchanged up to its recorded end, and hold "
                        "its final value for every step past it")
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--eval-batches", type=int, default=4)
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    m = t.add_argument_group("multi-host (or JAX_COORDINATOR_ADDRESS/_NUM_PROCESSES/_PROCESS_ID)")
    m.add_argument("--coordinator", default=None, help="host:port of process 0")
    m.add_argument("--num-processes", type=int, default=None)
    m.add_argument("--process-id", type=int, default=None)
    m.add_argument("--num-cpu-devices", type=int, default=None,
                   help="simulated CPU devices per process (sets JAX_NUM_CPU_DEVICES)")
    return t


def _recorded_run(ckpt_dir) -> dict | None:
    """The metadata of the newest committed checkpoint in ``ckpt_dir``, if any."""
    if not ckpt_dir.is_dir() or not any(p.name.isdigit() for p in ckpt_dir.iterdir()):
        return None
    from jaxlib_ext.core.checkpoint import Checkpointer

    with Checkpointer(ckpt_dir, read_only=True) as ckpt:
        step = ckpt.latest_step()
        return None if step is None else ckpt.restore_meta(step)


def _run_schedule(args, ckpt_dir):
    """``(schedule, optimizer_steps)`` of the run.

    The default schedule for ``--lr``/``--steps`` and ``optimizer_steps = --steps``; on
    ``--resume``, the schedule and horizon the checkpoint recorded, which a resume never
    changes silently: another ``--lr`` is refused, another ``--steps`` too unless
    ``--extend-schedule`` (then both stay as recorded and the added steps follow the
    schedule's final value; the optimizer's own step-dependent settings, such as SMET's
    topology schedule, keep their recorded horizon likewise).
    """
    from jaxlib_ext.core.schedule import WarmupCosine, warmup_cosine

    requested = warmup_cosine(args.lr, args.steps)
    if args.extend_schedule and not args.resume:
        raise ValueError("--extend-schedule only applies with --resume")
    recorded_run = _recorded_run(ckpt_dir) if args.resume else None
    if not recorded_run or "schedule" not in recorded_run:
        return requested, args.steps
    recorded = WarmupCosine.from_dict(recorded_run["schedule"])
    recorded_steps = int(recorded_run["steps"])
    horizon = int(recorded_run.get("optimizer_steps", recorded_steps))
    if recorded.peak_lr != requested.peak_lr:
        raise ValueError(
            f"--lr {args.lr} differs from the peak learning rate {recorded.peak_lr} recorded by "
            f"the run being resumed (step {recorded_run.get('step')} in {ckpt_dir}); pass "
            f"--lr {recorded.peak_lr} as before"
        )
    if args.steps == recorded_steps:
        return recorded, horizon
    if args.extend_schedule:
        return recorded.extended_to(args.steps), horizon
    raise ValueError(
        f"--steps {args.steps} differs from the run being resumed (--steps {recorded_steps}, "
        f"step {recorded_run.get('step')} in {ckpt_dir}), whose learning-rate schedule was "
        f"recorded as {recorded}; another --steps would silently change that curve. Pass "
        f"--steps {recorded_steps} as before, or --extend-schedule to train to step "
        f"{args.steps} on the recorded curve (unchanged up to step {recorded.total_steps}, "
        f"its final value {recorded.end_lr:g} held after)"
    )


def run_train(args: argparse.Namespace):
    """The ``train`` command; returns :class:`jaxlib_ext.core.train.TrainResult`."""
    if args.num_cpu_devices is not None:
        os.environ["JAX_NUM_CPU_DEVICES"] = str(args.num_cpu_devices)
    from jaxlib_ext.core import distributed

    try:
        proc = distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    except ValueError as e:
        raise _renamed(e, {"coordinator": "--coordinator", "num_processes": "--num-processes",
                           "process_id": "--process-id"}) from None

    import jax

    from jaxlib_ext.core import data, sharding, train

    # Cheap checks first, before any model is built or any file is written.
    if args.lr <= 0:
        raise ValueError(f"--lr must be positive, got {args.lr}")
    if args.steps <= 0:
        raise ValueError(f"--steps must be positive, got {args.steps}")
    from jaxlib_ext.models.lm import MODEL_MIXERS

    if args.model is not None and args.model not in MODEL_MIXERS:
        raise ValueError(f"--model: unknown model {args.model!r}; choose from "
                         f"{sorted(MODEL_MIXERS)}")
    parse_opt(args.opt, args.optimizer, args.steps)  # the keys and types, before any I/O
    try:
        mesh = sharding.make_mesh(args.mesh)
    except ValueError as e:
        raise _renamed(e, {"spec": "--mesh"}) from None
    try:
        corpus = data.load_corpus(args.corpus)
    except (ValueError, FileNotFoundError) as e:
        raise _renamed(e, {"path": "--corpus", "none": "no --corpus"}) from None
    cfg = train.TrainConfig(
        steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed,
        parallel=args.parallel, eval_every=args.eval_every, eval_batches=args.eval_batches,
        log_every=args.log_every, checkpoint_every=args.checkpoint_every,
        checkpoint_dir=args.checkpoint_dir, out_dir=args.out_dir, resume=args.resume,
        progress=not args.no_progress,
        meta={"run": "", "argv": sys.argv[1:]},
    )
    cfg.schedule, optimizer_steps = _run_schedule(args, cfg.ckpt_dir)
    cfg.meta["optimizer_steps"] = optimizer_steps
    hyperparams = parse_opt(args.opt, args.optimizer, optimizer_steps)
    if args.init_from is not None:
        from jaxlib_ext.models import growth

        model, lm_cfg = growth.load_model(args.init_from)
        name = f"{lm_cfg.mixer_name}+{lm_cfg.ffn_name} (from {args.init_from})"
    else:
        model, lm_cfg = _build_from_args(args, corpus.vocab_size)
        from jaxlib_ext.models import LM_PRESETS

        composed = bool(args.mixer or args.ffn or args.arch or args.preset in LM_PRESETS)
        name = (f"{lm_cfg.mixer_name}+{lm_cfg.ffn_name}:{args.preset}" if composed
                else f"{args.model or 'transformer'}:{args.preset}")
        _check_recorded_model(args, cfg.ckpt_dir, lm_cfg)
    from jaxlib_ext.models.lm import check_expert_mesh

    try:
        check_expert_mesh(lm_cfg, mesh.shape)
    except ValueError as e:
        raise _renamed(e, {"mesh": "--mesh", "ffn": "--ffn",
                           "num_experts=...": "--arch num_experts=..."}) from None
    cfg.meta["run"] = f"{name} + {args.optimizer}"
    cfg.meta["model"] = lm_cfg.to_dict()
    from jaxlib_ext.optim import build_optimizer, prepare_model

    model = prepare_model(args.optimizer, model, **hyperparams)
    tx = build_optimizer(args.optimizer, cfg.schedule.to_optax(), steps=optimizer_steps,
                         key=args.seed, weight_decay=args.weight_decay, **hyperparams)
    main_process = jax.process_index() == 0
    if main_process:
        print(
            f"jaxlib_ext train: {cfg.meta['run']}, "
            f"{jax.device_count()} devices ({proc.num_processes} process(es)), mesh "
            f"{dict(mesh.shape)}, parallel={args.parallel}, corpus {corpus.source} "
            f"({corpus.num_tokens:,} tokens)",
            flush=True,
        )
        print(f"model: {_accounting_line(model, lm_cfg, args.seq_len)}", flush=True)
    result = train.fit(model, tx, corpus, cfg, mesh)
    if main_process:
        h = data.unigram_entropy(corpus.train, corpus.vocab_size)
        final = result.eval_losses[-1][1] if result.eval_losses else float("nan")
        print(
            f"done: step {int(result.state.step)}, eval loss {final:.4f} nats/token "
            f"(unigram entropy {h:.4f}); outputs in {result.out_dir}/ "
            f"(metrics.jsonl, loss.png, checkpoints)",
            flush=True,
        )
    return result


def _accounting_line(model, lm_cfg, seq_len: int) -> str:
    """Parameters, active parameters and forward FLOPs per token
    (:func:`jaxlib_ext.models.accounting.lm_cost`; the parameter count alone otherwise)."""
    from jaxlib_ext.models import param_count

    if lm_cfg is None:
        return f"{param_count(model) / 1e6:,.2f}M params"
    from jaxlib_ext.models.accounting import lm_cost

    acc = lm_cost(lm_cfg, seq_len=seq_len)
    parts = ", ".join(f"{k} {c.flops / 1e6:.2f}" for k, c in acc.components.items() if c.flops)
    return f"{acc.summary()} (MFLOPs/token: {parts})"


def _check_recorded_model(args, ckpt_dir, lm_cfg) -> None:
    """A resumed run trains the model its checkpoint recorded, or stops here."""
    if not args.resume:
        return
    recorded = _recorded_run(ckpt_dir)
    if not recorded or "model" not in recorded or lm_cfg is None:
        return
    model = recorded["model"]
    try:  # the recorded config as the library reads it (saved method names included)
        from jaxlib_ext.models import LMConfig

        model = LMConfig.from_dict(model).to_dict()
    except (TypeError, ValueError):
        pass  # not a config this library builds: compared as recorded
    if model != lm_cfg.to_dict():
        diff = sorted(k for k, v in lm_cfg.to_dict().items() if model.get(k) != v)
        raise ValueError(
            f"--resume: the model flags differ from the run being resumed in {diff} "
            f"(recorded in {ckpt_dir}); pass the flags of that run (a grown checkpoint starts "
            f"a new run with --init-from)"
        )


def main(argv: list[str] | None = None) -> int:
    from jaxlib_ext.cli._status import run_command

    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    return run_command(run_train, args, message=flag_message)
