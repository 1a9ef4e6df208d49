"""MCLC (arXiv 2601.04791) as a plug-in for latent DPS, PSLD and Latent DAPS on held-out MNIST
digits.

Tasks (``jaxlib_ext.samplers.inverse``, images in [0, 1]): box inpainting (a centred
12x12 box missing), random inpainting (70% of the pixels missing) and Gaussian deblurring
(sigma 1.5 px), each at two measurement-noise levels. Solvers (``--solvers``): latent DPS,
PSLD and Latent DAPS (arXiv 2407.01521; ``jaxlib_ext.samplers.mclc``) on the latent diffusion
model of ``jaxlib_ext.models.latent_diffusion`` (``--model ldm``, the default), or on the exact
Gaussian prior of the digits' leading PCA coefficients (``--model pca``: a linear decoder and a
closed-form denoiser, for a quick run).

Protocols (``--protocol``): ``paper`` (default, the paper's comparison): both sides run ``N``
solver steps and MCLC adds one corrector step after each but the last, paying ``N - 1`` extra
network evaluations; ``equal_nfe`` (ours, stricter): the base solver runs ``2 N - 1`` steps
against MCLC's ``N + (N - 1)`` evaluations. A DAPS step costs ``--daps-ode-steps`` evaluations
(default 1, Tweedie's estimate, so that the counts above hold for it too) and
``--daps-langevin-steps`` decoder gradients (default 100, the authors'). The corrector is the
published form (projected drift and noise, ``eta_t = c (1 - abar_t)`` at the default ``c = 1 /
(4 d)``; ``--corrector`` picks ``mclc.CONSTRAINTS`` variants, ``--step-rule snr`` the SNR rule);
``c`` is not tuned.

The comparison rule (``benchmarks/_comparison.py``): for each task, noise level and solver,
the two methods (without, with MCLC) get the same guidance-weight grid ``w`` (factor 3 apart;
PSLD's gluing weight is 0.1 times it; for DAPS it sets the Langevin step size, ``eta = 5e-6 w``,
with the default likelihood, the authors' ``tau = 0.01`` whatever the noise, ``beta_y = tau /
sqrt(2)``: ``eta / beta_y^2 = 0.1 w``, where their pixel-space steps 1e-5 to 1e-4 are ``w = 2``
to ``20``), 3 seeds (the solver's PRNG key), the weight picked by
the mean validation PSNR (``--val`` digits), the test metrics reported at that weight (the
next ``--test`` held-out digits). The whole grid is printed.

Failure (per reconstruction): non-finite pixels, or a PSNR below that of the blank image
(``x = 0``) for the same digit, or a measurement residual ``||y - A x||`` more than half of
``||y||`` above the true digit's own residual ``||y - A x_true||`` (the noise's norm; the true
digit never fails). The failure rate is over test digits and seeds at the chosen weight. PSNR
and SSIM: :mod:`jaxlib_ext.samplers.inverse.quality`.

    python -m benchmarks.samplers_mclc        # 20-30 min on 2 busy CPU cores (about 18 with
                                              # JAX_COMPILATION_CACHE_DIR already filled)
    python -m benchmarks.samplers_mclc --fast          # smoke run
    for n in 6 11 25; do python -m benchmarks.samplers_mclc --steps $n; done
    python -m benchmarks.samplers_mclc --protocol equal_nfe
    python -m benchmarks.samplers_mclc --solvers dps,psld,daps
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._comparison import Comparison, cache_compilations, format_pm, run_comparison
from jaxlib_ext.core import images
from jaxlib_ext.samplers import inverse
from jaxlib_ext.samplers import mclc as M
from jaxlib_ext.samplers.inverse import psnr, ssim

TASKS = ("box", "random", "blur")
SOLVERS = {"dps": M.latent_dps, "psld": M.psld, "daps": M.latent_daps}
DAPS_STEP = 5e-6  # DAPS's Langevin step size per unit of the weight grid


# --------------------------------------------------------------------------- models


class LatentModel:
    """``build(params) -> (eps_model, decoder, encoder)`` on single latents and images in
    [0, 1]; ``params`` travels into the compiled programs as an argument."""

    def __init__(self, build, params, alpha_bars, latent_shape, name):
        self.build, self.params = build, params
        self.alpha_bars, self.latent_shape, self.name = alpha_bars, tuple(latent_shape), name


def pca_model(train, dim=32):
    """``mclc.pca_latent_prior``: the exact Gaussian prior of the leading ``dim`` PCA
    coefficients of the training digits (linear decoder, closed-form denoiser)."""
    p = M.pca_latent_prior(train, dim)

    def build(q):
        return q.eps_model, q.decoder, q.encoder

    return LatentModel(build, p, p.alpha_bars, p.latent_shape, f"pca-{dim}")


def ldm_model(path, ae_steps, diffusion_steps):
    """The latent diffusion model of ``jaxlib_ext.models.latent_diffusion`` at ``path``
    (loaded, or trained there with the given steps when the folder is empty), wrapped for
    single latents and images in [0, 1] (the model's images are in [-1, 1])."""
    from flax import nnx

    from jaxlib_ext.models import latent_diffusion as ldm

    if os.path.isdir(path) and os.listdir(path):
        model, meta = ldm.load(path)
    else:
        model, meta = ldm.load_or_train(path, ae_steps=ae_steps, diffusion_steps=diffusion_steps)
    graphdef, state = nnx.split(model)

    def build(st):
        m = nnx.merge(graphdef, st)

        def eps_model(z, t):
            return ldm.eps_model(m, z[None], jnp.reshape(t, (1,)).astype(jnp.int32))[0]

        def decoder(z):
            return 0.5 * (ldm.decode(m, z[None])[0] + 1.0)

        def encoder(x):
            return ldm.encode(m, (2.0 * x - 1.0)[None])[0]

        return eps_model, decoder, encoder

    name = (f"ldm (AE {meta.get('ae_steps')} + diffusion {meta.get('diffusion_steps')} steps, "
            f"{meta.get('config', {}).get('schedule')} schedule)")
    return LatentModel(build, state, model.schedule.alphas_cumprod, model.config.latent_shape,
                       name)


# --------------------------------------------------------------------------- tasks


def operator(task, shape, key):
    """The task's operator; both inpaintings share one pytree structure (one compile)."""
    if task == "box":
        mask = np.ones(shape[:2], np.float32)
        mask[8:20, 8:20] = 0.0
        return inverse.inpainting(mask, shape, name="inpainting")
    if task == "random":
        mask = jax.random.bernoulli(key, 0.3, shape[:2]).astype(jnp.float32)
        return inverse.inpainting(mask, shape, name="inpainting")
    return inverse.gaussian_blur(shape, 1.5)


class Runner:
    """One compiled program per (solver, with/without MCLC), over weights x seeds x digits;
    the model's parameters, the operator (a pytree) and the measurements are its arguments."""

    def __init__(self, model, n_steps, t_max, ddim_eta=1.0, protocol="paper",
                 corrector=None, daps_ode_steps=1, daps_langevin_steps=100):
        self.model, self.n_steps, self.t_max, self.programs = model, n_steps, t_max, {}
        self.ddim_eta, self.protocol = ddim_eta, protocol
        self.corrector = corrector if corrector is not None else M.mclc(1)
        self.daps_ode_steps, self.daps_langevin_steps = daps_ode_steps, daps_langevin_steps

    def solver_kwargs(self, solver, w):
        """The solver's settings at grid weight ``w`` (see the module docstring)."""
        if solver == "daps":
            return {"step_size": DAPS_STEP * w, "ode_steps": self.daps_ode_steps,
                    "langevin_steps": self.daps_langevin_steps}
        kw = {"step_size": w, "ddim_eta": self.ddim_eta}
        return kw if solver == "dps" else {**kw, "gluing_weight": 0.1 * w}

    def base_steps(self):
        return self.n_steps if self.protocol == "paper" else 2 * self.n_steps - 1

    def program(self, solver, corrected):
        key = (solver, corrected)
        if key not in self.programs:
            mdl = self.model
            steps = self.n_steps if corrected else self.base_steps()
            corr = self.corrector if corrected else None
            fn = SOLVERS[solver]

            def one(params, op, y, k, w):
                eps_model, decoder, encoder = mdl.build(params)
                prob = M.latent_inverse_problem(
                    eps_model, decoder, op, y, mdl.alpha_bars, latent_shape=mdl.latent_shape,
                    encoder=encoder, check_operator=False)
                out = fn(k, prob, num_steps=steps, corrector=corr, t_max=self.t_max,
                         **self.solver_kwargs(solver, w))
                ci = out.info.corrector
                rej = jnp.mean(ci.rejected.astype(jnp.float32)) if corrected else jnp.nan
                sq = jnp.mean(ci.squared_step) if corrected else jnp.nan
                return out.x0, out.info.final_residual, out.info.nfe, rej, sq

            f = jax.vmap(one, in_axes=(None, None, 0, None, None))  # digits
            f = jax.vmap(f, in_axes=(None, None, None, 0, None))  # seeds
            f = jax.vmap(f, in_axes=(None, None, None, None, 0))  # weights
            self.programs[key] = jax.jit(f)
        return self.programs[key]


def evaluate(x_hat, x, y, res, res_true):
    """Per reconstruction: PSNR, SSIM, failure (module docstring)."""
    p, s = psnr(x_hat, x), ssim(x_hat, x)
    blank = psnr(jnp.zeros_like(x), x)
    ynorm = jnp.sqrt(jnp.sum(y ** 2, axis=tuple(range(1, y.ndim))))
    finite = jnp.all(jnp.isfinite(x_hat), axis=(-3, -2, -1))
    fail = ~finite | (p < blank) | (res > res_true + 0.5 * ynorm)
    return np.asarray(jnp.where(finite, p, jnp.nan)), np.asarray(s), np.asarray(fail)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("ldm", "pca"), default="ldm")
    ap.add_argument("--ckpt", default=os.environ.get("LDM_CKPT", ".cache/ldm_mnist"))
    ap.add_argument("--ae-steps", type=int, default=2000, help="when training into --ckpt")
    ap.add_argument("--diffusion-steps", type=int, default=4000)
    ap.add_argument("--abar-min", type=float, default=0.02,
                    help="the first solver step is the last training index with abar >= this")
    ap.add_argument("--steps", type=int, default=6, help="N: MCLC's solver steps")
    ap.add_argument("--val", type=int, default=6)
    ap.add_argument("--test", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--noise", default="0.01,0.1")
    ap.add_argument("--weights", default="1,3,10",
                    help="guidance-weight grid w: the step size of DPS and PSLD (PSLD's gluing "
                         "weight 0.1 w); for DAPS the Langevin step size eta = 5e-6 w")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--solvers", default="dps,psld",
                    help=f"comma-separated, of {','.join(SOLVERS)}")
    ap.add_argument("--daps-ode-steps", type=int, default=1,
                    help="DAPS's network evaluations per step (1: Tweedie; the protocols' NFE "
                         "counts hold at 1)")
    ap.add_argument("--daps-langevin-steps", type=int, default=100,
                    help="DAPS's Langevin steps per step (the authors' 100)")
    ap.add_argument("--protocol", choices=("paper", "equal_nfe"), default="paper")
    ap.add_argument("--corrector", choices=tuple(M.CONSTRAINTS), default="projection")
    ap.add_argument("--step-rule", choices=M.STEP_RULES, default="variance")
    ap.add_argument("--fast", action="store_true")
    a = ap.parse_args()
    if a.fast:
        a.steps, a.val, a.test = 4, 2, 2
    solvers = a.solvers.split(",")
    unknown = sorted(set(solvers) - set(SOLVERS))
    if unknown:
        ap.error(f"--solvers: unknown {','.join(unknown)} (expected some of "
                 f"{','.join(SOLVERS)})")
    cache_compilations()
    t_start = time.time()
    data = images.load_mnist("test")
    x_all = jnp.asarray(data.images[: a.val + a.test])
    model = (pca_model(images.load_mnist("train").images) if a.model == "pca"
             else ldm_model(a.ckpt, a.ae_steps, a.diffusion_steps))
    t_max = int(np.nonzero(np.asarray(model.alpha_bars) >= a.abar_min)[0].max())
    weights = tuple(float(w) for w in a.weights.split(","))
    seeds = tuple(range(a.seeds))
    noises = tuple(float(s) for s in a.noise.split(","))
    print(f"# MCLC benchmark: model {model.name} (latent {model.latent_shape}), "
          f"{a.val} validation + {a.test} test held-out MNIST digits, seeds {seeds}, "
          f"weights {weights}, N = {a.steps}, protocol {a.protocol} (base: "
          f"{a.steps if a.protocol == 'paper' else 2 * a.steps - 1} solver steps; +MCLC: "
          f"{a.steps} steps + 1 corrector step each, constraint {a.corrector}, step rule "
          f"{a.step_rule}), DDIM eta 1, first step "
          f"t = {t_max} (abar {float(model.alpha_bars[t_max]):.3g})"
          + (f"; DAPS: {a.daps_ode_steps} ODE evaluations and {a.daps_langevin_steps} Langevin "
             f"steps per step, Langevin step 5e-6 w" if "daps" in solvers else ""))
    print(f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    runner = Runner(model, a.steps, t_max, protocol=a.protocol,
                    corrector=M.mclc(1, step_rule=a.step_rule, constraint=a.corrector),
                    daps_ode_steps=a.daps_ode_steps, daps_langevin_steps=a.daps_langevin_steps)
    rows = []
    for task in a.tasks.split(","):
        op = operator(task, x_all.shape[1:], jax.random.key(1234))
        for sig in noises:
            y = jax.vmap(inverse.measure, in_axes=(0, None, 0, None))(
                jax.random.split(jax.random.key(99), x_all.shape[0]), op, x_all, sig)
            res_true = jnp.sqrt(jnp.sum((y - op.apply(x_all)) ** 2, axis=(1, 2, 3)))
            for solver in solvers:
                cache = {}

                def run(method, w, seed, solver=solver, y=y, op=op, cache=cache,
                        res_true=res_true):
                    corrected = method.endswith("+mclc")
                    if method not in cache:
                        t0 = time.time()
                        keys = jnp.stack([jax.random.key(1000 + s) for s in seeds])
                        xh, res, nfe, rej, sq = runner.program(solver, corrected)(
                            model.params, op, y, keys, jnp.asarray(weights, jnp.float32))
                        xh = jax.block_until_ready(xh)
                        m = [evaluate(xh[i, j], x_all, y, res[i, j], res_true)
                             for i in range(len(weights)) for j in range(len(seeds))]
                        cache[method] = (m, int(nfe.ravel()[0]), time.time() - t0,
                                         np.asarray(rej).mean(-1), np.asarray(sq).mean(-1))
                    m, nfe, sec, rej, sq = cache[method]
                    i, j = weights.index(w), seeds.index(seed)
                    p, s, f = m[i * len(seeds) + j]
                    v, te = slice(0, a.val), slice(a.val, None)
                    return {"val": float(np.nanmean(p[v])) if np.isfinite(p[v]).any() else
                            float("nan"), "test": float(np.nanmean(p[te])),
                            "ssim": float(np.mean(s[te])), "fail": float(np.mean(f[te])),
                            "fail_val": float(np.mean(f[v])), "nfe": nfe, "sec": sec,
                            "rejected": float(rej[i, j]), "sq_step": float(sq[i, j])}

                per = a.daps_ode_steps if solver == "daps" else 1
                kind = (f"DAPS steps ({per} network evaluations each)" if solver == "daps"
                        else "DDIM steps")
                spec = Comparison(methods=(solver, f"{solver}+mclc"), lrs=weights, seeds=seeds,
                                  budget=f"{a.steps} {kind} per reconstruction "
                                         f"(+{a.steps - 1} corrector evaluations with MCLC)"
                                  if a.protocol == "paper" else
                                  f"{(2 * a.steps - 1) * per} network evaluations per "
                                  f"reconstruction" + ("" if per == 1 else
                                                       f" ({a.steps * per + a.steps - 1} with "
                                                       f"MCLC)"))
                print(f"## {task}, noise {sig:g}, {solver}\n")
                res = run_comparison(spec, run, higher_is_better=True, metric="PSNR",
                                     log=lambda line: None)
                print(res.grid_table(fmt=".2f"))
                print(res.summary_table(baseline=solver, fmt=".2f",
                                        extras=(("SSIM", "ssim", ".3f"),
                                                ("failure rate", "fail", ".3f"),
                                                ("NFE", "nfe", ".0f"),
                                                ("rejected steps", "rejected", ".3f"),
                                                ("mean squared step", "sq_step", ".3g"))))
                print(res.verdict(f"{solver}+mclc", solver, fmt=".2f") + "\n")
                rec = {}
                for meth in spec.methods:
                    w = res.best_lr(meth)
                    recs = [run(meth, w, s) for s in seeds]
                    rec[meth] = (np.array([r["test"] for r in recs]),
                                 np.array([r["ssim"] for r in recs]),
                                 np.array([r["fail"] for r in recs]))
                rows.append((task, sig, solver, rec))
    print("## Summary (test digits, each method at its best weight by validation PSNR)\n")
    print("| task | noise | solver | PSNR base | PSNR +MCLC | SSIM base | SSIM +MCLC | "
          "failure base | failure +MCLC |")
    print("|---|---|---|---|---|---|---|---|---|")
    fewer, as_good = 0, 0
    for task, sig, solver, rec in rows:
        b, c = rec[solver], rec[f"{solver}+mclc"]
        print(f"| {task} | {sig:g} | {solver} | {format_pm(b[0], '.2f')} | "
              f"{format_pm(c[0], '.2f')} | {format_pm(b[1], '.3f')} | {format_pm(c[1], '.3f')} | "
              f"{np.mean(b[2]):.3f} | {np.mean(c[2]):.3f} |")
        fewer += np.mean(c[2]) <= np.mean(b[2])
        as_good += np.mean(c[0]) >= np.mean(b[0]) - np.std(b[0], ddof=1)
    print(f"\nMCLC fails no more often in {fewer}/{len(rows)} settings; its mean PSNR is at "
          f"least the base's mean minus one std in {as_good}/{len(rows)}.")
    print(f"\ntotal {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
