"""LatentMoE vs a standard MoE per FLOP and per parameter, and orthogonal growth vs scratch.

Two comparisons on the embedded corpus (byte tokens, :func:`jaxlib_ext.core.data.load_corpus`), tiny
attention LMs trained through :func:`jaxlib_ext.core.train.fit` (AdamW, the CLI's warm-up/cosine
schedule), both under the rule of ``benchmarks/_comparison.py`` (the same lr grid ``--lrs`` and
seeds ``--seeds`` for every method, the lr picked by validation loss, test loss reported there,
the whole grid printed; validation and test are the two halves of the held-out split):

1. **Quality per FLOP and per parameter** (arXiv 2601.18089's claim: LatentMoE ahead of the
   standard MoE at matched active FLOPs and at matched total parameters). The baseline is a
   standard MoE (``E`` experts, top-``K``, expert width ``m`` at model width ``d``). LatentMoE
   runs its experts at ``l = d / 4`` and reinvests the saving in ``4 E`` experts and top-``4 K``
   (the paper's rule); its expert width is set so that either the forward FLOPs per token of the
   FFN (``"LatentMoE (FLOPs)"``) or its total parameters (``"LatentMoE (params)"``) equal the
   baseline's (:mod:`jaxlib_ext.models.accounting`). Same steps and batches for all.
2. **Growth** (arXiv 2510.08008's claim: growing a trained MoE beats training the large shape
   from scratch with the same additional compute). A parent (the small MoE) is trained
   ``--parent-steps`` steps per seed at ``--parent-lr``; it is grown by interposition (2x
   depth) and expert duplication (2x experts, top-k doubled, noise 0.01 x the weights' std),
   and trained ``--steps`` more with a fresh optimizer; the large shape is trained ``--steps``
   from scratch. The parent's steps are the sunk cost that the claim counts as free.

    python -m benchmarks.models_latent_moe                 # 100 steps, seq 64, batch 16, 3x3
    python -m benchmarks.models_latent_moe --only quality --steps 300
    python -m benchmarks.models_latent_moe --fast          # smoke run
"""

from __future__ import annotations

import argparse
import platform
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import _comparison as comparison
from jaxlib_ext.core import data, sharding, train
from jaxlib_ext.models import LMConfig, build_lm
from jaxlib_ext.models.accounting import lm_cost, moe_cost
from jaxlib_ext.models.growth import grow_model
from jaxlib_ext.optim import build_optimizer


def _ffn(cfg: LMConfig):
    parts = moe_cost(cfg.d_model, num_experts=cfg.num_experts, top_k=cfg.top_k,
                     expert_dim=cfg.expert_dim,
                     latent_dim=cfg.latent_dim if cfg.ffn_name == "latent_moe" else None,
                     shared_expert_dim=cfg.shared_expert_dim)
    return sum(c.flops for c in parts.values()), sum(c.params for c in parts.values())


def quality_configs(base: LMConfig) -> dict[str, LMConfig]:
    """The baseline MoE and the two LatentMoE variants matched to it (module docstring)."""
    flops, params = _ffn(base)
    ell = base.d_model // 4
    latent = LMConfig.from_flat(base.mixer_name, "latent_moe", **{
        **base.flat(), "latent_dim": ell, "num_experts": 4 * base.num_experts,
        "top_k": 4 * base.top_k})
    out = {"MoE": base}
    for name, target, index in (("LatentMoE (FLOPs)", flops, 0), ("LatentMoE (params)", params, 1)):
        m = min(range(8, 8 * base.expert_dim + 1, 4),
                key=lambda w: abs(_ffn(latent.replace(expert_dim=w))[index] - target))
        out[name] = latent.replace(expert_dim=m)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--parent-steps", type=int, default=100)
    ap.add_argument("--parent-lr", type=float, default=3e-3)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--only", choices=("quality", "growth"), default=None)
    comparison.add_arguments(ap, lrs="1e-3,3e-3,1e-2")
    ap.add_argument("--eval-batches", type=int, default=4,
                    help="batches of each of the validation and test splits")
    ap.add_argument("--fast", action="store_true",
                    help="smoke run: 6 steps, batch 4 x seq 32, 1 eval batch")
    args = ap.parse_args(argv)
    if args.fast:
        args.steps, args.parent_steps, args.batch_size, args.seq_len = 6, 6, 4, 32
        args.eval_batches = 1

    corpus, test_batches = comparison.validation_and_test(
        data.load_corpus(None), args.batch_size, args.seq_len, args.eval_batches)
    mesh = sharding.make_mesh(None, devices=jax.devices()[:1])
    base = LMConfig.from_flat("attention", "moe", vocab_size=corpus.vocab_size, d_model=128,
                              n_layers=2, n_heads=4, head_dim=32, max_seq_len=args.seq_len,
                              num_experts=8, top_k=2, expert_dim=128)
    budget = (f"{args.steps} steps x batch {args.batch_size} x seq {args.seq_len} byte tokens, "
              "AdamW (warm-up + cosine), clip 1.0")
    h = data.unigram_entropy(corpus.train, corpus.vocab_size)
    print(f"{platform.processor() or platform.machine()}, jax {jax.__version__}; unigram "
          f"entropy {h:.3f} nats", flush=True)
    comparison.cache_compilations()
    test_loss = {}

    def fit(model, lr, seed, steps):
        """``(val, test, result)`` of training ``model`` ``steps`` steps (NaN if diverged)."""
        graphdef, _, state, rest = nnx.split(model, nnx.Param, nnx.BatchStat, ...)
        key = repr(model.cfg)  # one compiled test loss per model shape
        if key not in test_loss:
            test_loss[key] = jax.jit(
                lambda p, s, r, b, g=graphdef: train.make_loss_fn(g, r)(p, b, s))
        tx = build_optimizer("adamw", lr, steps=steps, key=seed)
        with tempfile.TemporaryDirectory() as out:
            cfg = train.TrainConfig(
                steps=steps, batch_size=args.batch_size, seq_len=args.seq_len, seed=seed,
                eval_every=steps, eval_batches=args.eval_batches, log_every=max(1, steps // 10),
                checkpoint_every=10 * steps, out_dir=out, progress=False,
            )
            try:
                result = train.fit(model, tx, corpus, cfg, mesh)
            except train.NonFiniteLossError:  # diverged: the worst choice of lr, not a crash
                return np.nan, np.nan, None
        s = result.state
        test = float(np.mean([float(test_loss[key](s.params, s.model_state, rest, b))
                              for b in test_batches]))
        return result.eval_losses[-1][1], test, result

    def record(cfg, val, test, extra=None):
        acc = lm_cost(cfg, seq_len=args.seq_len)
        return dict(val=val, test=test, params=acc.params, active=acc.active_params,
                    mflops=acc.flops_per_token / 1e6, **(extra or {}))

    if args.only in (None, "quality"):
        configs = quality_configs(base)
        print("\n## Quality per FLOP and per parameter\n")
        for name, cfg in configs.items():
            flops, params = _ffn(cfg)
            print(f"- {name}: E={cfg.num_experts}, top-{cfg.top_k}, expert width "
                  f"{cfg.expert_dim}, latent {cfg.latent_dim}; FFN {params:,} params/layer, "
                  f"{flops / 1e3:.1f} kFLOPs/token/layer; model {lm_cost(cfg).summary()}")
        spec = comparison.Comparison(methods=tuple(configs), lrs=args.lrs,
                                     seeds=tuple(range(args.seeds)), budget=budget)
        print(spec.describe(), flush=True)

        def run(name, lr, seed):
            cfg = configs[name]
            val, test, _ = fit(build_lm(cfg, rngs=nnx.Rngs(seed)), lr, seed, args.steps)
            return record(cfg, val, test)

        result = comparison.run_comparison(spec, run)
        print(f"\nValidation loss (nats/token) over the whole grid ({len(spec.seeds)} seeds):\n")
        print(result.grid_table())
        print("\nTest loss (nats/token) at each model's best learning rate, with its size and "
              "forward FLOPs per token (whole model):\n")
        print(result.summary_table(baseline="MoE", extras=(
            ("params", "params", ",.0f"), ("active params", "active", ",.0f"),
            ("MFLOPs/token", "mflops", ".3f"))))
        print()
        for name in list(configs)[1:]:
            print(result.verdict(name, "MoE"))
        print(f"\n{len(spec.methods) * len(spec.lrs) * len(spec.seeds)} runs, "
              f"{result.total_seconds():.0f} s", flush=True)

    if args.only in (None, "growth"):
        large = base.replace(n_layers=2 * base.n_layers, num_experts=2 * base.num_experts,
                             top_k=2 * base.top_k)
        print("\n## Growth: a grown MoE vs the large shape from scratch\n")
        print(f"- parent: {lm_cost(base).summary()}, {args.parent_steps} steps at lr "
              f"{args.parent_lr:g} per seed (sunk cost)")
        print(f"- large shape (grown and scratch): {lm_cost(large).summary()}")
        parents = {}
        for seed in range(args.seeds):
            model = build_lm(base, rngs=nnx.Rngs(seed))
            val, _, result = fit(model, args.parent_lr, seed, args.parent_steps)
            nnx.update(model, result.state.params, result.state.model_state)
            parents[seed] = model
            print(f"parent seed {seed}: val {val:.4f}", flush=True)
        spec = comparison.Comparison(methods=("grown", "scratch"), lrs=args.lrs,
                                     seeds=tuple(range(args.seeds)), budget=budget)
        print(spec.describe(), flush=True)

        def run_growth(name, lr, seed):
            if name == "grown":
                model = grow_model(parents[seed], noise_scale=0.01, key=jax.random.key(seed))
                # own buffers: fit donates its state, and unchanged leaves alias the parent's
                nnx.update(model, jax.tree.map(jnp.copy, nnx.state(model)))
            else:
                model = build_lm(large, rngs=nnx.Rngs(seed))
            val, test, _ = fit(model, lr, seed + 100, args.steps)
            return record(large, val, test)

        result = comparison.run_comparison(spec, run_growth)
        print(f"\nValidation loss (nats/token) over the whole grid ({len(spec.seeds)} seeds):\n")
        print(result.grid_table())
        print(f"\nTest loss (nats/token) at each side's best learning rate after {args.steps} "
              "more steps:\n")
        print(result.summary_table(baseline="scratch", extras=(
            ("params", "params", ",.0f"), ("MFLOPs/token", "mflops", ".3f"))))
        print()
        print(result.verdict("grown", "scratch"))
        print(f"\n{len(spec.methods) * len(spec.lrs) * len(spec.seeds)} runs, "
              f"{result.total_seconds():.0f} s", flush=True)


if __name__ == "__main__":
    main()
