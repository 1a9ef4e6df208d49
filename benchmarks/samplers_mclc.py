"""MCLC (arXiv 2601.04791) as a plug-in for latent DPS, PSLD and Latent DAPS on held-out MNIST
digits, with pixel metrics and distributional metrics of the reconstructions.

**Tasks** (``jaxlib_ext.samplers.inverse``, images in [0, 1]): box inpainting (a centred
12x12 box missing), random inpainting (70% of the pixels missing) and Gaussian deblurring
(sigma 1.5 px), each at two measurement-noise levels (``--noise``). **Solvers**
(``--solvers``): latent DPS, PSLD and Latent DAPS (arXiv 2407.01521; ``jaxlib_ext.samplers.mclc``)
on the latent diffusion model of ``jaxlib_ext.models.latent_diffusion`` (``--model ldm``, the
default), or on the exact Gaussian prior of the digits' leading PCA coefficients (``--model
pca``: a linear decoder and a closed-form denoiser, for a quick run). **Digits**: the first
``--val`` digits of the held-out MNIST split choose the hyper-parameters, the next ``--test``
are reported; ``--seeds`` (default 3) solver PRNG keys per digit.

**Protocols** (``--protocol``, a comma list run in its order; default ``paper``), each over
every ``N`` of ``--steps`` (default ``6,11,25``):

* ``paper`` (the paper's comparison): each base solver runs ``N`` solver steps without and with
  MCLC; MCLC adds one corrector step after each solver step but the last and pays its ``N - 1``
  extra network evaluations (NFE ``N`` against ``2 N - 1``).
* ``equal_nfe`` (stricter): the base solver runs ``2 N - 1`` steps against MCLC's ``N + (N -
  1)`` evaluations.

A DAPS step costs ``--daps-ode-steps`` evaluations (default 1, Tweedie's estimate, so that the
counts above hold for it too) and ``--daps-langevin-steps`` decoder gradients (default 100,
the authors'). The NFE of each side is printed with every result.

**The corrector** is the published form (projected drift and noise, ``eta_t = c (1 - abar_t)``;
``--corrector`` picks ``mclc.CONSTRAINTS`` variants, ``--step-rule snr`` the SNR rule, which has
no step scale to tune). Its step scale ``c`` is tuned as the guidance weight is: ``--step-scales``
is a grid of multipliers of the default ``c0 = 1 / (4 d)`` (``d`` the latent dimension; default
``1/3,1,3``, neighbours a factor 2.5 to 4 apart as the weight grid's).

**The comparison rule** (``benchmarks/_comparison.py``): for each protocol, ``N``, task, noise
level and solver, both sides get the same guidance-weight grid ``w`` (``--weights``, factor 3
apart; PSLD's gluing weight is 0.1 times it; for DAPS it sets the Langevin step size, ``eta =
5e-6 w``, with the default likelihood, the authors' ``tau = 0.01`` whatever the noise, ``beta_y
= tau / sqrt(2)``: ``eta / beta_y^2 = 0.1 w``, where their pixel-space steps 1e-5 to 1e-4 are
``w = 2`` to ``20``), the same seeds and the same digits. The base side is tuned over ``w``; the
+MCLC side over the pairs ``(w, c)``. The harness takes one axis per method, so each step scale
is a method of its own, ``<solver>+mclc(c=m c0)``, tuned over ``w`` by the harness; the +MCLC
side is then the step scale whose method has the best mean validation PSNR at its own best
``w`` (the first on a tie): the pair ``(w, c)`` of best mean validation PSNR over the whole
grid. Every grid point (validation PSNR, every seed) is printed; the test metrics are reported
at the picked hyper-parameters only. The picked ``c``, whether it lies on an edge of the ``c``
grid, the mean squared corrector step ``||z' - z||^2`` (:class:`~jaxlib_ext.samplers.mclc.
CorrectorInfo`'s ``squared_step``, over the corrected steps and digits) and the largest
expected squared step (C.4) over the corrected levels are printed against the paper's bound 1.
The +MCLC side has ``len(step-scales)`` times the base's configurations to choose from on
validation; the test split never chooses.

**Metrics** (test digits, at the picked hyper-parameters):

* PSNR and SSIM (:mod:`jaxlib_ext.samplers.inverse.quality`), mean ± std over seeds of the mean
  over test digits.
* Failure (per reconstruction): non-finite pixels, or a PSNR below that of the blank image
  (``x = 0``) for the same digit, or a measurement residual ``||y - A x||`` more than half of
  ``||y||`` above the true digit's own residual ``||y - A x_true||`` (the noise's norm; the true
  digit never fails). The rate is over test digits, mean ± std over seeds.
* FD: the Fréchet distance (:func:`~jaxlib_ext.samplers.inverse.frechet_distance_from_statistics`)
  between the Gaussians fitted to the digit classifier's penultimate features
  (:func:`jaxlib_ext.models.digit_classifier.features`) of the pooled test reconstructions
  (every test digit x seed, ``--test`` x ``--seeds`` rows) and of ``--fd-reference`` (default
  1000) held-out true digits that are neither validation nor test digits (the held-out split's
  digits after the benchmark's; their statistics computed once). Its spread is the std over
  ``--fd-bootstrap`` bootstrap resamplings of the test digits (all seeds of a drawn digit
  kept; the same draws for both sides). An FD of so few rows is biased upward; it compares
  the two sides at equal row counts only. The header prints two floors: the FD of as many other
  held-out true digits as there are pooled rows, and that of the test digits themselves.
* Label accuracy: the fraction of test reconstructions that the classifier labels as the true
  digit's label, mean ± std over seeds.

Before the classifier, reconstructions are clipped to [0, 1] and non-finite pixels set to 0.
The classifier (:func:`jaxlib_ext.models.digit_classifier.load_or_train`, on the MNIST training
split) is cached in ``--classifier-ckpt``; the header prints its accuracy on the reference
digits and on the test digits.

**Verdicts**: per setting and metric (PSNR, SSIM, failure, FD, label accuracy), +MCLC against
its base: a winner only when the mean ± spread intervals do not overlap, "within spread" when
they do, no verdict when a side is not finite; the run ends with the count of each outcome per
metric.

**The model** (``--model ldm``): ``--ckpt`` holding a finished model is used as it is (the
header names its step counts); an empty folder, or one holding a run stopped mid-way, is
trained into or resumed by :func:`jaxlib_ext.models.latent_diffusion.load_or_train` with
``--ae-steps`` and ``--diffusion-steps`` (default 20000: a latent model whose samples are
digits; the stages checkpoint every 500 steps and an interrupted run resumes from the newest
checkpoint when the same command is run again).

**Sample quality** (``--sample-quality``, no inverse problems): ``--samples`` (default 500)
decoded DDIM samples of the LDM (``--sample-steps``, default 50, eta 0, Tweedie's estimate
clipped to [-4, 4]; with ``--model pca``, exact draws from the Gaussian prior), the
classifier's class histogram, the mean maximum class probability and the FD to the reference
digits; beside them the same for as many other held-out true digits (the sampling floor) and
for the autoencoder's reconstructions of those digits (the autoencoder's floor).

Commands::

    python -m benchmarks.samplers_mclc                          # paper protocol, N = 6, 11, 25
    python -m benchmarks.samplers_mclc --steps 6                # one N
    python -m benchmarks.samplers_mclc --protocol equal_nfe
    python -m benchmarks.samplers_mclc --protocol paper,equal_nfe --solvers dps,psld,daps
    python -m benchmarks.samplers_mclc --sample-quality         # the LDM's samples
    python -m benchmarks.samplers_mclc --fast --model pca       # smoke run (N = 4, 2 + 2 digits)
"""

from __future__ import annotations

import argparse
import fractions
import math
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._comparison import (
    LR_RATIO,
    Comparison,
    cache_compilations,
    mean_std,
    run_comparison,
)
from jaxlib_ext.core import images
from jaxlib_ext.samplers import inverse
from jaxlib_ext.samplers import mclc as M
from jaxlib_ext.samplers.inverse import psnr, ssim

TASKS = ("box", "random", "blur")
SOLVERS = {"dps": M.latent_dps, "psld": M.psld, "daps": M.latent_daps}
PROTOCOLS = ("paper", "equal_nfe")
DAPS_STEP = 5e-6  # DAPS's Langevin step size per unit of the weight grid
#: the metrics of the verdicts: (name, record key, higher is better, format)
METRICS = (("PSNR", "test", True, ".2f"), ("SSIM", "ssim", True, ".3f"),
           ("failure", "fail", False, ".3f"), ("FD", "fd", False, ".2f"),
           ("label accuracy", "label_acc", True, ".3f"))


# --------------------------------------------------------------------------- models


class LatentModel:
    """``build(params) -> (eps_model, decoder, encoder)`` on single latents and images in
    [0, 1]; ``params`` travels into the compiled programs as an argument. ``sample(key, n)``
    gives ``n`` prior samples and ``reconstruct(x)`` the autoencoder's round trip of images
    ``[B, 28, 28, 1]``, both images in [0, 1]."""

    def __init__(self, build, params, alpha_bars, latent_shape, name, *, sample, reconstruct,
                 sample_name):
        self.build, self.params = build, params
        self.alpha_bars, self.latent_shape, self.name = alpha_bars, tuple(latent_shape), name
        self.sample, self.reconstruct, self.sample_name = sample, reconstruct, sample_name


def pca_model(train, dim=32):
    """``mclc.pca_latent_prior``: the exact Gaussian prior of the leading ``dim`` PCA
    coefficients of the training digits (linear decoder, closed-form denoiser); its samples
    are exact draws from the prior, its round trip the projection on the components."""
    p = M.pca_latent_prior(train, dim)

    def build(q):
        return q.eps_model, q.decoder, q.encoder

    @jax.jit
    def sample(key, n_like):
        z = jax.random.normal(key, (n_like.shape[0], dim)) * jnp.sqrt(p.variances)
        return jax.vmap(p.decoder)(z)

    return LatentModel(build, p, p.alpha_bars, p.latent_shape, f"pca-{dim}",
                       sample=lambda key, n: sample(key, jnp.zeros(n)),
                       reconstruct=jax.jit(jax.vmap(lambda x: p.decoder(p.encoder(x)))),
                       sample_name="exact draws from the Gaussian prior")


def ldm_model(path, ae_steps, diffusion_steps, sample_steps=50):
    """The latent diffusion model of ``jaxlib_ext.models.latent_diffusion`` at ``path``,
    wrapped for single latents and images in [0, 1] (the model's images are in [-1, 1]).

    A finished model in ``path`` is used as it is; otherwise (an empty or missing folder, or a
    run stopped mid-way) :func:`~jaxlib_ext.models.latent_diffusion.load_or_train` trains or
    resumes it with the given steps."""
    from flax import nnx

    from jaxlib_ext.models import latent_diffusion as ldm

    model = meta = None
    if os.path.isdir(path) and os.listdir(path):
        try:
            model, meta = ldm.load(path)
        except FileNotFoundError:  # a run stopped in its autoencoder stage
            model = None
        if model is not None and not (meta.get("complete") and meta.get("diffusion_steps")):
            model = None  # the autoencoder stage alone: the diffusion stage is still to run
    if model is None:
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

    round_trip = nnx.jit(lambda m, v: ldm.decode(m, ldm.encode(m, v)))
    name = (f"ldm (AE {meta.get('ae_steps')} + diffusion {meta.get('diffusion_steps')} steps, "
            f"{meta.get('config', {}).get('schedule')} schedule, {path})")
    if (meta.get("ae_steps"), meta.get("diffusion_steps")) != (ae_steps, diffusion_steps):
        name += (f" [the folder's finished model, not the --ae-steps {ae_steps} "
                 f"--diffusion-steps {diffusion_steps} of the flags]")
    return LatentModel(
        build, state, model.schedule.alphas_cumprod, model.config.latent_shape, name,
        sample=lambda key, n: 0.5 * (ldm.sample_images(model, key, n, sample_steps) + 1.0),
        reconstruct=lambda x: 0.5 * (round_trip(model, 2.0 * jnp.asarray(x) - 1.0) + 1.0),
        sample_name=f"DDIM {sample_steps}-step samples (eta 0, Tweedie clipped to [-4, 4])")


# --------------------------------------------------------------------------- classifier


class DigitJudge:
    """The digit classifier's view of image sets: penultimate features, labels, and the
    Fréchet distance to the reference digits' features (statistics computed once)."""

    def __init__(self, classifier, reference):
        from flax import nnx

        from jaxlib_ext.models import digit_classifier as dc

        graphdef, state = nnx.split(classifier)

        @jax.jit
        def embed(st, x):
            m = nnx.merge(graphdef, st)
            x = jnp.where(jnp.isfinite(x), jnp.clip(x, 0.0, 1.0), 0.0)
            return dc.features(m, x), jax.nn.softmax(dc.logits(m, x), axis=-1)

        @jax.jit
        def fd_draws(feats, idx, mean_r, cov_r):  # feats [S, n, F], idx [B, n]
            def one(ix):
                mean, cov = inverse.gaussian_statistics(
                    feats[:, ix].reshape(-1, feats.shape[-1]))
                return inverse.frechet_distance_from_statistics(mean, cov, mean_r, cov_r)

            return jax.lax.map(one, idx)

        self._embed = lambda x: embed(state, jnp.asarray(x, jnp.float32))
        self._fd_draws = fd_draws
        self.ref_mean, self.ref_cov = inverse.gaussian_statistics(self.features(reference))

    def features(self, x):
        """``[..., 28, 28, 1]`` images -> ``[..., 128]`` features."""
        x = jnp.asarray(x)
        return self._embed(x.reshape(-1, *x.shape[-3:]))[0].reshape(*x.shape[:-3], -1)

    def probabilities(self, x):
        """``[..., 28, 28, 1]`` images -> ``[..., 10]`` class probabilities."""
        x = jnp.asarray(x)
        return self._embed(x.reshape(-1, *x.shape[-3:]))[1].reshape(*x.shape[:-3], -1)

    def fd(self, feats):
        """FD of feature rows ``[..., F]`` (pooled) to the reference."""
        mean, cov = inverse.gaussian_statistics(jnp.reshape(feats, (-1, feats.shape[-1])))
        return float(inverse.frechet_distance_from_statistics(mean, cov, self.ref_mean,
                                                              self.ref_cov))

    def fd_bootstrap(self, feats, idx):
        """FDs of ``feats [S, n, F]`` over the digit resamplings ``idx [B, n]``."""
        return np.asarray(self._fd_draws(jnp.asarray(feats), jnp.asarray(idx), self.ref_mean,
                                         self.ref_cov))


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
    """One compiled program per (solver, with/without MCLC), over step scales x weights x seeds
    x digits; the model's parameters, the operator (a pytree), the measurements, the weights
    and the step scales are its arguments."""

    def __init__(self, model, n_steps, t_max, ddim_eta=1.0, protocol="paper",
                 step_rule="variance", constraint="projection", daps_ode_steps=1,
                 daps_langevin_steps=100):
        self.model, self.n_steps, self.t_max, self.programs = model, n_steps, t_max, {}
        self.ddim_eta, self.protocol = ddim_eta, protocol
        self.step_rule, self.constraint = step_rule, constraint
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
        """``f(params, op, y [n, ...], keys [S], weights [W], scales [C]) -> (x0, residual,
        nfe, rejected, squared step)``, each ``[C, W, S, n, ...]``; ``scales`` are the
        corrector's ``c`` (pass one dummy value without MCLC)."""
        key = (solver, corrected)
        if key not in self.programs:
            mdl = self.model
            steps = self.n_steps if corrected else self.base_steps()
            fn = SOLVERS[solver]

            def one(params, op, y, k, w, c):
                eps_model, decoder, encoder = mdl.build(params)
                prob = M.latent_inverse_problem(
                    eps_model, decoder, op, y, mdl.alpha_bars, latent_shape=mdl.latent_shape,
                    encoder=encoder, check_operator=False)
                corr = (M.mclc(1, step_scale=c, step_rule=self.step_rule,
                               constraint=self.constraint) if corrected else None)
                out = fn(k, prob, num_steps=steps, corrector=corr, t_max=self.t_max,
                         **self.solver_kwargs(solver, w))
                ci = out.info.corrector
                rej = jnp.mean(ci.rejected.astype(jnp.float32)) if corrected else jnp.nan
                sq = jnp.mean(ci.squared_step) if corrected else jnp.nan
                return out.x0, out.info.final_residual, out.info.nfe, rej, sq

            f = jax.vmap(one, in_axes=(None, None, 0, None, None, None))  # digits
            f = jax.vmap(f, in_axes=(None, None, None, 0, None, None))  # seeds
            f = jax.vmap(f, in_axes=(None, None, None, None, 0, None))  # weights
            f = jax.vmap(f, in_axes=(None, None, None, None, None, 0))  # step scales
            self.programs[key] = jax.jit(f)
        return self.programs[key]

    def bound(self, c):
        """The largest expected squared corrector step (C.4) over the corrected levels at
        step scale ``c`` (the variance rule)."""
        from jaxlib_ext.models.diffusion import ddim_timesteps

        ts = ddim_timesteps(len(self.model.alpha_bars), self.n_steps, self.t_max)[1:]
        one_minus = 1.0 - np.asarray(self.model.alpha_bars, np.float64)[ts]
        d = math.prod(self.model.latent_shape)
        return float(np.max(M.expected_squared_step(c * one_minus, one_minus, d)))


def evaluate(x_hat, x, y, res, res_true):
    """Per reconstruction: PSNR, SSIM, failure (module docstring)."""
    p, s = psnr(x_hat, x), ssim(x_hat, x)
    blank = psnr(jnp.zeros_like(x), x)
    ynorm = jnp.sqrt(jnp.sum(y ** 2, axis=tuple(range(1, y.ndim))))
    finite = jnp.all(jnp.isfinite(x_hat), axis=(-3, -2, -1))
    fail = ~finite | (p < blank) | (res > res_true + 0.5 * ynorm)
    return np.asarray(jnp.where(finite, p, jnp.nan)), np.asarray(s), np.asarray(fail)


# --------------------------------------------------------------------------- verdicts


def verdict(metric, a, b, stats_a, stats_b, higher_is_better, fmt, spread):
    """``(line, outcome)``: ``a`` against ``b`` on ``metric`` from ``(mean, spread)`` pairs; a
    winner only when the intervals do not overlap. ``outcome`` is ``"a"``, ``"b"``,
    ``"within spread"`` or ``"no verdict"``."""
    (ma, sa), (mb, sb) = stats_a, stats_b
    vals = f"{ma:{fmt}} ± {sa:{fmt}} vs {mb:{fmt}} ± {sb:{fmt}}, {spread}"
    if not all(map(math.isfinite, (ma, sa, mb, sb))):
        return f"{metric}: {a} vs {b}: no verdict, not finite ({vals})", "no verdict"
    if abs(ma - mb) <= sa + sb:
        return f"{metric}: {a} vs {b}: within spread ({vals})", "within spread"
    if (ma > mb) == higher_is_better:
        return f"{metric}: {a} better than {b} ({vals})", "a"
    return f"{metric}: {b} better than {a} ({vals})", "b"


def parse_scales(text):
    """``"1/3,1,3"`` -> ``(("1/3", 0.333..), ("1", 1.0), ("3", 3.0))``, ascending; neighbours
    must be a factor ``LR_RATIO`` apart, as the weight grid's."""
    try:
        items = sorted(((s.strip(), float(fractions.Fraction(s.strip())))
                        for s in text.split(",") if s.strip()), key=lambda p: p[1])
    except (ValueError, ZeroDivisionError) as e:
        raise argparse.ArgumentTypeError(f"--step-scales: not a comma list of numbers or "
                                         f"fractions: {text!r}") from e
    if not items or not all(math.isfinite(v) and v > 0 for _, v in items):
        raise argparse.ArgumentTypeError(f"--step-scales: expected positive values, got {text!r}")
    lo, hi = LR_RATIO
    for (_, a), (_, b) in zip(items, items[1:]):
        if not lo <= b / a <= hi:
            raise argparse.ArgumentTypeError(
                f"--step-scales: neighbours {a:g} and {b:g} are a factor {b / a:.3g} apart; the "
                f"grid needs {lo:g} to {hi:g} (e.g. 1/3,1,3)")
    return tuple(items)


def _int_list(text):
    try:
        vals = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a comma list of ints: {text!r}") from e
    if not vals or min(vals) < 2:
        raise argparse.ArgumentTypeError(f"expected solver step counts >= 2, got {text!r}")
    return vals


# --------------------------------------------------------------------------- one setting


def run_setting(runner, solver, task, sig, op, y, x_all, labels, res_true, judge, a, weights,
                seeds, scales, protocol, shared):
    """The comparison of one (protocol, N, task, noise, solver): prints its grid, its
    summary, the picked hyper-parameters and the verdicts; returns the summary row. The +MCLC
    side does not depend on the protocol: its results are kept in ``shared`` for the next."""
    model, n_steps = runner.model, runner.n_steps
    d = math.prod(model.latent_shape)
    c0 = 1.0 / (4.0 * d)
    snr = runner.step_rule == "snr"
    variants = {f"{solver}+mclc" + ("" if snr else f"(c={lab} c0)"): (i, lab, mult * c0)
                for i, (lab, mult) in enumerate(scales)}
    v, te = slice(0, a.val), slice(a.val, None)
    cache = {True: shared[n_steps, task, sig, solver]} if (
        (n_steps, task, sig, solver) in shared) else {}

    def call(corrected):
        if corrected not in cache:
            t0 = time.time()
            keys = jnp.stack([jax.random.key(1000 + s) for s in seeds])
            cs = [c for _, _, c in variants.values()] if corrected else [c0]
            xh, res, nfe, rej, sq = runner.program(solver, corrected)(
                model.params, op, y, keys, jnp.asarray(weights, jnp.float32),
                jnp.asarray(cs, jnp.float32))
            xh = jax.block_until_ready(xh)
            metrics = [[[evaluate(xh[ci, i, j], x_all, y, res[ci, i, j], res_true)
                         for j in range(len(seeds))] for i in range(len(weights))]
                       for ci in range(len(cs))]
            feats = np.asarray(judge.features(xh[..., te, :, :, :]))
            pred = np.argmax(np.asarray(judge.probabilities(xh[..., te, :, :, :])), -1)
            fd = [[judge.fd(feats[ci, i]) for i in range(len(weights))]
                  for ci in range(len(cs))]
            cache[corrected] = dict(m=metrics, nfe=int(np.asarray(nfe).ravel()[0]),
                                    sec=time.time() - t0, rej=np.asarray(rej).mean(-1),
                                    sq=np.asarray(sq).mean(-1), feats=feats, fd=fd,
                                    acc=np.mean(pred == labels[te], axis=-1))
            if corrected:
                shared[n_steps, task, sig, solver] = cache[corrected]
        return cache[corrected]

    def run(method, w, seed):
        corrected = method != solver
        out = call(corrected)
        ci = variants[method][0] if corrected else 0
        i, j = weights.index(w), seeds.index(seed)
        p, s, f = out["m"][ci][i][j]
        return {"val": float(np.nanmean(p[v])) if np.isfinite(p[v]).any() else float("nan"),
                "test": float(np.nanmean(p[te])), "ssim": float(np.mean(s[te])),
                "fail": float(np.mean(f[te])), "fail_val": float(np.mean(f[v])),
                "fd": out["fd"][ci][i], "label_acc": float(out["acc"][ci, i, j]),
                "nfe": out["nfe"], "sec": out["sec"], "rejected": float(out["rej"][ci, i, j]),
                "sq_step": float(out["sq"][ci, i, j])}

    per = a.daps_ode_steps if solver == "daps" else 1
    kind = (f"DAPS steps ({per} network evaluations each)" if solver == "daps"
            else "DDIM steps")
    budget = (f"{n_steps} {kind} per reconstruction (+{n_steps - 1} corrector evaluations "
              f"with MCLC)" if protocol == "paper" else
              f"{(2 * n_steps - 1) * per} network evaluations per reconstruction"
              + ("" if per == 1 else f" ({n_steps * per + n_steps - 1} with MCLC)"))
    spec = Comparison(methods=(solver, *variants), lrs=weights, seeds=seeds, budget=budget)
    print(f"## {protocol}, N = {n_steps}, {task}, noise {sig:g}, {solver}\n")
    res = run_comparison(spec, run, higher_is_better=True, metric="PSNR", log=lambda line: None)

    def score(method):
        m = float(np.mean(res.values(method, res.best_lr(method), "val")))
        return m if math.isfinite(m) else -math.inf

    picked = max(variants, key=score)  # the first on a tie
    print(res.grid_table(fmt=".2f"))
    print()
    print(res.summary_table(baseline=solver, fmt=".2f", labels={picked: f"**{picked}**"},
                            extras=(("SSIM", "ssim", ".3f"), ("failure rate", "fail", ".3f"),
                                    ("FD", "fd", ".2f"), ("label accuracy", "label_acc", ".3f"),
                                    ("NFE", "nfe", ".0f"), ("rejected steps", "rejected", ".3f"),
                                    ("mean squared step", "sq_step", ".3g"))))
    ci, lab, c = variants[picked]
    w_base, w_mclc = res.best_lr(solver), res.best_lr(picked)
    sq = float(np.mean(res.at_best(picked, "sq_step")))
    edge = (len(scales) > 1 and ci in (0, len(scales) - 1))
    bound = runner.bound(c) if not snr else float("nan")
    print(f"\npicked: {solver} w = {w_base:g}{' (edge)' if res.on_edge(solver) else ''}; "
          f"+MCLC w = {w_mclc:g}{' (edge)' if res.on_edge(picked) else ''}, "
          + ("SNR step rule" if snr else
             f"c = {lab} c0 = {c:.3g} (c0 = 1/(4 d) = {c0:.3g}, d = {d}; "
             f"{'on an edge of' if edge else 'inside'} the c grid)")
          + f"; mean squared corrector step {sq:.3g} (bound 1"
          + ("" if snr else f"; (C.4) at most {bound:.3g} over the corrected levels"
             + (", past the bound" if bound > 1 else "")) + ")")

    # the verdicts, +MCLC (picked) against the base
    out_b, out_c = call(False), call(True)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, a.test, (a.fd_bootstrap, a.test))
    i_b, i_c = weights.index(w_base), weights.index(w_mclc)
    fd_b = (res.at_best(solver, "fd")[0], float(np.std(judge.fd_bootstrap(
        out_b["feats"][0, i_b], idx), ddof=1)))
    fd_c = (res.at_best(picked, "fd")[0], float(np.std(judge.fd_bootstrap(
        out_c["feats"][ci, i_c], idx), ddof=1)))
    row = {"protocol": protocol, "N": n_steps, "task": task, "noise": sig, "solver": solver,
           "nfe": (out_b["nfe"], out_c["nfe"]), "w": (w_base, w_mclc),
           "c": "SNR rule" if snr else f"{lab} c0",
           "c_edge": edge, "sq": sq, "bound": bound, "outcomes": {}, "stats": {}}
    for name, key, higher, fmt in METRICS:
        if key == "fd":
            sb, sc = fd_b, fd_c
            spread = f"pooled FD ± std over {a.fd_bootstrap} bootstrap draws of the test digits"
        else:
            sb, sc = mean_std(res.at_best(solver, key)), mean_std(res.at_best(picked, key))
            spread = f"mean ± std over {len(seeds)} seeds"
        line, outcome = verdict(name, f"{solver}+mclc", solver, sc, sb, higher, fmt, spread)
        print(line)
        row["outcomes"][name] = {"a": "+MCLC", "b": "base"}.get(outcome, outcome)
        row["stats"][name] = (sb, sc, fmt)
    print()
    return row


def summary(rows):
    """The final table over every setting and the count of each verdict per metric."""
    print("## Summary (test digits; each side at its hyper-parameters picked by validation "
          "PSNR; FD pooled ± bootstrap std, the rest mean ± std over seeds)\n")
    head = ("| protocol | N | task | noise | solver | NFE base / +MCLC | w base | w, c +MCLC | "
            + " | ".join(f"{n} base | {n} +MCLC" for n, _, _, _ in METRICS)
            + " | mean sq. step (C.4 max) |")
    print(head)
    print("|" + "---|" * head.count(" |"))
    for r in rows:
        cells = [r["protocol"], str(r["N"]), r["task"], f"{r['noise']:g}", r["solver"],
                 f"{r['nfe'][0]} / {r['nfe'][1]}", f"{r['w'][0]:g}",
                 f"{r['w'][1]:g}, {r['c']}" + (" (edge)" if r["c_edge"] else "")]
        for name, _, _, _ in METRICS:
            (mb, sb), (mc, sc), fmt = r["stats"][name]
            cells += [f"{mb:{fmt}} ± {sb:{fmt}}", f"{mc:{fmt}} ± {sc:{fmt}}"]
        cells.append(f"{r['sq']:.3g} ({r['bound']:.3g})")
        print("| " + " | ".join(cells) + " |")
    print()
    for name, _, _, _ in METRICS:
        counts = {k: sum(r["outcomes"][name] == k for r in rows)
                  for k in ("+MCLC", "base", "within spread", "no verdict")}
        print(f"{name}: +MCLC better in {counts['+MCLC']}, base better in {counts['base']}, "
              f"within spread in {counts['within spread']}, no verdict in "
              f"{counts['no verdict']} (of {len(rows)} settings)")


# --------------------------------------------------------------------------- sample quality


def sample_quality(model, judge, held_out, n, key):
    """The sample-quality table: the class histogram, the mean maximum class probability and
    the FD to the reference of held-out digits, their autoencoder reconstructions and ``n``
    prior samples."""
    sets = (("held-out true digits (sampling floor)", held_out),
            ("autoencoder reconstructions of them", np.asarray(model.reconstruct(held_out))),
            (model.sample_name, np.asarray(model.sample(key, n))))
    print("| images | count | class histogram 0..9 (classifier) | classes > 2 % | largest share "
          "| mean max probability | FD to the reference |")
    print("|---|---|---|---|---|---|---|")
    for name, x in sets:
        prob = np.asarray(judge.probabilities(x))
        hist = np.bincount(prob.argmax(-1), minlength=10) / len(x)
        fd = judge.fd(judge.features(x))
        print(f"| {name} | {len(x)} | {' '.join(f'{h:.3f}' for h in hist)} | "
              f"{int(np.sum(hist > 0.02))} | {hist.max():.3f} | {prob.max(-1).mean():.3f} | "
              f"{fd:.2f} |")


# --------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("ldm", "pca"), default="ldm")
    ap.add_argument("--ckpt", default=os.environ.get("LDM_CKPT", ".cache/ldm_mnist"))
    ap.add_argument("--ae-steps", type=int, default=2000, help="when training into --ckpt")
    ap.add_argument("--diffusion-steps", type=int, default=20000,
                    help="when training into --ckpt (checkpointed every 500 steps; an "
                         "interrupted run resumes)")
    ap.add_argument("--abar-min", type=float, default=0.02,
                    help="the first solver step is the last training index with abar >= this")
    ap.add_argument("--steps", type=_int_list, default=None,
                    help="comma list of N, MCLC's solver steps (default 6,11,25; --fast: 4)")
    ap.add_argument("--val", type=int, default=None, help="validation digits (default 6)")
    ap.add_argument("--test", type=int, default=None, help="test digits (default 6)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--noise", default="0.01,0.1")
    ap.add_argument("--weights", default="1,3,10",
                    help="guidance-weight grid w: the step size of DPS and PSLD (PSLD's gluing "
                         "weight 0.1 w); for DAPS the Langevin step size eta = 5e-6 w")
    ap.add_argument("--step-scales", type=parse_scales, default=parse_scales("1/3,1,3"),
                    help="grid of the corrector's step scale c in units of c0 = 1/(4 d) "
                         "(default 1/3,1,3)")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--solvers", default="dps,psld",
                    help=f"comma-separated, of {','.join(SOLVERS)}")
    ap.add_argument("--daps-ode-steps", type=int, default=1,
                    help="DAPS's network evaluations per step (1: Tweedie; the protocols' NFE "
                         "counts hold at 1)")
    ap.add_argument("--daps-langevin-steps", type=int, default=100,
                    help="DAPS's Langevin steps per step (the authors' 100)")
    ap.add_argument("--protocol", default="paper",
                    help=f"comma list of {','.join(PROTOCOLS)}, run in that order")
    ap.add_argument("--corrector", choices=tuple(M.CONSTRAINTS), default="projection")
    ap.add_argument("--step-rule", choices=M.STEP_RULES, default="variance")
    ap.add_argument("--classifier-ckpt", default=".cache/digit_classifier",
                    help="the digit classifier's cache folder (trained there when empty)")
    ap.add_argument("--fd-reference", type=int, default=1000,
                    help="held-out true digits of the FD's reference statistics")
    ap.add_argument("--fd-bootstrap", type=int, default=200,
                    help="bootstrap draws of the test digits for the FD's spread")
    ap.add_argument("--sample-quality", action="store_true",
                    help="print the model's sample quality instead of the benchmark")
    ap.add_argument("--samples", type=int, default=None,
                    help="samples of --sample-quality (default 500; --fast: 100)")
    ap.add_argument("--sample-steps", type=int, default=50, help="DDIM steps of the samples")
    ap.add_argument("--fast", action="store_true",
                    help="smoke run: N = 4, 2 + 2 digits, 100 samples (each unless given)")
    a = ap.parse_args()
    a.steps = a.steps or ((4,) if a.fast else (6, 11, 25))
    a.val = a.val if a.val is not None else (2 if a.fast else 6)
    a.test = a.test if a.test is not None else (2 if a.fast else 6)
    a.samples = a.samples if a.samples is not None else (100 if a.fast else 500)
    solvers = a.solvers.split(",")
    unknown = sorted(set(solvers) - set(SOLVERS))
    if unknown:
        ap.error(f"--solvers: unknown {','.join(unknown)} (expected some of "
                 f"{','.join(SOLVERS)})")
    protocols = a.protocol.split(",")
    if not protocols or set(protocols) - set(PROTOCOLS) or len(set(protocols)) < len(protocols):
        ap.error(f"--protocol: expected distinct values of {','.join(PROTOCOLS)}, got "
                 f"{a.protocol!r}")
    if a.test < 1 or a.val < 1 or a.fd_bootstrap < 2 or a.samples < 2:
        ap.error("--val, --test: at least 1; --fd-bootstrap, --samples: at least 2")
    if a.test * a.seeds < 2:
        ap.error("the FD needs at least 2 pooled reconstructions (--test x --seeds)")
    data = images.load_mnist("test")
    n0 = a.val + a.test
    if n0 + a.fd_reference > len(data.images) or a.fd_reference < 2:
        ap.error(f"--fd-reference: between 2 and {len(data.images) - n0} (the held-out split "
                 f"has {len(data.images)} digits, {n0} of them validation and test)")
    cache_compilations()
    t_start = time.time()

    from jaxlib_ext.models import digit_classifier as dc

    clf, clf_info = dc.load_or_train(a.classifier_ckpt)
    reference = data.images[n0: n0 + a.fd_reference]
    judge = DigitJudge(clf, reference)
    acc_ref = dc.accuracy(clf, reference, data.labels[n0: n0 + a.fd_reference])
    acc_test = dc.accuracy(clf, data.images[a.val: n0], data.labels[a.val: n0])
    others = data.images[n0 + a.fd_reference:]  # held-out digits of neither role
    model = (pca_model(images.load_mnist("train").images) if a.model == "pca"
             else ldm_model(a.ckpt, a.ae_steps, a.diffusion_steps, a.sample_steps))
    head = (f"# digit classifier ({a.classifier_ckpt}, {clf_info['steps']} Adam steps on "
            f"{clf_info['train_images']} training digits): accuracy {acc_ref:.3f} on the "
            f"{a.fd_reference} reference digits (held-out split [{n0}, {n0 + a.fd_reference})), "
            f"{acc_test:.3f} on the {a.test} test digits")
    if a.sample_quality:
        held = np.concatenate([data.images[:n0], others])[: a.samples]
        print(f"# sample quality: model {model.name} (latent {model.latent_shape}); FD to the "
              f"classifier features of the {a.fd_reference} reference digits")
        print(head)
        print(f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
        sample_quality(model, judge, held, a.samples, jax.random.key(0))
        print(f"\ntotal {time.time() - t_start:.0f} s")
        return

    x_all = jnp.asarray(data.images[:n0])
    labels = np.asarray(data.labels[:n0])
    t_max = int(np.nonzero(np.asarray(model.alpha_bars) >= a.abar_min)[0].max())
    weights = tuple(float(w) for w in a.weights.split(","))
    seeds = tuple(range(a.seeds))
    noises = tuple(float(s) for s in a.noise.split(","))
    scales = a.step_scales if a.step_rule == "variance" else (("1", 1.0),)
    pooled = a.test * a.seeds
    floor_other = (judge.fd(judge.features(others[:pooled])) if len(others) >= pooled
                   else float("nan"))
    floor_test = (judge.fd(judge.features(data.images[a.val: n0])) if a.test >= 2
                  else float("nan"))
    d = math.prod(model.latent_shape)
    print(f"# MCLC benchmark: model {model.name} (latent {model.latent_shape}, d = {d}), "
          f"{a.val} validation + {a.test} test held-out MNIST digits, seeds {seeds}, "
          f"weights {weights}, N in {a.steps}, protocols {protocols} (paper: base N solver "
          f"steps; equal_nfe: base 2 N - 1; +MCLC: N steps + 1 corrector step after each but "
          f"the last), constraint {a.corrector}, step rule {a.step_rule}"
          + ("" if a.step_rule == "snr" else
             f", step scales c in {{{', '.join(lab for lab, _ in scales)}}} x c0 = 1/(4 d) = "
             f"{1 / (4 * d):.3g}")
          + f", DDIM eta 1, first step t = {t_max} (abar {float(model.alpha_bars[t_max]):.3g})"
          + (f"; DAPS: {a.daps_ode_steps} ODE evaluations and {a.daps_langevin_steps} Langevin "
             f"steps per step, Langevin step 5e-6 w" if "daps" in solvers else ""))
    print(head)
    print(f"# FD floors (classifier features, against the reference): {pooled} other held-out "
          f"true digits {floor_other:.2f}; the {a.test} true test digits {floor_test:.2f}")
    print(f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    rows, shared = [], {}
    for protocol in protocols:
        for n_steps in a.steps:
            runner = Runner(model, n_steps, t_max, protocol=protocol, step_rule=a.step_rule,
                            constraint=a.corrector, daps_ode_steps=a.daps_ode_steps,
                            daps_langevin_steps=a.daps_langevin_steps)
            for task in a.tasks.split(","):
                op = operator(task, x_all.shape[1:], jax.random.key(1234))
                for sig in noises:
                    y = jax.vmap(inverse.measure, in_axes=(0, None, 0, None))(
                        jax.random.split(jax.random.key(99), x_all.shape[0]), op, x_all, sig)
                    res_true = jnp.sqrt(jnp.sum((y - op.apply(x_all)) ** 2, axis=(1, 2, 3)))
                    for solver in solvers:
                        rows.append(run_setting(runner, solver, task, sig, op, y, x_all, labels,
                                                res_true, judge, a, weights, seeds, scales,
                                                protocol, shared))
    summary(rows)
    print(f"\ntotal {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
