"""Train the tiny Transformer (or MDN) with AdamW, FOAM and SMET; loss spikes of DST vs SMET.

Same model init, data order and learning-rate schedule (linear warm-up 5%, cosine to 0.1x) for
every optimizer, byte-level tokens of the embedded corpus (``jaxlib_ext.core.data.load_corpus``),
``jaxlib_ext.models.transformer.build_transformer("tiny")``.

One peak learning rate shared by all optimizers can favour one of them and decide the
comparison by itself, so the comparison follows the rule of ``benchmarks/_comparison.py``: every
optimizer gets the same learning-rate grid (``--lrs``) and seeds (``--seeds``, at least 3; a
seed sets the model init, the data order and SMET's masks), each optimizer's rate is picked by
validation loss and the test loss is reported there. The held-out tail of the corpus is split in
two: fixed windows of its first half are the validation split, of its second half the test
split. Prints, as markdown:

1. validation loss over the whole grid (every optimizer and rate, mean ± std and every seed);
2. test loss per optimizer at its best rate (mean ± std and every seed), ratio to the first
   optimizer (the baseline), final train loss, seconds per run; one verdict line per optimizer
   against the baseline, "within spread" unless the mean ± std intervals are apart;
3. for dynamic sparse training at density 0.5, at each variant's best rate, the largest loss
   jump within 10 steps after each topology update, measured on a fixed training batch (so
   batch noise does not count): ``max_u max_{s in (u, u+10]} L(s) - L(u)``, SMET (code
   warm-up, lr/d) vs naive DST (global Adam step for regrown weights, no warm-up, no density lr
   scale); the variants ``naive_dst_lr_d`` (naive with lr/d) and ``smet_reset`` (paper-text
   warm-up) separate the effects. With ``warmup_mode="code"`` the stored-moment ramp of the
   first ``optimizer_warmup_steps`` global steps also damps every dense parameter (as the
   released code), and here ``optimizer_warmup_steps = update_every``, so the first topology
   update coincides with the end of that ramp: the "updates 2+" column leaves it out.

Usage::

    python -m benchmarks.optim_foam_smet_training          # 300 steps, topology every 50
    python -m benchmarks.optim_foam_smet_training --steps 600 --update-every 100 --batch 32
    python -m benchmarks.optim_foam_smet_training --lrs 3e-4,1e-3,3e-3 --seeds 5
    python -m benchmarks.optim_foam_smet_training --fast   # smoke run (tiny budget)
"""

from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks import _comparison as comparison
from jaxlib_ext.core import data as data_lib
from jaxlib_ext.core import sharding as sharding_lib
from jaxlib_ext.core import train as train_lib
from jaxlib_ext.models import build_mdn, build_transformer
from jaxlib_ext.optim import make_optimizer

_DST = ("naive_dst", "naive_dst_lr_d", "smet_reset", "smet")
#: benchmark variant -> (recipe of jaxlib_ext.optim.make_optimizer, hyperparameter overrides);
#: every variant uses b2 = 0.95 and no gradient clipping.
VARIANTS = {
    "adamw": ("adamw", {}),
    "foam": ("foam", {}),
    "smet": ("smet", {}),
    "smet_reset": ("smet", {"warmup_mode": "reset"}),
    "naive_dst": ("smet", {"warmup_mode": "none", "lr_density_power": 0.0}),
    "naive_dst_lr_d": ("smet", {"warmup_mode": "none"}),
}


def make_variant(name: str, lr, steps: int, update_every: int, seed: int):
    if name not in VARIANTS:
        raise ValueError(f"optimizer: unknown {name!r}; choose from {sorted(VARIANTS)}")
    recipe, hyperparams = VARIANTS[name]
    if recipe == "smet":
        hyperparams = dict(hyperparams, density=0.5, update_every=update_every,
                           optimizer_warmup_steps=min(100, update_every))
    return make_optimizer(recipe, lr, total_steps=steps, key=seed + 1, clip_norm=None,
                          b2=0.95, **hyperparams)


def train(name: str, *, steps=300, batch=8, seq_len=64, lr=3e-3, update_every=50, seed=0,
          corpus=None, n_eval=8, model="transformer"):
    """Returns a dict with per-step train loss, fixed-batch loss, final validation and test
    loss (``n_eval`` fixed batches from each half of the held-out split) and topology steps."""
    corpus = corpus or data_lib.load_corpus()
    build = {"transformer": build_transformer, "mdn": build_mdn}[model]
    model = build("tiny", vocab_size=corpus.vocab_size, rngs=nnx.Rngs(seed))
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 20), steps, lr * 0.1)
    tx = make_variant(name, sched, steps, update_every, seed)
    # the library's LM step: mean next-token cross-entropy in float32, state donated
    graphdef, rest, state = train_lib.init_state(model, tx, seed)
    mesh = sharding_lib.make_mesh("data=1", jax.devices()[:1])
    batch_sh = sharding_lib.batch_sharding(mesh)
    state_sh = train_lib.train_state_shardings(state, mesh)
    loss_fn = train_lib.make_loss_fn(graphdef, rest)
    step = train_lib.make_train_step(tx, loss_fn, state_sh, batch_sh)
    eval_fn = train_lib.make_eval_step(loss_fn, state_sh.params, batch_sh)
    # copies, so that no buffer is donated twice (an init may share one zeros array)
    state = jax.device_put(jax.tree.map(jnp.copy, state), state_sh)
    rng = np.random.default_rng(seed)
    n = corpus.train.shape[0] - seq_len - 1

    def windows(tokens, offsets):
        return jnp.asarray(np.stack([tokens[o:o + seq_len + 1] for o in offsets]), jnp.int32)

    fixed = windows(corpus.train, rng.integers(0, n, batch))
    half = corpus.eval.shape[0] // 2

    def held_out(tokens):
        off = np.linspace(0, tokens.shape[0] - seq_len - 2, n_eval * batch).astype(int)
        return [windows(tokens, off[i * batch:(i + 1) * batch]) for i in range(n_eval)]

    vals, tests = held_out(corpus.eval[:half]), held_out(corpus.eval[half:])
    losses, fixed_losses = [], [float(eval_fn(state.params, fixed))]
    t0 = time.perf_counter()
    for _ in range(steps):
        tokens = windows(corpus.train, rng.integers(0, n, batch))
        state, metrics = step(state, tokens)
        losses.append(float(metrics["loss"]))
        # the fixed batch after every update shows the loss around topology updates
        fixed_losses.append(float(eval_fn(state.params, fixed)))
    wall = time.perf_counter() - t0
    val_loss = float(np.mean([float(eval_fn(state.params, b)) for b in vals]))
    test_loss = float(np.mean([float(eval_fn(state.params, b)) for b in tests]))
    # topology updates run at the start of update number c + 1 for c = k * update_every,
    # i.e. they change the params reported in fixed_losses[c + 1] (fixed_losses[0] = init).
    topo = list(range(update_every, steps, update_every)) if name in _DST else []
    return dict(name=name, losses=losses, fixed_losses=fixed_losses, val_loss=val_loss,
                test_loss=test_loss, topo=topo, wall=wall)


def max_spike(fixed_losses, topo, window=10):
    """Largest loss jump within ``window`` steps after each topology update."""
    jumps = []
    for c in topo:
        before = fixed_losses[c]
        after = fixed_losses[c + 1:c + 1 + window]
        if after:
            jumps.append(max(after) - before)
    return max(jumps) if jumps else float("nan"), jumps


LABELS = {"adamw": "optax.adamw", "foam": "foam level=2",
          "smet": "smet d=0.5 (code warm-up)", "smet_reset": "smet d=0.5, warmup_mode=reset",
          "naive_dst": "naive DST d=0.5", "naive_dst_lr_d": "naive DST d=0.5, lr/d"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("transformer", "mdn"), default="transformer")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    comparison.add_arguments(ap, lrs="1e-3,3e-3,1e-2")
    ap.add_argument("--update-every", type=int, default=50)
    ap.add_argument("--optimizers", default="adamw,foam,smet,naive_dst",
                    help="comma list from adamw,foam," + ",".join(_DST) + " (first = baseline)")
    ap.add_argument("--fast", action="store_true",
                    help="smoke run: 30 steps, topology every 10, batch 4 x seq 32, "
                         "optimizers adamw,smet,naive_dst unless given")
    args = ap.parse_args(argv)
    if args.fast:
        args.steps, args.update_every, args.batch, args.seq_len = 30, 10, 4, 32
        if args.optimizers == ap.get_default("optimizers"):
            args.optimizers = "adamw,smet,naive_dst"
    unknown = sorted(set(args.optimizers.split(",")) - set(VARIANTS))
    if unknown:
        ap.error(f"--optimizers: unknown {unknown}; choose from {sorted(VARIANTS)}")
    corpus = data_lib.load_corpus()
    spec = comparison.Comparison(
        methods=tuple(args.optimizers.split(",")), lrs=args.lrs, seeds=tuple(range(args.seeds)),
        budget=f"{args.steps} steps, batch {args.batch}x{args.seq_len}, warmup 5% + cosine to "
               "0.1x of the peak lr",
    )
    print(f"jax {jax.__version__}, optax {optax.__version__}, {platform.processor() or 'cpu'}; "
          f"tiny {args.model}, {corpus.source}, byte tokens; {spec.describe()}", flush=True)

    def run(name: str, lr: float, seed: int) -> dict:
        r = train(name, steps=args.steps, batch=args.batch, seq_len=args.seq_len, lr=lr,
                  update_every=args.update_every, seed=seed, corpus=corpus, model=args.model)
        worst, jumps = max_spike(r["fixed_losses"], r["topo"])
        return dict(val=r["val_loss"], test=r["test_loss"],
                    train_loss=float(np.mean(r["losses"][-20:])), wall=r["wall"],
                    worst_jump=worst, later_jump=max(jumps[1:]) if len(jumps) > 1 else np.nan,
                    mean_jump=float(np.mean(jumps)) if jumps else np.nan)

    comparison.cache_compilations()
    result = comparison.run_comparison(spec, run)
    first = spec.methods[0]
    print(f"\nValidation loss over the whole grid ({len(spec.seeds)} seeds):\n")
    print(result.grid_table(labels=LABELS))
    print("\nTest loss at each optimizer's best learning rate:\n")
    print(result.summary_table(baseline=first, labels=LABELS, extras=(
        ("final train loss (mean last 20)", "train_loss", ".4f"), ("s", "wall", ".0f"))))
    print()
    for name in spec.methods[1:]:
        print(result.verdict(name, first))
    dst = [n for n in _DST if n in spec.methods]
    if dst:
        print(f"\n| d=0.5, topology every {args.update_every} | best lr | max jump in 10 steps "
              "after an update | max jump, updates 2+ | mean jump | max jump, every seed |")
        print("|---|---|---|---|---|---|")
        for name in dst:
            worst = result.at_best(name, "worst_jump")
            print(f"| {LABELS[name]} | {result.best_lr(name):g} | "
                  f"{comparison.format_pm(worst)} | "
                  f"{comparison.format_pm(result.at_best(name, 'later_jump'))} | "
                  f"{comparison.format_pm(result.at_best(name, 'mean_jump'))} | "
                  f"{comparison.format_each(worst, '.3f')} |")
    print(f"\n{len(spec.methods) * len(spec.lrs) * len(spec.seeds)} runs, "
          f"{result.total_seconds():.0f} s")
    return result


if __name__ == "__main__":
    main()
