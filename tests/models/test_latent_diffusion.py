"""models.latent_diffusion: the autoencoder on held-out MNIST digits, its DDIM and ancestral
samplers, checkpoints, bad input (the schedules and steps: tests/models/test_diffusion.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.core.images import load_mnist
from jaxlib_ext.models import latent_diffusion as ld

TINY = ld.LDMConfig(ae_channels=(8, 16, 32), unet_channels=8, timesteps=20)
AE_STEPS, AE_LR = 150, 3e-3
# Held-out per-pixel MSE ([-1, 1] pixels) of TINY after AE_STEPS autoencoder steps of 32 digits
# at AE_LR: measured 0.051 (the mean training image scores 0.27); bound with margin.
RECON_MSE_BOUND = 0.08


def _threefry():
    """The non-partitionable threefry for the runs trained here: the same distributions, other
    bits. ``train`` initialises its model eagerly, and the default (partitionable) threefry
    takes up to seconds of CPU compilation per 4-D kernel shape (about 14 s for TINY)."""
    return jax.threefry_partitionable(False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """TINY's autoencoder trained briefly on 2,000 MNIST digits (the noise model left at its
    initialisation: the sampler identities hold for any noise model), checkpointed."""
    out = tmp_path_factory.mktemp("ldm")
    x = load_mnist("train", value_range=(-1.0, 1.0), limit=2000).images
    with _threefry():
        model, info = ld.train(TINY, images=x, ae_steps=AE_STEPS, diffusion_steps=0,
                               batch_size=32, ae_lr=AE_LR, out=out, progress=False)
    return model, info, out


# --------------------------------------------------------------------------- trained model


def test_autoencoder_round_trips_held_out_digits(trained):
    model, info, _ = trained
    test = load_mnist("test", value_range=(-1.0, 1.0), limit=500).images
    z = ld.encode(model, test)
    assert z.shape == (500, 7, 7, 4)
    # latent_scale makes the training latents unit-variance
    assert 0.7 < float(jnp.std(z)) < 1.4
    recon = nnx.jit(lambda m, v: ld.decode(m, ld.encode(m, v)))(model, jnp.asarray(test))
    mse = float(jnp.mean((recon - test) ** 2))
    baseline = float(np.mean((test - test.mean(0)) ** 2))
    assert mse < RECON_MSE_BOUND and mse < 0.35 * baseline, (mse, baseline)


def test_sampling_shapes(trained):
    model, key = trained[0], jax.random.key(3)
    z, traj = ld.ddim_sample(model, key, 2, 5, return_trajectory=True)
    assert traj.shape == (5, 2, 7, 7, 4)
    np.testing.assert_array_equal(traj[-1], z)
    images = ld.sample_images(model, key, 2, 5)
    assert images.shape == (2, 28, 28, 1) and bool(jnp.all(jnp.isfinite(images)))
    eps = ld.eps_model(model, z, jnp.array([0, 19]))
    assert eps.shape == z.shape


@pytest.mark.slow
def test_ddim_over_every_step_with_eta_one_is_ancestral_sampling(trained):
    model, key = trained[0], jax.random.key(3)
    anc = ld.ancestral_sample(model, key, 3)
    ddim = ld.ddim_sample(model, key, 3, TINY.timesteps, eta=1.0)
    assert anc.shape == (3, 7, 7, 4)
    np.testing.assert_allclose(ddim, anc, atol=2e-4 * float(jnp.abs(anc).max()))


def test_checkpoint_is_reused(trained):
    model, info, out = trained
    loaded, meta = ld.load_or_train(out, TINY, ae_steps=AE_STEPS, diffusion_steps=0)
    assert meta["complete"] and meta["stage"] == "autoencoder"
    assert float(loaded.latent_scale[...]) == pytest.approx(info["latent_scale"], rel=1e-6)
    x = load_mnist("test", value_range=(-1.0, 1.0), limit=4).images
    np.testing.assert_allclose(ld.encode(loaded, x), ld.encode(model, x), atol=1e-5)
    with pytest.raises(ValueError, match="path"):
        ld.load_or_train(out, TINY, ae_steps=AE_STEPS + 1, diffusion_steps=0)


def test_a_run_stopped_in_its_autoencoder_stage_resumes_from_its_checkpoint(tmp_path,
                                                                              monkeypatch):
    """A stage stopped mid-way leaves only its own checkpoints: load_or_train resumes it and
    ends where an uninterrupted run does; another seed is refused."""
    with _threefry():  # every run below draws with the same implementation
        _stop_and_resume(tmp_path, monkeypatch)


def _stop_and_resume(tmp_path, monkeypatch):
    from jaxlib_ext.core import loop

    cfg = ld.LDMConfig(image_size=4, ae_channels=(4,), latent_channels=1, unet_channels=4,
                       unet_mults=(1,), timesteps=10)
    x = np.random.default_rng(0).uniform(-1, 1, (8, *cfg.image_shape)).astype(np.float32)
    kw = dict(images=x, ae_steps=4, diffusion_steps=3, batch_size=4, checkpoint_every=2,
              progress=False)
    want, _ = ld.train(cfg, **kw)
    run_loop = loop.run_loop

    def stopped_at_step_3(step_fn, state, batch_fn, config, **kwargs):
        def batch(step):
            if step == 3:
                raise KeyboardInterrupt
            return batch_fn(step)

        return run_loop(step_fn, state, batch, config, **kwargs)

    monkeypatch.setattr(loop, "run_loop", stopped_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        ld.train(cfg, out=tmp_path, **kw)
    monkeypatch.undo()
    assert not any(p.name.isdigit() for p in tmp_path.iterdir())  # no model checkpoint yet
    with pytest.raises(FileNotFoundError, match="autoencoder stage"):
        ld.load(tmp_path)
    with pytest.raises(ValueError, match="another run"):
        ld.load_or_train(tmp_path, cfg, **{**kw, "seed": 1})
    got, info = ld.load_or_train(tmp_path, cfg, **kw)
    assert info["complete"] and [r["step"] for r in info["ae_log"]] == [4]
    for a, b in zip(jax.tree.leaves(nnx.state(got)), jax.tree.leaves(nnx.state(want))):
        np.testing.assert_array_equal(a, b)
    loaded, meta = ld.load(tmp_path)
    assert meta["stage"] == "diffusion"
    for a, b in zip(jax.tree.leaves(nnx.state(loaded)), jax.tree.leaves(nnx.state(want))):
        np.testing.assert_array_equal(a, b)


def test_a_run_stopped_in_its_diffusion_stage_resumes_from_its_checkpoint(tmp_path,
                                                                          monkeypatch):
    """Stopped inside the diffusion stage, load_or_train resumes from that stage's last
    checkpoint (the autoencoder is not retrained) and ends where an uninterrupted run does."""
    with _threefry():
        from jaxlib_ext.core import loop

        cfg = ld.LDMConfig(image_size=4, ae_channels=(4,), latent_channels=1, unet_channels=4,
                           unet_mults=(1,), timesteps=10)
        x = np.random.default_rng(0).uniform(-1, 1, (8, *cfg.image_shape)).astype(np.float32)
        kw = dict(images=x, ae_steps=2, diffusion_steps=5, batch_size=4, checkpoint_every=2,
                  progress=False)
        want, _ = ld.train(cfg, **kw)
        run_loop, calls = loop.run_loop, []

        def stopped_in_the_second_stage(step_fn, state, batch_fn, config, **kwargs):
            calls.append(1)

            def batch(step):
                if len(calls) == 2 and step == 3:
                    raise KeyboardInterrupt
                return batch_fn(step)

            return run_loop(step_fn, state, batch, config, **kwargs)

        monkeypatch.setattr(loop, "run_loop", stopped_in_the_second_stage)
        with pytest.raises(KeyboardInterrupt):
            ld.train(cfg, out=tmp_path, **kw)
        monkeypatch.undo()
        calls.clear()
        monkeypatch.setattr(loop, "run_loop", stopped_in_the_second_stage)  # counts stages
        got, info = ld.load_or_train(tmp_path, cfg, **kw)
        monkeypatch.undo()
        assert info["complete"] and len(calls) == 1  # only the diffusion stage ran again
        for a, b in zip(jax.tree.leaves(nnx.state(got)), jax.tree.leaves(nnx.state(want))):
            np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- bad input


def test_bad_input(trained):
    model = trained[0]
    with pytest.raises(ValueError, match="x"):
        ld.encode(model, jnp.zeros((2, 28, 28)))
    with pytest.raises(ValueError, match="z"):
        ld.decode(model, jnp.zeros((2, 7, 7, 3)))
    with pytest.raises(TypeError, match="t"):
        ld.eps_model(model, jnp.zeros((2, 7, 7, 4)), jnp.zeros(2))
    with pytest.raises(ValueError, match="t"):
        ld.eps_model(model, jnp.zeros((2, 7, 7, 4)), jnp.zeros(3, jnp.int32))
    with pytest.raises(ValueError, match="steps"):
        ld.ddim_sample(model, jax.random.key(0), 2, 21)
    with pytest.raises(ValueError, match="eta"):
        ld.ddim_sample(model, jax.random.key(0), 2, 5, eta=1.5)
    with pytest.raises(ValueError, match="clip_z0"):
        ld.ddim_sample(model, jax.random.key(0), 2, 5, clip_z0=0.0)
    with pytest.raises(ValueError, match="n"):
        ld.ancestral_sample(model, jax.random.key(0), 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"image_size": 30}, "image_size"),
        ({"schedule": "quadratic"}, "schedule"),
        ({"timesteps": 0}, "timesteps"),
        ({"ae_channels": ()}, "ae_channels"),
        ({"kl_weight": -1.0}, "kl_weight"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ld.LDMConfig(**kwargs)


def test_bad_training_arguments():
    with pytest.raises(ValueError, match="ae_steps"):
        ld.train(TINY, ae_steps=-1)
    with pytest.raises(ValueError, match="images"):
        ld.train(TINY, images=np.zeros((4, 8, 8, 1)), ae_steps=1, diffusion_steps=0)


# --------------------------------------------------------------------------- sample quality


@pytest.mark.slow
def test_samples_cover_the_digits(tmp_path):
    """A short real training; a classifier fit in the test on the same digits labels the
    decoded samples: every digit appears and none dominates."""
    from sklearn.linear_model import LogisticRegression

    train = load_mnist("train", value_range=(-1.0, 1.0))
    model, _ = ld.train(ld.LDMConfig(), images=train.images, ae_steps=1000,
                        diffusion_steps=2500, out=tmp_path, progress=False)
    clf = LogisticRegression(max_iter=300).fit(train.images.reshape(len(train.images), -1),
                                               train.labels)
    samples = np.asarray(jnp.clip(ld.sample_images(model, jax.random.key(0), 500, 50), -1, 1))
    hist = np.bincount(clf.predict(samples.reshape(500, -1)), minlength=10) / 500
    assert (hist > 0.02).sum() >= 8 and hist.max() < 0.35, hist


@pytest.mark.slow
def test_a_run_stopped_after_its_autoencoder_is_resumed(trained, tmp_path):
    import shutil

    model, info, out = trained
    shutil.copytree(out, tmp_path / "run")
    resumed, meta = ld.load_or_train(tmp_path / "run", TINY, ae_steps=AE_STEPS, diffusion_steps=3,
                                     batch_size=8, progress=False)
    assert meta["complete"] and meta["stage"] == "diffusion"
    assert meta["ae_seconds"] == pytest.approx(info["ae_seconds"])
    x = load_mnist("test", value_range=(-1.0, 1.0), limit=4).images
    np.testing.assert_allclose(ld.encode(resumed, x), ld.encode(model, x), atol=1e-5)
    again, meta2 = ld.load_or_train(tmp_path / "run", TINY, ae_steps=AE_STEPS,
                                    diffusion_steps=3)
    assert meta2["stage"] == "diffusion"
    z = jnp.ones((1, 7, 7, 4))
    np.testing.assert_allclose(ld.eps_model(again, z, 5), ld.eps_model(resumed, z, 5), atol=1e-6)
