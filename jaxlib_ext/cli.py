"""``python -m jaxlib_ext train ...``: composes a model, an optimizer and the runtime.

This is the one runtime module that knows the method families. Both registries map a
name to ``"module:function"`` and import lazily, so ``import jaxlib_ext`` stays cheap and
a family that fails to import only breaks the runs that ask for it.

Model factories are called as ``factory(preset, vocab_size=..., rngs=...)``; optimizer
builders as ``builder(schedule, steps=..., seed=..., weight_decay=...)``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

__all__ = ["MODELS", "OPTIMIZERS", "build_model", "build_optimizer", "build_parser", "main"]

MODELS: dict[str, str] = {
    "transformer": "jaxlib_ext.models.transformer:build_transformer",
    "mdn": "jaxlib_ext.models.mdn:build_mdn",
    "gdn": "jaxlib_ext.models.mdn:build_gdn",
}

OPTIMIZERS: dict[str, str] = {
    "adamw": "jaxlib_ext.cli:_adamw",
    "foam": "jaxlib_ext.cli:_foam",
    "smet": "jaxlib_ext.cli:_smet",
}


def _load(registry: dict[str, str], kind: str, name: str):
    if name not in registry:
        raise ValueError(f"--{kind}: unknown {kind} {name!r}; choose from {sorted(registry)}")
    module, _, attr = registry[name].partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--{kind} {name!r} is registered but not importable: {e}") from e


def build_model(name: str, preset: str = "tiny", *, vocab_size: int = 256, seed: int = 0):
    from flax import nnx

    return _load(MODELS, "model", name)(preset, vocab_size=vocab_size, rngs=nnx.Rngs(seed))


def schedule(lr: float, steps: int, warmup: int | None = None):
    """Linear warm-up then cosine decay to 10% of ``lr`` (the MDN paper's recipe, scaled)."""
    import optax

    warmup = max(1, min(steps // 10, 100)) if warmup is None else warmup
    return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1), lr * 0.1)


def decay_mask(params):
    """Which parameters take weight decay: matrices, unless their variable's metadata says
    ``weight_decay=False`` (gate vectors, norms and biases are left alone)."""
    import jax
    import numpy as np
    from flax import nnx

    def one(x):
        if isinstance(x, nnx.Variable):
            if x.get_metadata().get("weight_decay", True) is False:
                return False
            x = x.get_value()
        return np.ndim(x) >= 2

    return jax.tree.map(one, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _adamw(lr, *, steps, seed, weight_decay):
    import optax

    tx = optax.adamw(lr, weight_decay=weight_decay, mask=decay_mask)
    return optax.chain(optax.clip_by_global_norm(1.0), tx)


def _foam(lr, *, steps, seed, weight_decay):
    import optax

    from jaxlib_ext.optim import foam

    tx = foam(lr, b1=0.9, b2=0.95, weight_decay=weight_decay, level=2)
    return optax.chain(optax.clip_by_global_norm(1.0), tx)


def _smet(lr, *, steps, seed, weight_decay):
    import jax
    import optax

    from jaxlib_ext.optim import smet

    # Topology updates about 6 times a run (every 100 steps at most), each followed by the
    # optimizer warm-up of the same length, as in the authors' configs.
    every = max(1, min(100, steps // 6))
    tx = smet(lr, density=0.5, total_steps=steps, update_every=every,
              optimizer_warmup_steps=every, key=jax.random.PRNGKey(seed))
    decay = [optax.add_decayed_weights(weight_decay)] if weight_decay else []
    return optax.chain(optax.clip_by_global_norm(1.0), *decay, tx)


def build_optimizer(name: str, lr: float, *, steps: int, seed: int = 0, weight_decay=0.0):
    builder = _load(OPTIMIZERS, "optimizer", name)
    return builder(schedule(lr, steps), steps=steps, seed=seed, weight_decay=weight_decay)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jaxlib_ext", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a language model on a text corpus")
    t.add_argument("--model", default="transformer", help=f"one of {sorted(MODELS)}")
    t.add_argument("--preset", default="tiny", help="model size preset (default: tiny)")
    t.add_argument("--optimizer", default="adamw", help=f"one of {sorted(OPTIMIZERS)}")
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--batch-size", type=int, default=32, help="global batch (sequences)")
    t.add_argument("--seq-len", type=int, default=128)
    t.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--mesh", default=None, help="e.g. 'data=2,fsdp=2' (default: all on data)")
    t.add_argument("--parallel", choices=("jit", "pmap", "shard_map"), default="jit",
                   help="jit: sharded state (fsdp/tensor); pmap / shard_map: replicated state")
    t.add_argument("--corpus", default=None, help=".txt file or folder (default: embedded)")
    t.add_argument("--out-dir", default="runs/default", help="metrics.jsonl, loss.png, ...")
    t.add_argument("--checkpoint-dir", default=None, help="default: <out-dir>/checkpoints")
    t.add_argument("--checkpoint-every", type=int, default=100)
    t.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
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
    return parser


def run_train(args: argparse.Namespace):
    """The ``train`` command; returns :class:`jaxlib_ext.train.TrainResult`."""
    if args.num_cpu_devices is not None:
        os.environ["JAX_NUM_CPU_DEVICES"] = str(args.num_cpu_devices)
    from jaxlib_ext import distributed

    proc = distributed.initialize(args.coordinator, args.num_processes, args.process_id)

    import jax

    from jaxlib_ext import data, sharding, train

    # Cheap checks first, before any model is built or any file is written.
    if args.lr <= 0:
        raise ValueError(f"--lr must be positive, got {args.lr}")
    _load(MODELS, "model", args.model)
    _load(OPTIMIZERS, "optimizer", args.optimizer)
    mesh = sharding.make_mesh(args.mesh)
    corpus = data.load_corpus(args.corpus)
    model = build_model(args.model, args.preset, vocab_size=corpus.vocab_size, seed=args.seed)
    tx = build_optimizer(
        args.optimizer, args.lr, steps=args.steps, seed=args.seed, weight_decay=args.weight_decay
    )
    cfg = train.TrainConfig(
        steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed,
        parallel=args.parallel, eval_every=args.eval_every, eval_batches=args.eval_batches,
        log_every=args.log_every, checkpoint_every=args.checkpoint_every,
        checkpoint_dir=args.checkpoint_dir, out_dir=args.out_dir, resume=args.resume,
        progress=not args.no_progress,
        meta={"run": f"{args.model}:{args.preset} + {args.optimizer}", "argv": sys.argv[1:]},
    )
    main_process = jax.process_index() == 0
    if main_process:
        print(
            f"jaxlib_ext train: {args.model}:{args.preset} + {args.optimizer}, "
            f"{jax.device_count()} devices ({proc.num_processes} process(es)), mesh "
            f"{dict(mesh.shape)}, parallel={args.parallel}, corpus {corpus.source} "
            f"({corpus.num_tokens:,} tokens)",
            flush=True,
        )
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            run_train(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except FloatingPointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    return 0
