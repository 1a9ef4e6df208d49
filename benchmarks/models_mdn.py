"""Small language-model comparison: Momentum DeltaNet vs Gated DeltaNet vs Transformer.

The three tiny presets are trained for the same number of steps on the same batches of the
embedded corpus (byte tokens, :func:`jaxlib_ext.core.data.load_corpus`) with the same optimizer
(AdamW + warm-up/cosine schedule of the training CLI, clip 1.0) through
:func:`jaxlib_ext.core.train.fit`. Parameter counts are matched by widening the MLP of the smaller
models until each is within 1% of MDN's.

A single learning rate shared by all models can stall one of them and decide the comparison by
itself, so the comparison follows the rule of ``benchmarks/_comparison.py``: every model gets the
same learning-rate grid (``--lrs``) and seeds (``--seeds``, at least 3), each model's rate is
picked by validation loss, and the test loss is reported there. The held-out tail of the corpus
is split in two: its first half is the validation split (the eval of ``train.fit``), its second
half the test split. Prints the whole grid (validation loss per model and rate, every seed), a
summary (best rate, test loss mean ± std and every seed, ratio to the Transformer baseline,
parameters, training throughput: median tokens/s over the logging windows after the first, so
compilation is excluded) and one verdict line per pair, which says "within spread" unless the
mean ± std intervals are apart.

The paper's claim (arXiv 2605.05838) is MDN < GDN in loss at equal size.

    python -m benchmarks.models_mdn                      # 300 steps, seq 128, batch 16, 3x3 grid
    python -m benchmarks.models_mdn --steps 600 --lrs 3e-4,1e-3,3e-3 --seeds 5
    python -m benchmarks.models_mdn --fast               # smoke run (tiny budget)
"""

from __future__ import annotations

import argparse
import platform
import tempfile

import jax
import numpy as np
from flax import nnx

from benchmarks import _comparison as comparison
from jaxlib_ext.core import data, sharding, train
from jaxlib_ext.models import build_gdn, build_mdn, build_transformer, param_count
from jaxlib_ext.optim import build_optimizer


def _count(make) -> int:
    return param_count(nnx.eval_shape(make))


def _matched_builders(vocab: int, seq_len: int):
    """Builders whose parameter counts are within 1% of tiny MDN (MLP width adjusted)."""
    def mdn(hidden=None, seed=0):
        return build_mdn("tiny", vocab_size=vocab, rngs=nnx.Rngs(seed), max_seq_len=seq_len,
                         mlp_hidden=hidden)

    def gdn(hidden=None, seed=0):
        return build_gdn("tiny", vocab_size=vocab, rngs=nnx.Rngs(seed), max_seq_len=seq_len,
                         mlp_hidden=hidden)

    def transformer(hidden=None, seed=0):
        return build_transformer("tiny", vocab_size=vocab, rngs=nnx.Rngs(seed),
                                 max_seq_len=seq_len, mlp_hidden=hidden)

    target = _count(mdn)
    out = {"MDN": (mdn, None)}
    for name, build in (("GDN", gdn), ("Transformer", transformer)):
        base_hidden = nnx.eval_shape(build).cfg.hidden
        best = min(range(max(8, base_hidden - 256), base_hidden + 257, 8),
                   key=lambda h, b=build: abs(_count(lambda: b(h)) - target))
        out[name] = (build, best)
    return out, target


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    comparison.add_arguments(ap, lrs="1e-3,3e-3,1e-2")
    ap.add_argument("--eval-batches", type=int, default=8,
                    help="batches of each of the validation and test splits")
    ap.add_argument("--fast", action="store_true",
                    help="smoke run: 10 steps, batch 4 x seq 32, 1 eval batch")
    args = ap.parse_args(argv)
    if args.fast:
        args.steps, args.batch_size, args.seq_len, args.eval_batches = 10, 4, 32, 1

    corpus, test_batches = comparison.validation_and_test(
        data.load_corpus(None), args.batch_size, args.seq_len, args.eval_batches)
    mesh = sharding.make_mesh(None, devices=jax.devices()[:1])
    builders, target = _matched_builders(corpus.vocab_size, args.seq_len)
    spec = comparison.Comparison(
        methods=tuple(builders), lrs=args.lrs, seeds=tuple(range(args.seeds)),
        budget=f"{args.steps} steps x batch {args.batch_size} x seq {args.seq_len} byte tokens, "
               "AdamW (warm-up + cosine), clip 1.0",
    )
    test_loss = {}  # method -> jitted loss(params, rest, batch), compiled once per model

    def run(name: str, lr: float, seed: int) -> dict:
        build, hidden = builders[name]
        model = build(hidden, seed)
        graphdef, _, rest = nnx.split(model, nnx.Param, ...)
        if name not in test_loss:
            test_loss[name] = jax.jit(lambda p, r, b, g=graphdef: train.make_loss_fn(g, r)(p, b))
        tx = build_optimizer("adamw", lr, steps=args.steps, key=seed)
        with tempfile.TemporaryDirectory() as out:
            cfg = train.TrainConfig(
                steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                seed=seed, eval_every=args.steps, eval_batches=args.eval_batches,
                log_every=max(1, args.steps // 10), checkpoint_every=10 * args.steps,
                out_dir=out, progress=False,
            )
            try:
                result = train.fit(model, tx, corpus, cfg, mesh)
            except train.NonFiniteLossError:  # diverged: the worst choice of lr, not a crash
                return dict(val=np.nan, test=np.nan, params=param_count(model),
                            tokens_per_s=np.nan)
        params = result.state.params
        test = float(np.mean([float(test_loss[name](params, rest, b)) for b in test_batches]))
        rates = [r["tokens_per_s"] for r in result.history if "tokens_per_s" in r][1:]
        return dict(val=result.eval_losses[-1][1], test=test, params=param_count(model),
                    tokens_per_s=float(np.median(rates)) if rates else float("nan"))

    h = data.unigram_entropy(corpus.train, corpus.vocab_size)
    print(f"{spec.describe()}; {platform.processor() or platform.machine()}, "
          f"jax {jax.__version__}; unigram entropy {h:.3f} nats; parameters matched to "
          f"{target:,} (MDN)", flush=True)
    comparison.cache_compilations()
    result = comparison.run_comparison(spec, run)
    print(f"\nValidation loss (nats/token) over the whole grid ({len(spec.seeds)} seeds):\n")
    print(result.grid_table())
    print("\nTest loss (nats/token) at each model's best learning rate:\n")
    print(result.summary_table(baseline="Transformer", extras=(
        ("params", "params", ",.0f"), ("train tokens/s", "tokens_per_s", ",.0f"))))
    print()
    for a, b in (("MDN", "GDN"), ("MDN", "Transformer"), ("GDN", "Transformer")):
        print(result.verdict(a, b))
    print(f"\n{len(spec.methods) * len(spec.lrs) * len(spec.seeds)} runs, "
          f"{result.total_seconds():.0f} s")
    return result


if __name__ == "__main__":
    main()
