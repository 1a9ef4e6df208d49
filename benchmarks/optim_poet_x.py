"""POET-X vs AdamW on Transformer LMs: training-step memory, and eval loss under the comparison
rule.

1. Memory (``--part memory``): for the ``tiny`` Transformer (POET block 32: its widths are 128,
   352 and 384) and the ``125m`` preset with byte vocabulary (~85M parameters, POET block 256,
   the paper's), the bytes of the trainable parameters' optimizer state (``tx.init`` under
   ``jax.eval_shape``), the gradient bytes of the trained leaves, and XLA's planned peak of one
   jitted training step (``memory_analysis``: arguments + outputs + temporaries - aliased) on
   batch ``--mem-batch`` x ``--mem-seq``; POET-X also in memory mode (recomputing backward).
   Nothing is allocated or run.
2. Loss (``--part loss``): the tiny Transformer on the embedded corpus (byte tokens), same
   init, data order and schedule (warm-up 5%, cosine to 0.1x) for both; the rule of
   ``benchmarks/_comparison.py``: the learning-rate grid ``--lrs`` for each optimizer, at least
   3 seeds, rate picked by validation loss, test loss reported there, whole grid printed.
   POET-X runs the ``poet_x`` recipe (``prepare_model`` + ``make_optimizer``): rotations at
   ``0.5 lr``, other leaves (embedding, LM head, norms) at ``2 lr``, merges every
   ``--merge-every`` steps, gradient clipping at norm 1 with the authors' warm-up after each
   merge (0.1 to 1 over 10 steps, ``clip_warmup=True``, the recipe's default); the variant
   ``poet_x_no_clip_warmup`` (``clip_warmup=False``) clips at norm 1 throughout, as AdamW (the
   ``adamw`` recipe) does.

Usage::

    python -m benchmarks.optim_poet_x                  # both parts, 300 steps x 3 lrs x 3 seeds
    python -m benchmarks.optim_poet_x --part memory
    python -m benchmarks.optim_poet_x --part loss --steps 600 --lrs 1e-3,3e-3,1e-2
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks import _comparison as comparison
from jaxlib_ext.core import data as data_lib
from jaxlib_ext.core.memory import compiled_memory, format_bytes, tree_bytes
from jaxlib_ext.models.presets import param_count
from jaxlib_ext.models.transformer import build_transformer
from jaxlib_ext.optim import make_optimizer, poet_layers, prepare_model

BLOCK = {"tiny": 32, "125m": 256}


def build(name, preset, seed, *, memory_saving=False, vocab=256):
    model = build_transformer(preset, vocab_size=vocab, rngs=nnx.Rngs(seed))
    if name == "poet_x":
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # every dense layer must convert
            model = prepare_model("poet_x", model, block_size=BLOCK[preset],
                                  memory_saving=memory_saving)
    return model


def loss_of(graphdef, rest):
    def loss_fn(p, tokens):
        logits = nnx.merge(graphdef, p, rest)(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), tokens[:, 1:]).mean()
    return loss_fn


#: benchmark method -> (recipe, its overrides besides merge_every)
RECIPES = {"adamw": ("adamw", {}), "poet_x": ("poet_x", {}),
           "poet_x_no_clip_warmup": ("poet_x", {"clip_warmup": False})}


def optimizer(name, lr, steps, seed, merge_every):
    recipe, extra = RECIPES[name]
    if recipe == "poet_x":
        extra = {**extra, "merge_every": merge_every}
    return make_optimizer(recipe, lr, total_steps=steps, key=seed, **extra)


def trained_bytes(params):
    """Bytes of the leaves an optimizer moves: all but the POET base weights and permutations."""
    from jaxlib_ext.optim import poet_labels

    labels = jax.tree.leaves(poet_labels(params))
    return sum(tree_bytes(p) for p, lab in zip(jax.tree.leaves(params), labels, strict=True)
               if lab != "frozen")


def memory_row(name, preset, batch, seq, memory_saving=False):
    model = nnx.eval_shape(lambda: build(name, preset, 0, memory_saving=memory_saving))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optimizer(name, 1e-3, 1000, 0, 200)
    state = jax.eval_shape(tx.init, params)
    loss_fn = loss_of(graphdef, rest)

    def step(p, s, tokens):
        loss, g = jax.value_and_grad(loss_fn)(p, tokens)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    tokens = jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32)
    t0 = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, tokens).compile()
    mem = compiled_memory(compiled)
    n_layers = len(poet_layers(model)) if name == "poet_x" else 0
    return dict(params=param_count(model) if name != "poet_x" else None,
                trained=trained_bytes(params), state=tree_bytes(state), peak=mem.get("peak"),
                temp=mem.get("temp"), layers=n_layers, compile_s=time.perf_counter() - t0)


def part_memory(args):
    print(f"\n## Training-step memory (batch {args.mem_batch} x {args.mem_seq} tokens, float32, "
          "planned by XLA on CPU)\n")
    print("| model | optimizer | POET layers (b) | trained bytes | optimizer state | "
          "state vs AdamW | step peak | peak vs AdamW |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for preset in args.presets.split(","):
        rows = {"adamw": memory_row("adamw", preset, args.mem_batch, args.mem_seq)}
        rows["poet_x"] = memory_row("poet_x", preset, args.mem_batch, args.mem_seq)
        rows["poet_x memory mode"] = memory_row("poet_x", preset, args.mem_batch, args.mem_seq,
                                                memory_saving=True)
        base = rows["adamw"]
        for name, r in rows.items():
            layers = f"{r['layers']} ({BLOCK[preset]})" if r["layers"] else "-"
            print(f"| {preset} ({base['params'] / 1e6:.1f}M params) | {name} | {layers} | "
                  f"{format_bytes(r['trained'])} | {format_bytes(r['state'])} | "
                  f"{r['state'] / base['state']:.3f}x | {format_bytes(r['peak'])} | "
                  f"{r['peak'] / base['peak']:.2f}x |", flush=True)


def train(name, *, steps, batch, seq_len, lr, seed, corpus, merge_every, n_eval=8):
    model = build(RECIPES[name][0], "tiny", seed, vocab=corpus.vocab_size)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 20), steps, lr * 0.1)
    tx = optimizer(name, sched, steps, seed, merge_every)
    opt_state = tx.init(params)
    loss_fn = loss_of(graphdef, rest)

    @jax.jit
    def step(p, s, tokens):
        loss, g = jax.value_and_grad(loss_fn)(p, tokens)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    eval_fn = jax.jit(loss_fn)
    rng = np.random.default_rng(seed)
    n = corpus.train.shape[0] - seq_len - 1

    def windows(tokens, offsets):
        return jnp.asarray(np.stack([tokens[o:o + seq_len + 1] for o in offsets]), jnp.int32)

    half = corpus.eval.shape[0] // 2

    def held_out(tokens):
        off = np.linspace(0, tokens.shape[0] - seq_len - 2, n_eval * batch).astype(int)
        return [windows(tokens, off[i * batch:(i + 1) * batch]) for i in range(n_eval)]

    vals, tests = held_out(corpus.eval[:half]), held_out(corpus.eval[half:])
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state,
                                       windows(corpus.train, rng.integers(0, n, batch)))
        losses.append(float(loss))
    wall = time.perf_counter() - t0
    val = float(np.mean([float(eval_fn(params, b)) for b in vals]))
    test = float(np.mean([float(eval_fn(params, b)) for b in tests]))
    return dict(val=val, test=test, train_loss=float(np.mean(losses[-20:])), wall=wall)


LABELS = {"adamw": "AdamW (adamw recipe)", "poet_x": "POET-X (poet_x recipe, b=32)",
          "poet_x_no_clip_warmup": "POET-X, clip_warmup=False (variant)"}


def part_loss(args):
    corpus = data_lib.load_corpus()
    spec = comparison.Comparison(
        methods=("adamw", "poet_x", "poet_x_no_clip_warmup"), lrs=args.lrs,
        seeds=tuple(range(args.seeds)),
        budget=f"{args.steps} steps, batch {args.batch}x{args.seq_len} byte tokens, warm-up 5% + "
               f"cosine to 0.1x, clip 1.0; POET merges every {args.merge_every} steps, clip "
               f"warm-up 0.1 -> 1 over 10 steps after each (variant: none)",
    )
    print(f"\n## Eval loss, tiny Transformer, {corpus.source}: {spec.describe()}\n", flush=True)

    def run(name, lr, seed):
        return train(name, steps=args.steps, batch=args.batch, seq_len=args.seq_len, lr=lr,
                     seed=seed, corpus=corpus, merge_every=args.merge_every)

    comparison.cache_compilations()
    result = comparison.run_comparison(spec, run)
    print("Validation loss over the whole grid:\n")
    print(result.grid_table(labels=LABELS))
    print("\nTest loss at each optimizer's best learning rate:\n")
    print(result.summary_table(baseline="adamw", labels=LABELS, extras=(
        ("final train loss (mean last 20)", "train_loss", ".4f"), ("s", "wall", ".0f"))))
    print()
    print(result.verdict("poet_x", "adamw"))
    print(result.verdict("poet_x_no_clip_warmup", "adamw"))
    print(result.verdict("poet_x", "poet_x_no_clip_warmup"))
    print(f"\n{len(spec.methods) * len(spec.lrs) * len(spec.seeds)} runs, "
          f"{result.total_seconds():.0f} s")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("memory", "loss", "both"), default="both")
    ap.add_argument("--presets", default="tiny,125m")
    ap.add_argument("--mem-batch", type=int, default=8)
    ap.add_argument("--mem-seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--merge-every", type=int, default=100)
    comparison.add_arguments(ap, lrs="1e-3,3e-3,1e-2")
    ap.add_argument("--fast", action="store_true", help="smoke run: tiny budget, tiny only")
    args = ap.parse_args(argv)
    if args.fast:
        args.steps, args.batch, args.seq_len, args.merge_every = 20, 4, 32, 10
        args.presets, args.mem_batch, args.mem_seq = "tiny", 2, 64
    print(f"jax {jax.__version__}, optax {optax.__version__}, flax {nnx.__name__.split('.')[0]}, "
          f"{platform.processor() or platform.machine()}, {jax.devices()[0].device_kind}")
    if args.part in ("memory", "both"):
        part_memory(args)
    if args.part in ("loss", "both"):
        part_loss(args)


if __name__ == "__main__":
    main()
