"""MQAR recall: MDN vs GDN vs Transformer under the comparison rule, with two ablations.

Multi-query associative recall (``jaxlib_ext.models.mqar.mqar_batch``: 12 pairs, 12 queries,
32 keys, sequences of 48 tokens) as in ``notebooks/models_mdn.py``: 2 blocks at d = 64, 2 heads
of 16, AdamW with a constant learning rate and no weight decay, batches of 64 sequences drawn fresh
every step. Every model gets the same learning-rate grid (``--lrs``) and seeds (``--seeds``; a
seed sets the init and the data stream), each model's rate is picked by the validation recall
accuracy, and the test accuracy is reported there (``benchmarks/_comparison.py``). Validation and
test are fixed sets of MQAR batches drawn from keys no training step uses.

The GDN and Transformer feed-forward widths are chosen so that their parameter counts match
MDN's (printed). Two ablations test why GDN can stall on the MQAR plateau:

* ``GDN sigmoid-gate``: GDN's output gate ``SiLU(W_g x)`` (arXiv 2412.06464) starts nearly
  closed at this width (``SiLU(z) ~ z / 2`` for small ``z``); the ablation uses MDN's
  ``sigmoid(W_g x)``, which starts half open;
* ``MDN eps=1e-12``, ``GDN eps=1e-12``: at initialisation the mixer's output before the head
  RMSNorm is so small that the norm's ``eps = 1e-6`` dominates it and the normalised output
  stays far below unit scale; the ablation sets every RMSNorm's ``eps`` to 1e-12.

Reported besides the accuracies: the plateau-escape step, the first training step at which the
moving average of the training recall accuracy over ``--window`` steps reaches ``--escape``
(the budget when it never does; the fraction of seeds that escaped is beside it).

Usage::

    python -m benchmarks.models_mdn_mqar              # 600 steps, 3 lrs x 3 seeds, 6 models
    python -m benchmarks.models_mdn_mqar --models MDN,GDN,Transformer
    python -m benchmarks.models_mdn_mqar --fast       # smoke run
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks import _comparison as comparison
from jaxlib_ext.core import sharding as sharding_lib
from jaxlib_ext.core import train as train_lib
from jaxlib_ext.models import build_gdn, build_mdn, build_transformer, param_count
from jaxlib_ext.models.gdn import GatedDeltaNet
from jaxlib_ext.models.mqar import mqar_batch, mqar_length

N_KEYS = 32
#: at these lengths the step-by-step recurrence ("reference") is the cheaper path on CPU
METHOD = "reference"
#: every model: 2 blocks at d = 64 with 2 heads of 16 (the notebook's full-mode size)
SIZE = dict(d_model=64, n_layers=2, n_heads=2, head_dim=16)
#: one optimizer object for every run, its learning rate a state entry, so that the runs of a
#: model share one compiled step
ADAMW = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3, weight_decay=0.0)
MODELS = ("MDN", "GDN", "Transformer", "GDN sigmoid-gate", "MDN eps=1e-12", "GDN eps=1e-12")


def _builders(seq_len: int):
    """name -> build(seed) for every model of :data:`MODELS`, parameters matched to MDN's."""
    delta = dict(SIZE, mlp_multiple_of=32, max_seq_len=seq_len, method=METHOD)

    def mdn(seed, hidden=None, **kw):
        return build_mdn("tiny", vocab_size=2 * N_KEYS, rngs=nnx.Rngs(seed),
                         **delta, mlp_hidden=hidden, **kw)

    def gdn(seed, hidden=None, **kw):
        return build_gdn("tiny", vocab_size=2 * N_KEYS, rngs=nnx.Rngs(seed),
                         **delta, mlp_hidden=hidden, **kw)

    def transformer(seed, hidden=None):
        return build_transformer("tiny", vocab_size=2 * N_KEYS, rngs=nnx.Rngs(seed),
                                 **SIZE, max_seq_len=seq_len, mlp_hidden=hidden)

    def count(build, hidden):
        return param_count(nnx.eval_shape(lambda: build(0, hidden)))

    target = count(mdn, None)

    def matched(build):  # the count is affine in the feed-forward width: solve, round to 8
        c64, c128 = count(build, 64), count(build, 128)
        h = 64 + (target - c64) * 64 / (c128 - c64)
        low = 8 * int(h // 8)
        return min((low, low + 8), key=lambda w: abs(count(build, w) - target))

    h_gdn, h_tf = matched(gdn), matched(transformer)

    def sigmoid_gate(model):
        for _, node in nnx.iter_graph(model):
            if isinstance(node, GatedDeltaNet):
                node.gate_activation = jax.nn.sigmoid
        return model

    return {
        "MDN": lambda s: mdn(s),
        "GDN": lambda s: gdn(s, h_gdn),
        "Transformer": lambda s: transformer(s, h_tf),
        "GDN sigmoid-gate": lambda s: sigmoid_gate(gdn(s, h_gdn)),
        "MDN eps=1e-12": lambda s: mdn(s, norm_eps=1e-12),
        "GDN eps=1e-12": lambda s: gdn(s, h_gdn, norm_eps=1e-12),
    }, target


def mqar_loss_fn(graphdef, rest):
    """``loss(params, (tokens, mask)) -> (loss, ({"accuracy": acc}, None))``: cross-entropy and
    recall accuracy on the answer positions only (``mask``), in the form that
    ``jaxlib_ext.core.train.make_train_step`` takes (metrics, no model state)."""

    def loss_fn(params, batch):
        tokens, mask = batch
        logits = nnx.merge(graphdef, params, rest)(tokens[:, :-1]).astype(jnp.float32)
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
        hit = logits.argmax(-1) == tokens[:, 1:]
        return (nll * mask).sum() / mask.sum(), ({"accuracy": (hit * mask).sum() / mask.sum()},
                                                 None)

    return loss_fn


def escape_step(accs: np.ndarray, threshold: float, window: int) -> int | None:
    """First step whose trailing ``window``-step mean training accuracy reaches ``threshold``
    (the step index of the window's last entry), or ``None``."""
    if len(accs) < window:
        return None
    smooth = np.convolve(accs, np.ones(window) / window, mode="valid")
    hits = np.flatnonzero(smooth >= threshold)
    return int(hits[0]) + window - 1 if hits.size else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=12)
    comparison.add_arguments(ap, lrs="1e-3,3e-3,1e-2")
    ap.add_argument("--models", default=",".join(MODELS), help=f"subset of {MODELS}")
    ap.add_argument("--eval-batches", type=int, default=4,
                    help="batches of --batch sequences in each of the validation and test sets")
    ap.add_argument("--escape", type=float, default=0.5,
                    help="training accuracy that counts as off the plateau")
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--records", default=None,
                    help="JSON-lines file of finished runs: runs found there (same model, lr, "
                         "seed and budget) are not run again, new ones are appended, so a grid "
                         "can be widened or a model added without redoing the rest")
    ap.add_argument("--fast", action="store_true", help="smoke run: 20 steps, batch 8, 4 pairs")
    args = ap.parse_args(argv)
    if args.fast:
        args.steps, args.batch, args.pairs, args.eval_batches, args.window = 20, 8, 4, 1, 5
    names = tuple(m.strip() for m in args.models.split(",") if m.strip())
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        ap.error(f"--models: unknown {unknown}; choose from {MODELS}")

    seq_len = mqar_length(args.pairs, args.pairs)
    builders, target = _builders(seq_len)

    def batch(key):
        return mqar_batch(key, batch=args.batch, n_keys=N_KEYS, n_pairs=args.pairs)

    val_sets = [batch(jax.random.key(10**6 + i)) for i in range(args.eval_batches)]
    test_sets = [batch(jax.random.key(2 * 10**6 + i)) for i in range(args.eval_batches)]
    spec = comparison.Comparison(
        methods=names, lrs=args.lrs, seeds=tuple(range(args.seeds)),
        budget=f"{args.steps} steps x batch {args.batch}, MQAR {args.pairs} pairs / "
               f"{args.pairs} queries / {N_KEYS} keys (length {seq_len}), AdamW constant lr",
    )

    budget = dict(steps=args.steps, batch=args.batch, pairs=args.pairs,
                  eval_batches=args.eval_batches, escape=args.escape, window=args.window)
    records = pathlib.Path(args.records) if args.records else None
    done = {}
    if records is not None and records.exists():
        for line in records.read_text().splitlines():
            rec = json.loads(line)
            if rec["budget"] == budget:
                done[rec["model"], rec["lr"], rec["seed"]] = rec["result"]

    def run(name: str, lr: float, seed: int) -> dict:
        if (name, lr, seed) in done:
            return done[name, lr, seed]
        result = train_and_evaluate(name, lr, seed)
        if records is not None:
            with records.open("a") as f:
                f.write(json.dumps(dict(model=name, lr=lr, seed=seed, budget=budget,
                                        result=result)) + "\n")
        return result

    mesh = sharding_lib.make_mesh("data=1", jax.devices()[:1])
    batch_sh = sharding_lib.batch_sharding(mesh)
    compiled = {}  # model name -> (state sharding, train step, eval step)

    def train_and_evaluate(name: str, lr: float, seed: int) -> dict:
        model = builders[name](seed)
        graphdef, rest, state = train_lib.init_state(model, ADAMW, seed)
        hyper = state.opt_state.hyperparams
        hyper["learning_rate"] = jnp.asarray(lr, hyper["learning_rate"].dtype)
        if name not in compiled:
            # these models hold everything in nnx.Param (``rest`` is empty), so the first
            # seed's graph serves every run of the model: one compiled step per model
            state_sh = train_lib.train_state_shardings(state, mesh)
            loss_fn = mqar_loss_fn(graphdef, rest)
            compiled[name] = (state_sh,
                              train_lib.make_train_step(ADAMW, loss_fn, state_sh, batch_sh),
                              train_lib.make_eval_step(loss_fn, state_sh.params, batch_sh))
        state_sh, step, evaluate = compiled[name]
        # the step donates the state: copies, so that no buffer is donated twice
        state = jax.device_put(jax.tree.map(jnp.copy, state), state_sh)
        accs = np.empty(args.steps)
        for i in range(args.steps):
            state, metrics = step(state, batch(jax.random.fold_in(jax.random.key(seed + 1), i)))
            accs[i] = float(metrics["accuracy"])

        def mean_acc(sets):
            return float(np.mean([float(evaluate(state.params, b)[1][0]["accuracy"])
                                  for b in sets]))

        esc = escape_step(accs, args.escape, args.window)
        return dict(val=mean_acc(val_sets), test=mean_acc(test_sets),
                    escape=args.steps if esc is None else esc, escaped=float(esc is not None),
                    final_train=float(accs[-args.window:].mean()),
                    params=param_count(model))

    print(f"{spec.describe()}; {platform.processor() or platform.machine()}, "
          f"jax {jax.__version__}; chance accuracy {1 / N_KEYS:.3f}; parameters matched to "
          f"{target:,} (MDN); escape = first step with the {args.window}-step mean training "
          f"accuracy >= {args.escape}", flush=True)
    comparison.cache_compilations()
    result = comparison.run_comparison(spec, run, higher_is_better=True,
                                       metric="recall accuracy")
    print(f"\nValidation recall accuracy over the whole grid ({len(spec.seeds)} seeds):\n")
    print(result.grid_table(fmt=".3f"))
    print("\nTest recall accuracy at each model's best learning rate:\n")
    print(result.summary_table(baseline=names[0], fmt=".3f", extras=(
        ("escape step (mean)", "escape", ".0f"), ("escaped", "escaped", ".2f"),
        ("params", "params", ",.0f"))))
    print("\nPlateau-escape step over the whole grid (every seed; the budget = never):\n")
    print("| model | lr | escape step, every seed | escaped |\n|---|---|---|---|")
    for m in names:
        for lr in spec.lrs:
            steps = result.values(m, lr, "escape").astype(int)
            print(f"| {m} | {lr:g} | {', '.join(map(str, steps))} | "
                  f"{int(result.values(m, lr, 'escaped').sum())}/{len(spec.seeds)} |")
    print()
    for a, b in (("MDN", "GDN"), ("MDN", "Transformer"), ("GDN", "Transformer"),
                 ("GDN sigmoid-gate", "GDN"), ("GDN eps=1e-12", "GDN"),
                 ("MDN eps=1e-12", "MDN")):
        if a in names and b in names:
            print(result.verdict(a, b, fmt=".3f"))
    print(f"\n{len(result.records)} runs, {result.total_seconds():.0f} s")


if __name__ == "__main__":
    main()
