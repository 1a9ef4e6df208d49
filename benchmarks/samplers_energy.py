"""Normalized energy prior (arXiv 2605.15487) on MNIST: PC, PC-MALA, the adaptive schedules and
DPS at equal network budgets; blind estimation of the degradation; MH bias reduction.

The energy U-Net is trained by ``python -m jaxlib_ext energy`` (checkpoint folder
``--ckpt``); the loss-weight ablation trains one prior per ``--cov-reduction`` (``authors``,
the default, and ``mean``, ours) and runs this script on each. Held-out digits
(``load_mnist("test")``): the first ``--val`` are the validation set, the next ``--test`` the
test set; one measurement per digit and task (noise 0.02).

Samplers: ``PC`` and ``PC-MALA`` in the authors' form (predictor first, scaled levels (V.1a));
``adaptive`` the authors' per-entry schedule (``adaptive.sample_per_entry``, 3 inner moves per
update); ``DPS``; and our variants ``PC/ours``, ``PC-MALA/ours`` (corrector first, clipped
levels (V.1)) and ``adaptive/ours`` (the per-level schedule, ``adaptive.sample``).

The comparison rule (``benchmarks/_comparison.py``): each sampler's one hyper-parameter is its
base value (PC and PC-MALA: the corrector's ``snr`` 0.45; adaptive: the authors' ``step_cov``
1.5e-2; adaptive/ours: ``eta`` 1; DPS: ``zeta`` 3) times the same multiplier grid {1/3, 1, 3};
``--seeds`` seeds (the samplers' PRNG key); the multiplier picked per task by the mean
validation PSNR over seeds; test metrics reported there, mean +- std over seeds. Every sampler
gets at most the same number of network gradients per chain (``--nfe``, a comma list of
budgets, each run in turn; one DPS step = one gradient plus one vector-Hessian product, so DPS
does about twice the work; the gradients column says what each used). The posterior mean is
the average of ``--chains`` chains' final Tweedie estimates, clipped to [0, 1]; PSNR and SSIM
(:mod:`jaxlib_ext.samplers.inverse.quality`) against the truth.

Blind estimation: for a grid of true (box size, noise) and (blur width, noise) pairs, the
argmax of the grid posterior (B.1) from one network evaluation per candidate.

MH bias: a Gaussian prior fitted to scikit-learn's 8x8 digits (closed-form ``U*``, exact
posterior), box inpainting; PC vs PC-MALA at equal gradients: error of the posterior mean and
standard deviation over 1024 chains, in posterior standard deviations.

    python -m benchmarks.samplers_energy --ckpt runs/energy
    python -m benchmarks.samplers_energy --ckpt runs/energy --fast   # smoke run
    # extend the grids of the samplers whose best multiplier is on the upper edge
    python -m benchmarks.samplers_energy --ckpt runs/energy --only-reconstruction \
        --samplers adaptive,DPS --multipliers 3,9,27
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._comparison import Comparison, cache_compilations, run_comparison
from jaxlib_ext.core import images
from jaxlib_ext.samplers import energy as en
from jaxlib_ext.samplers import inverse
from jaxlib_ext.samplers.energy import adaptive, blind, dps, pc
from jaxlib_ext.samplers.energy.train import load
from jaxlib_ext.samplers.inverse import psnr, ssim

NOISE = 0.02
SAMPLERS = ("PC", "PC-MALA", "adaptive", "DPS", "PC/ours", "PC-MALA/ours", "adaptive/ours")
HP = {"PC": "snr", "PC-MALA": "snr", "adaptive": "step_cov", "DPS": "zeta", "PC/ours": "snr",
      "PC-MALA/ours": "snr", "adaptive/ours": "eta"}
#: each sampler's hyper-parameter is its base value times a multiplier of one shared grid
BASE = {"PC": 0.45, "PC-MALA": 0.45, "adaptive": 1.5e-2, "DPS": 3.0, "PC/ours": 0.45,
        "PC-MALA/ours": 0.45, "adaptive/ours": 1.0}
#: the authors' per-entry schedule: network gradients per update = 1 + inner moves
PER_ENTRY_INNER = 3


def parse_fraction(text):
    """``"1/3"`` -> 0.333..., ``"9"`` -> 9.0."""
    num, _, den = text.partition("/")
    return float(num) / float(den or 1)


def tasks(shape):
    # both masks as plain ``inpainting`` operators: one compiled program serves both tasks
    return {
        "box inpainting (12x12)": inverse.inpainting(inverse.box_inpainting(shape, 12).diagonal),
        "random inpainting (70%)": inverse.inpainting(
            inverse.random_inpainting(jax.random.key(7), shape, 0.7).diagonal),
        "Gaussian deblur (sigma 1.5)": inverse.gaussian_blur(shape, 1.5),
    }


def make_runner(u, name, nfe, chains):
    """A jitted ``(y, key, hp, op) -> posterior mean`` with the hyper-parameter and the
    operator's diagonal traced."""

    def run(y, key, hp, op):
        prob = pc.repeat(en.from_operator(y, op, NOISE), chains)
        if name.startswith("PC"):
            ours = name.endswith("/ours")
            mala = name.startswith("PC-MALA")
            r = pc.sample(key, u, prob, num_levels=nfe // 2 if ours else (nfe - 1) // 2,
                          corrector_steps=1, snr=hp, sigma_end=0.01, metropolis=mala,
                          order="corrector_first" if ours else "predictor_first",
                          levels="clipped" if ours else "scaled")
            acc = r.info.acceptance_rate[1:].mean() if mala else jnp.nan
        elif name == "adaptive":
            r = adaptive.sample_per_entry(key, u, prob,
                                          num_updates=max(1, nfe // (1 + PER_ENTRY_INNER)),
                                          inner_steps=PER_ENTRY_INNER, step_cov=hp)
            acc = jnp.nan
        elif name == "adaptive/ours":
            r = adaptive.sample(key, u, prob, num_steps=nfe, sigma_end=0.01, eta=hp)
            acc = jnp.nan
        else:
            r = dps.sample(key, u, op.apply, jnp.repeat(y, chains, 0), image_shape=op.shape_in,
                           num_steps=nfe, sigma_max=prob.sigma_max, sigma_end=0.01, zeta=hp)
            acc = jnp.nan
        den = r.denoised.reshape(y.shape[0], chains, *y.shape[1:])
        return jnp.clip(den.mean(1), 0.0, 1.0), acc, r.nfe

    return jax.jit(run)


def bench_reconstruction(u, args, digits, nfe):
    """Per task, the comparison of the samplers under the rule (module docstring) at ``nfe``
    network gradients per chain; returns ``{task: ComparisonResult}``."""
    shape, n_val = digits.shape[1:], args.val
    x = jnp.asarray(digits)
    runners = {s: make_runner(u, s, nfe, args.chains) for s in args.samplers}
    spec = Comparison(methods=args.samplers, lrs=args.multipliers,
                      seeds=tuple(range(args.seeds)),
                      budget=f"{nfe} network gradients per chain, {args.chains} chains "
                             f"per digit")
    out = {}
    for tname, op in tasks(shape).items():
        if not tname.startswith(args.tasks):
            continue
        y = inverse.measure(jax.random.key(1), op, x, NOISE)

        def run(s, mult, seed, y=y, op=op):
            xm, acc, nfe = runners[s](y, jax.random.key(1000 + seed), BASE[s] * mult, op)
            p, q = np.asarray(psnr(xm, x)), np.asarray(ssim(xm, x))
            return {"val": float(p[:n_val].mean()), "test": float(p[n_val:].mean()),
                    "ssim": float(q[n_val:].mean()), "acceptance": float(acc),
                    "gradients": int(nfe)}

        print(f"\n## {tname}, {nfe} gradients (the lr column: the multiplier of the "
              f"sampler's base hyper-parameter)\n", flush=True)
        res = run_comparison(spec, run, higher_is_better=True, metric="PSNR",
                             log=lambda line: None)
        print(res.grid_table(fmt=".2f"))
        print(res.summary_table(baseline="DPS" if "DPS" in spec.methods else None, fmt=".2f",
                                extras=(("test SSIM", "ssim", ".3f"),
                                        ("MH acceptance", "acceptance", ".2f"),
                                        ("gradients", "gradients", ".0f"))))
        if "DPS" in spec.methods:
            for s in spec.methods:
                if s != "DPS":
                    print(res.verdict(s, "DPS", fmt=".2f"))
        for s in spec.methods:
            if s.endswith("/ours") and s[:-len("/ours")] in spec.methods:
                print(res.verdict(s[:-len("/ours")], s, fmt=".2f"))
        out[tname] = res
    return out


def bench_blind(u, args, digits):
    shape = digits.shape[1:]
    out = {}
    noises = jnp.array([0.01, 0.03, 0.1])
    setups = {
        "box size x noise": ((6, 10, 14), lambda v: inverse.box_inpainting(shape, v), "pixel",
                             lambda o: o.diagonal),
        "blur width x noise": ((0.8, 1.4, 2.0), lambda v: inverse.gaussian_blur(shape, v),
                               "fourier", lambda o: o.diagonal[..., None]),
    }
    x = jnp.asarray(digits)
    for name, (values, make, basis, diag) in setups.items():
        ops = jnp.stack([diag(make(v)) for v in values])
        hit_op = hit_noise = hit_both = total = 0
        t0 = time.perf_counter()
        confusion = np.zeros((len(values), len(values)), int)
        for i, v in enumerate(values):
            for j, sn in enumerate(noises):
                y = inverse.measure(jax.random.key(100 + 10 * i + j), make(v), x, float(sn))
                r = blind.blind_posterior(u, y, ops, noises, basis=basis)
                oi, ni = np.asarray(r.operator_index), np.asarray(r.noise_index)
                hit_op += int((oi == i).sum())
                hit_noise += int((ni == j).sum())
                hit_both += int(((oi == i) & (ni == j)).sum())
                total += len(oi)
                for k in oi:
                    confusion[i, k] += 1
        out[name] = (values, hit_op / total, hit_noise / total, hit_both / total, total,
                     confusion, time.perf_counter() - t0)
        print(f"  blind {name}: operator {hit_op / total:.2f}, noise {hit_noise / total:.2f}, "
              f"both {hit_both / total:.2f} over {total}", flush=True)
    return out


def bench_mh_bias(args):
    data = images.load_digits8().images
    d = 64
    flat = data.reshape(len(data), d)
    mu = flat.mean(0)
    c = np.cov(flat.T) + 1e-3 * np.eye(d)
    u = en.gaussian_energy(jnp.asarray(mu.reshape(8, 8, 1), jnp.float32),
                           jnp.asarray(c, jnp.float32))
    op = inverse.box_inpainting((8, 8, 1), 4)
    sn = 0.05
    x = jnp.asarray(data[-1:])
    y = inverse.measure(jax.random.key(0), op, x, sn)
    a = np.asarray(op.diagonal).reshape(-1)
    prec = np.linalg.inv(c) + np.diag(a ** 2) / sn ** 2
    post = np.linalg.inv(prec)
    m = post @ (np.linalg.solve(c, mu) + a * np.asarray(y).reshape(-1) / sn ** 2)
    sd = np.sqrt(np.diag(post))
    free = a == 0
    prob = pc.repeat(en.from_operator(y, op, sn), args.mh_chains)
    rows = []
    for nfe in (20, 80):
        for met in (False, True):
            run = jax.jit(lambda p, k, snr, met=met, nfe=nfe: pc.sample(
                k, u, p, num_levels=nfe // 2, corrector_steps=1, snr=snr, sigma_end=0.01,
                metropolis=met))
            for snr in (0.15, 0.45):
                r = run(prob, jax.random.key(1), snr)
                s = np.asarray(r.last).reshape(args.mh_chains, -1)
                sd_t = np.sqrt(sd ** 2 + 0.01 ** 2)  # samples at sigma_end carry its noise
                e_mean = np.sqrt(np.mean(((s.mean(0) - m) / sd)[free] ** 2))
                e_std = np.sqrt(np.mean((s.std(0) / sd_t - 1)[free] ** 2))
                acc = float(r.info.acceptance_rate[1:].mean()) if met else float("nan")
                rows.append((int(r.nfe), snr, "PC-MALA" if met else "PC", e_mean, e_std, acc))
    return rows


def bench_blind_and_mh(u, args, tst):
    print("\nBlind estimation (argmax of the grid posterior; noise grid 0.01, 0.03, 0.1):\n")
    bl = bench_blind(u, args, tst)
    print("\n| grid | true values | operator accuracy | noise accuracy | both | measurements |"
          " s |\n|---|---|---|---|---|---|---|")
    for name, (values, ao, an, ab, total, _conf, sec) in bl.items():
        print(f"| {name} | {', '.join(map(str, values))} | {ao:.2f} | {an:.2f} | {ab:.2f} | "
              f"{total} | {sec:.0f} |")
    for name, (*_, conf, _sec) in bl.items():
        print(f"\n{name} confusion (rows true, columns estimated): {conf.tolist()}")
    print("\nMH bias (Gaussian prior fitted to 8x8 digits, 4x4 box, noise 0.05, "
          f"{args.mh_chains} chains; errors in posterior standard deviations, missing pixels):\n")
    print("| gradients | snr | sampler | mean error | std error | acceptance |\n"
          "|---|---|---|---|---|---|")
    for nfe, snr, s, em, es, acc in bench_mh_bias(args):
        accs = f"{acc:.2f}" if np.isfinite(acc) else "-"
        print(f"| {nfe} | {snr} | {s} | {em:.3f} | {es:.3f} | {accs} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--val", type=int, default=8, help="validation digits")
    ap.add_argument("--test", type=int, default=16, help="test digits")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--chains", type=int, default=2)
    ap.add_argument("--nfe", default="30,100,300",
                    help="comma list of network-gradient budgets per chain, run in turn")
    ap.add_argument("--mh-chains", type=int, default=1024)
    ap.add_argument("--fast", action="store_true")
    ap.add_argument("--only-reconstruction", action="store_true",
                    help="skip the blind-estimation and MH-bias parts")
    ap.add_argument("--samplers", default=",".join(SAMPLERS),
                    help="comma-separated subset of " + ", ".join(SAMPLERS))
    ap.add_argument("--multipliers", default="1/3,1,3",
                    help="comma list, the shared multiplier grid (extend one whose best is on "
                         "an edge, e.g. --multipliers 3,9,27)")
    ap.add_argument("--tasks", default="box,random,Gaussian",
                    help="comma list of task-name prefixes (box, random, Gaussian)")
    args = ap.parse_args()
    args.tasks = tuple(t for t in args.tasks.split(",") if t)
    try:
        args.multipliers = tuple(parse_fraction(m) for m in args.multipliers.split(","))
    except (ValueError, ZeroDivisionError):
        ap.error(f"--multipliers: not a comma list of numbers: {args.multipliers!r}")
    args.samplers = tuple(x for x in args.samplers.split(",") if x)
    if not set(args.samplers) <= set(SAMPLERS):
        ap.error(f"--samplers: expected names among {SAMPLERS}")
    try:
        args.nfe = tuple(int(n) for n in args.nfe.split(",") if n)
    except ValueError:
        ap.error(f"--nfe: not a comma list of ints: {args.nfe!r}")
    if not args.nfe or min(args.nfe) < 8:
        ap.error("--nfe: each budget must be >= 8 (two per-entry updates)")
    if args.fast:
        args.val, args.test, args.chains, args.nfe, args.mh_chains = 2, 2, 1, (8,), 64
    cache_compilations()
    print(f"# Energy prior benchmark ({time.strftime('%Y-%m-%d')}, "
          f"{platform.processor() or 'cpu'}, {os.cpu_count()} CPUs, jax {jax.__version__}, "
          f"backend {jax.default_backend()})\n")
    t_all = time.perf_counter()
    from jaxlib_ext.core.checkpoint import Checkpointer

    with Checkpointer(args.ckpt, read_only=True) as ck:
        step = ck.latest_step()
    model = load(args.ckpt)
    u = en.energy_fn_of(model)
    held_out = images.load_mnist("test").images
    digits = held_out[:args.val + args.test]
    print(f"checkpoint {args.ckpt} at step {step}; {args.val} validation + {args.test} test "
          f"digits, {args.chains} chains, {', '.join(map(str, args.nfe))} network gradients "
          f"per chain, noise "
          f"{NOISE}; hyper-parameter = base x multiplier, bases "
          + ", ".join(f"{s} {HP[s]} {BASE[s]:g}" for s in args.samplers) + "\n")
    if not args.only_reconstruction:
        bench_blind_and_mh(u, args, held_out[args.val:args.val + args.test])
    for nfe in args.nfe:
        bench_reconstruction(u, args, digits, nfe)
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
