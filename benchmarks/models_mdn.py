"""Small language-model comparison: Momentum DeltaNet vs Gated DeltaNet vs Transformer.

The three tiny presets are trained for the same number of steps on the same batches of the
embedded corpus (byte tokens, :func:`jaxlib_ext.data.load_corpus`) with the same optimizer
(AdamW + warm-up/cosine schedule of the training CLI, clip 1.0) through
:func:`jaxlib_ext.train.fit`. Parameter counts are matched by widening the MLP of the smaller
models until each is within 1% of MDN's. Prints a markdown table of eval loss (nats/token, mean
over seeds) with the ratio to the Transformer baseline, plus training throughput (median
tokens/s over the logging windows after the first, so compilation is excluded).

The paper's claim (arXiv 2605.05838) is MDN < GDN in loss at equal size; at this scale and budget
the differences are small and seed noise matters, so several seeds are worth running.

    python benchmarks/models_mdn.py                      # 300 steps, seq 128, batch 16, 1 seed
    python benchmarks/models_mdn.py --steps 600 --seeds 3
    python benchmarks/models_mdn.py --fast               # smoke run (20 steps)
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time

import jax
import numpy as np
from flax import nnx

from jaxlib_ext import data, sharding, train
from jaxlib_ext.cli import build_optimizer
from jaxlib_ext.models import build_gdn, build_mdn, build_transformer, param_count


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
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--fast", action="store_true", help="20 steps, for a smoke run")
    args = ap.parse_args(argv)
    if args.fast:
        args.steps, args.eval_batches = 20, 2

    corpus = data.load_corpus(None)
    mesh = sharding.make_mesh(None, devices=jax.devices()[:1])
    builders, target = _matched_builders(corpus.vocab_size, args.seq_len)
    rows = {}
    for name, (build, hidden) in builders.items():
        losses, secs, tps = [], [], []
        for seed in range(args.seeds):
            model = build(hidden, seed)
            tx = build_optimizer("adamw", args.lr, steps=args.steps, seed=seed)
            with tempfile.TemporaryDirectory() as out:
                cfg = train.TrainConfig(
                    steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                    seed=seed, eval_every=args.steps, eval_batches=args.eval_batches,
                    log_every=max(1, args.steps // 10), checkpoint_every=10 * args.steps,
                    out_dir=out, progress=False,
                )
                t0 = time.perf_counter()
                result = train.fit(model, tx, corpus, cfg, mesh)
                secs.append(time.perf_counter() - t0)
            losses.append(result.eval_losses[-1][1])
            rates = [r["tokens_per_s"] for r in result.history if "tokens_per_s" in r][1:]
            tps.append(float(np.median(rates)) if rates else float("nan"))  # compile excluded
            print(f"{name} seed {seed}: eval loss {losses[-1]:.4f} ({secs[-1]:.0f} s)", flush=True)
        rows[name] = (param_count(model), float(np.mean(losses)), float(np.std(losses)),
                      float(np.mean(tps)))

    base = rows["Transformer"][1]
    h = data.unigram_entropy(corpus.train, corpus.vocab_size)
    print(f"\n{args.steps} steps x batch {args.batch_size} x seq {args.seq_len} byte tokens, "
          f"AdamW lr {args.lr} (warm-up + cosine), {args.seeds} seed(s); "
          f"{platform.processor() or platform.machine()}, jax {jax.__version__}; "
          f"unigram entropy {h:.3f} nats\n")
    print("| model | params | eval loss (nats/token) | ratio vs Transformer | train tokens/s |")
    print("|---|---|---|---|---|")
    for name, (n, mean, std, rate) in rows.items():
        spread = f" ± {std:.3f}" if args.seeds > 1 else ""
        print(f"| {name} | {n:,} | {mean:.4f}{spread} | {mean / base:.3f} | {rate:,.0f} |")
    return rows


if __name__ == "__main__":
    main()
