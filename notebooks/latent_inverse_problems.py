# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Latent-diffusion inverse problems with the measurement-consistent Langevin corrector
#
# A latent diffusion model generates `x = D(z_0)`; a linear measurement `y = A x + noise` is
# observed. Latent DPS and PSLD guide the reverse diffusion toward the measurement with the
# gradient of `||y - A D(zhat_0(z_t))||`; Latent DAPS (arXiv 2407.01521) runs Langevin dynamics
# toward the measurement on the clean latent at every level. MCLC (arXiv 2601.04791) inserts
# Langevin steps on the diffusion prior between solver steps, constrained so that this residual
# does not increase.
# The update used here is the published form (as its secondary descriptions give it; the
# paper's text could not be read): a Langevin step at the solver's level whose drift and noise
# are projected off the residual's gradient, with a step `eta_t = c (1 - abar_t)`
# (`jaxlib_ext.samplers.mclc`; a retraction to the level set and the SNR step rule are options).
#
# Here: the residual along the solver with and without the corrector, reconstructions side by
# side at equal network evaluations, a distributional metric (a Fréchet distance on a digit
# classifier's features) with label accuracy, PSNR and SSIM, and a final check on the
# linear-Gaussian latent model, whose posterior is closed-form.
#
# The model: the latent diffusion model trained on MNIST (`jaxlib_ext.models.latent_diffusion`)
# when its checkpoint is there and `FAST` is off; otherwise a Gaussian prior on 32 principal
# components of the training digits, whose denoiser is exact (no training needed).

# %%
# On Colab, `%pip install jaxlib-ext` from PyPI; elsewhere this cell does nothing.
import sys

if "google.colab" in sys.modules:
    from IPython import get_ipython

    get_ipython().run_line_magic("pip", "install jaxlib-ext")

# %%
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

from jaxlib_ext.core import images
from jaxlib_ext.samplers import inverse
from jaxlib_ext.samplers import mclc as M
from jaxlib_ext.samplers.inverse import psnr

FAST = os.environ.get("FAST") == "1"
CKPT = os.environ.get("LDM_CKPT", "/work/cache/ldm_mnist")
N_DIGITS = 8 if FAST else 16  # measured digits (the first of the held-out split)
N_SHOW = 3 if FAST else 6  # of them in the figure of reconstructions
N_SEEDS = 2 if FAST else 4
N = 6 if FAST else 12  # MCLC's solver steps; the base solver gets 2N - 1 at equal cost
NOISE = 0.05
SOLVERS = ("dps", "psld", "daps")
DAPS_STEP = 5e-6  # DAPS's Langevin step size per unit of the guidance weight (the benchmark's)
DAPS_LANGEVIN = 100  # Langevin steps per DAPS step (the authors' default)


def load_model():
    """``(eps_model, decoder, encoder, alpha_bars, latent_shape, name, guidance weight)`` on
    single latents and images in [0, 1]."""
    if not FAST and os.path.isdir(CKPT) and os.listdir(CKPT):
        from jaxlib_ext.models import latent_diffusion as ldm

        m, _ = ldm.load(CKPT)  # images in [-1, 1]; the problem works in [0, 1]
        return (lambda z, t: ldm.eps_model(m, z[None], jnp.reshape(t, (1,)).astype(jnp.int32))[0],
                lambda z: 0.5 * (ldm.decode(m, z[None])[0] + 1.0),
                lambda x: ldm.encode(m, (2.0 * x - 1.0)[None])[0],
                m.schedule.alphas_cumprod, tuple(m.config.latent_shape),
                "latent diffusion model", 3.0)  # the benchmark's best weight for box inpainting
    p = M.pca_latent_prior(images.load_mnist("train").images, 32)
    return (p.eps_model, p.decoder, p.encoder, p.alpha_bars, p.latent_shape,
            "Gaussian prior on 32 principal components", 10.0)


eps_model, decoder, encoder, alpha_bars, latent_shape, model_name, weight = load_model()
# the first solver step: the last training index with alpha-bar >= 0.02 (Tweedie's estimate
# and the guidance gradient blow up where alpha-bar is ~0, at the end of a cosine schedule)
T_MAX = int(np.nonzero(np.asarray(alpha_bars) >= 0.02)[0].max())
held_out = images.load_mnist("test")
x_true = jnp.asarray(held_out.images[:N_DIGITS])
op = inverse.box_inpainting(x_true.shape[1:], 12)
y = jax.vmap(inverse.measure, in_axes=(0, None, 0, None))(
    jax.random.split(jax.random.key(0), N_DIGITS), op, x_true, NOISE)
print(f"model: {model_name}, latent {latent_shape}; {N_DIGITS} held-out digits, 12x12 box "
      f"missing, noise {NOISE}")

# %% [markdown]
# ## The residual along the solver
#
# Each digit is reconstructed by latent DPS, PSLD and Latent DAPS, each with `2N - 1` solver
# steps, or with `N` steps and one MCLC step after each but the last: the same number of network
# evaluations. The curves show `||y - A D(zhat_0(z_t))||` at every solver step (mean over digits
# and seeds), against the network evaluations spent.
#
# **A DAPS step** (arXiv 2407.01521, `jaxlib_ext.samplers.mclc.latent_daps`) differs from a
# guided DDIM step of DPS or PSLD: from `z_t` it goes down to the clean latent and back up. An
# estimate `zhat_0` (here Tweedie's, `ode_steps=1`; `K` probability-flow ODE steps would cost `K`
# evaluations), then `L = 100` Langevin steps on the clean latent toward the measurement
# (a Gaussian around `zhat_0` times the likelihood, with the authors' likelihood scale
# `tau = 0.01`, not the measurement's noise level), then fresh forward noise to the next level. With `ode_steps=1` a step costs one
# network evaluation, as a DPS or PSLD step, so the counts are the same: `2N - 1` for the base
# solver, `N + (N - 1)` with MCLC, whose corrector acts on the re-noised latent. The Langevin
# steps add `L` decoder gradients per step, which the count leaves out (DPS and PSLD
# differentiate through the network once per step; DAPS never does). Its Langevin step size is
# `eta = 5e-6 w` for the guidance weight `w` of the other two, the mapping of
# `benchmarks/samplers_mclc.py`.

# %%


def solve(solver, corrected, y_i, key):
    prob = M.latent_inverse_problem(eps_model, decoder, op, y_i, alpha_bars,
                                    latent_shape=latent_shape, encoder=encoder,
                                    check_operator=False)
    if solver == "daps":  # one network evaluation per step (ode_steps=1), as DPS and PSLD
        fn, kw = M.latent_daps, {"step_size": DAPS_STEP * weight, "ode_steps": 1,
                                 "langevin_steps": DAPS_LANGEVIN}
    else:
        fn, kw = (M.latent_dps, {"step_size": weight}) if solver == "dps" else (
            M.psld, {"step_size": weight, "gluing_weight": 0.1 * weight})
    return fn(key, prob, num_steps=N if corrected else 2 * N - 1,
              corrector=M.mclc(1) if corrected else None, t_max=T_MAX, **kw)


inverse.check_adjoint(op, x_true.shape[1:])
keys = jax.random.split(jax.random.key(1), N_SEEDS)
results = {}
for solver in SOLVERS:
    for corrected in (False, True):
        run = jax.jit(jax.vmap(jax.vmap(lambda yy, k, s=solver, c=corrected: solve(s, c, yy, k),
                                        in_axes=(None, 0)), in_axes=(0, None)))
        results[(solver, corrected)] = run(y, keys)

fig, axes = plt.subplots(1, len(SOLVERS), figsize=(15, 3.6), sharey=True)
for ax, solver in zip(axes, SOLVERS):
    for corrected, style in ((False, "-"), (True, "--")):
        info = results[(solver, corrected)].info
        r = np.asarray(info.residual).reshape(-1, info.residual.shape[-1]).mean(0)
        nfe = np.arange(1, r.shape[0] + 1) * (2 if corrected else 1) - (1 if corrected else 0)
        ax.plot(nfe, r, style, marker=".", label=f"{solver}{' + MCLC' if corrected else ''}")
        if corrected:  # the residual before each corrector step (after the solver's step)
            rc = np.asarray(info.corrector.residual[..., 0]).reshape(-1, r.shape[0] - 1).mean(0)
            ax.plot(nfe[1:] - 1, rc, "x", color=ax.lines[-1].get_color(), ms=4,
                    label="before the corrector step")
    ax.set(xlabel="network evaluations", ylabel="||y - A D(zhat_0)||", yscale="log",
           title=solver)
    ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Reconstructions side by side (seed 0, the first digits)

# %%
cols = [("truth", x_true), ("A^T y", jax.vmap(op.adjoint)(y))]
for (solver, corrected), res in results.items():
    cols.append((f"{solver}{' + MCLC' if corrected else ''}", res.x0[:, 0]))
fig, axes = plt.subplots(N_SHOW, len(cols), figsize=(1.6 * len(cols), 1.6 * N_SHOW))
for j, (name, ims) in enumerate(cols):
    for i in range(N_SHOW):
        axes[i, j].imshow(np.clip(np.asarray(ims[i, ..., 0]), 0, 1), cmap="gray")
        axes[i, j].axis("off")
    axes[0, j].set_title(name, fontsize=9)
plt.tight_layout()
plt.show()


for (solver, corrected), res in results.items():
    p = float(np.mean(psnr(res.x0, x_true[:, None])))  # [digits, seeds]
    name = solver + (" + MCLC" if corrected else "")
    print(f"{name:12s} nfe {int(res.info.nfe[0, 0]):3d}  "
          f"mean PSNR {p:.2f} dB  final residual {float(res.info.final_residual.mean()):.3f}")

# %% [markdown]
# ## A distributional metric
#
# PSNR and SSIM score each reconstruction against its own truth. The Fréchet distance (FD, the
# FID of arXiv 1706.08500 with a small digit classifier in place of Inception:
# `jaxlib_ext.models.digit_classifier`, `jaxlib_ext.samplers.inverse.frechet_distance`) scores
# the set: the distance between the Gaussians fitted to the classifier's 128 penultimate
# features of the pooled reconstructions (every digit x seed) and of 1000 held-out true digits
# that are not measured here (their statistics computed once). Label accuracy is the fraction of
# reconstructions the classifier labels as their true digit. Reconstructions are clipped to
# [0, 1] first.
#
# With so few rows (`N_DIGITS x N_SEEDS`: 16 in `FAST` mode, 64 otherwise) against 128 features
# the fitted covariance is poor and the FD is biased upward; it is read only as a comparison between the two sides of a solver, at equal row
# counts. Two floors give its scale: the FD of as many other held-out true digits as there are
# pooled rows, and that of the measured true digits themselves, each repeated once per seed
# (what exact reconstructions would score). The spread is the standard deviation over bootstrap
# resamplings of the digits (all seeds of a drawn digit kept, the same draws for every row).
#
# The classifier is trained on the MNIST training split, or loaded from its cache folder (that
# of the benchmark, `.cache/digit_classifier`); in `FAST` mode, when that folder is empty, a
# shorter run is trained into a folder of its own.

# %%
from jaxlib_ext.models import digit_classifier as dc
from jaxlib_ext.samplers.inverse import ssim

CLF_DIR = os.environ.get("DIGIT_CLASSIFIER_CKPT", ".cache/digit_classifier")
clf_steps = dc.DEFAULT_STEPS
if FAST and not (os.path.isdir(CLF_DIR) and os.listdir(CLF_DIR)):
    clf_steps, CLF_DIR = 100, CLF_DIR + "_fast"
clf, clf_info = dc.load_or_train(CLF_DIR, steps=clf_steps, progress=not FAST)
REF = slice(100, 1100)  # the reference digits: held out, not measured
assert N_DIGITS <= REF.start
ref_images, ref_labels = held_out.images[REF], held_out.labels[REF]
print(f"digit classifier ({CLF_DIR}, {clf_info['steps']} Adam steps on "
      f"{clf_info['train_images']} training digits): accuracy "
      f"{dc.accuracy(clf, ref_images, ref_labels):.3f} on the {len(ref_labels)} reference digits")

embed = nnx.jit(lambda m, x: (dc.features(m, x), jnp.argmax(dc.logits(m, x), -1)))


def judge(x):
    """``[..., 28, 28, 1]`` images -> features ``[..., 128]`` and predicted labels ``[...]``."""
    x = jnp.asarray(x)
    lead = x.shape[:-3]
    f, lab = embed(clf, jnp.where(jnp.isfinite(x), jnp.clip(x, 0.0, 1.0), 0.0)
                   .reshape(-1, *x.shape[-3:]))
    return f.reshape(*lead, -1), lab.reshape(lead)


ref_mean, ref_cov = inverse.gaussian_statistics(judge(ref_images)[0])


@jax.jit
def fd_draws(feats, idx):
    """FD to the reference of ``feats [digits, seeds, F]`` resampled by ``idx [B, digits]``."""
    def one(ix):
        mean, cov = inverse.gaussian_statistics(feats[ix].reshape(-1, feats.shape[-1]))
        return inverse.frechet_distance_from_statistics(mean, cov, ref_mean, ref_cov)

    return jax.lax.map(one, idx)


pooled = N_DIGITS * N_SEEDS
everyone = jnp.arange(N_DIGITS)[None]
boot = jax.random.randint(jax.random.key(2), (50 if FAST else 200, N_DIGITS), 0, N_DIGITS)
others = held_out.images[REF.stop: REF.stop + pooled]
floor_other = float(fd_draws(judge(others)[0][:, None], jnp.arange(pooled)[None])[0])
true_feats = jnp.repeat(judge(x_true)[0][:, None], N_SEEDS, axis=1)
floor_true = float(fd_draws(true_feats, everyone)[0])
print(f"FD floors: {pooled} other held-out true digits {floor_other:.2f}; the {N_DIGITS} "
      f"measured true digits, each x {N_SEEDS} seeds {floor_true:.2f}")

labels = np.asarray(held_out.labels[:N_DIGITS])
table = {}
for (solver, corrected), res in results.items():
    feats, pred = judge(res.x0)  # [digits, seeds, ...]
    table[(solver, corrected)] = dict(
        nfe=int(res.info.nfe[0, 0]), fd=float(fd_draws(feats, everyone)[0]),
        fd_std=float(np.std(np.asarray(fd_draws(feats, boot)))),
        acc=float(np.mean(np.asarray(pred) == labels[:, None])),
        psnr=float(np.mean(psnr(res.x0, x_true[:, None]))),
        ssim=float(np.mean(ssim(res.x0, x_true[:, None]))))
print(f"\n{N_DIGITS} digits x {N_SEEDS} seeds = {pooled} pooled reconstructions per row; FD "
      f"spread: std over {boot.shape[0]} bootstrap draws of the digits")
print("| solver      | NFE | FD              | label accuracy | PSNR (dB) | SSIM  |")
print("|-------------|-----|-----------------|----------------|-----------|-------|")
for (solver, corrected), r in table.items():
    name = solver + (" + MCLC" if corrected else "")
    print(f"| {name:11s} | {r['nfe']:3d} | {r['fd']:7.2f} ± {r['fd_std']:5.2f} | "
          f"{r['acc']:14.3f} | {r['psnr']:9.2f} | {r['ssim']:.3f} |")

fig, ax = plt.subplots(figsize=(8.5, 3.6))
pos = np.arange(len(SOLVERS))
for k, (corrected, label) in enumerate(((False, "base"), (True, "+ MCLC"))):
    ax.bar(pos + (k - 0.5) * 0.38, [table[(s, corrected)]["fd"] for s in SOLVERS], 0.38,
           yerr=[table[(s, corrected)]["fd_std"] for s in SOLVERS], capsize=3, label=label)
ax.axhline(floor_other, color="k", ls="--", lw=1, label=f"{pooled} other true digits")
ax.axhline(floor_true, color="gray", ls=":", lw=1, label="the measured true digits")
ax.set(xticks=pos, xticklabels=SOLVERS, ylabel="FD to the reference digits",
       title=f"FD of {pooled} pooled reconstructions (classifier features)")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
plt.tight_layout()
plt.show()

# %% [markdown]
# The benchmark (`benchmarks/samplers_mclc.py`) makes the comparison under the comparison rule
# (a weight grid for each side, validation digits pick, several seeds) on three tasks and two
# noise levels; this notebook shows one setting at one weight.
#
# ## Final check: the linear-Gaussian latent model
#
# Gaussian prior, linear decoder, linear measurement with Gaussian noise: the posterior is
# Gaussian and known. An ensemble of exact posterior draws moved along the level sets of the
# residual (spread and shifted in the null space of `A W`) returns to the posterior under the
# corrector with the retraction option (`constraint="tangent"`, the SNR rule with norms averaged
# over the chains), and no corrector step raises the residual of any chain. The published
# projection alone does not pass this check: each of its steps raises the residual to second
# order and the rises add up (`tests/samplers/test_mclc.py` measures it).

# %%
D = 4
lg = M.linear_gaussian_model(jax.random.key(0), D, 6, 2, 0.1)
_, _, y_lg = lg.sample_measurement(jax.random.key(100))
prob_lg = lg.problem(y_lg)
mean, cov = lg.posterior(y_lg, 0)
n = 2000 if FAST else 4000
zs = mean + jax.random.normal(jax.random.key(4), (n, D)) @ jnp.linalg.cholesky(cov).T
_, _, vt = np.linalg.svd(np.asarray(lg.operator_matrix @ lg.decoder_matrix))
null = jnp.asarray(vt[2:].T @ vt[2:], jnp.float32)
start = zs + 2.0 * (zs - mean) @ null + null @ jnp.full((D,), 1.5)


def corrector_run(keys, z):
    def step(z, k):
        # at t = 0 the variance rule's step is tiny: the SNR rule, norms averaged over chains
        z = jax.vmap(lambda kk, zz: M.mclc_correct(kk, zz, 0, prob_lg, step_rule="snr",
                                                   constraint="tangent",
                                                   axis_name="chains")[0],
                     axis_name="chains")(jax.random.split(k, z.shape[0]), z)
        r = jax.vmap(lambda zz: M.measurement_residual(prob_lg, zz, 0))(z)
        return z, r

    return jax.lax.scan(step, z, keys)


steps = 150 if FAST else 300
z_end, r_trace = jax.jit(corrector_run)(jax.random.split(jax.random.key(5), steps), start)
r0 = jax.vmap(lambda zz: M.measurement_residual(prob_lg, zz, 0))(start)
r_all = jnp.concatenate([r0[None], r_trace])
kl_start = M.gaussian_kl(start.mean(0), jnp.cov(start.T), mean, cov)
kl_end = M.gaussian_kl(z_end.mean(0), jnp.cov(z_end.T), mean, cov)
max_rise = float(jnp.max(r_all[1:] - r_all[:-1]))
print(f"KL(ensemble || posterior): {kl_start:.3f} -> {kl_end:.4f} after {steps} corrector "
      f"steps; largest one-step rise of a chain's residual: {max_rise:.2e}")
assert kl_end < 0.05 * kl_start
assert max_rise <= 1e-4 * (1 + float(jnp.linalg.norm(y_lg)))
print("checks passed")
