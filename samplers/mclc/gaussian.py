"""The linear-Gaussian latent model: a latent inverse problem whose posterior is closed-form.

Prior ``z_0 ~ N(m, S)`` in ``R^d``, linear decoder ``x = W z_0 + b`` in ``R^n``, measurement
``y = A x + sigma_y n`` in ``R^k``. Under the VP forward process (P.1), ``z_t ~ N(mu_t, C_t)``
with ``mu_t = sqrt(abar_t) m`` and ``C_t = abar_t S + (1 - abar_t) I``, so the exact
noise-prediction denoiser (the minimiser of the denoising loss, ``-sqrt(1 - abar_t)`` times the
score of ``p_t``) and Tweedie's estimate are affine::

    eps*(z, t)   = sqrt(1 - abar_t) C_t^{-1} (z - mu_t)                                   (G.1)
    zhat_0(z, t) = m + K_t (z - mu_t),   K_t = sqrt(abar_t) S C_t^{-1}                     (G.2)

:meth:`LinearGaussianLatentModel.posterior` gives, for ``t = None``, the exact posterior of
``z_0`` given ``y``; for a level ``t``, the law ``p_t(z) N(y; A D(zhat_0(z, t)), sigma_y^2 I)``
(the DPS surrogate posterior at level ``t``, the target the measurement-consistent corrector
works on), with ``H = A W K_t``::

    precision = C_t^{-1} + H^T H / sigma_y^2
    mean      = precision^{-1} (C_t^{-1} mu_t + H^T (y - c) / sigma_y^2),
    c         = A (W m + b) - H mu_t                                                      (G.3)

Every map here is affine, so the Gauss-Newton residual model of the corrector is exact.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.models.diffusion import linear_schedule
from jaxlib_ext.samplers.inverse.operators import LinearOperator, linear_operator
from jaxlib_ext.samplers.mclc.problem import LatentInverseProblem, latent_inverse_problem

__all__ = ["LinearGaussianLatentModel", "PCALatentPrior", "gaussian_kl", "linear_gaussian_model",
           "pca_latent_prior"]


class LinearGaussianLatentModel(NamedTuple):
    """Arrays of the model; methods give the denoiser (G.1), decoder, encoder (the pseudo-inverse
    of ``W``), operator, measurements, the problem and the posteriors (G.3).

    Attributes:
      prior_mean: ``(d,)`` ``m``.
      prior_cov: ``(d, d)`` ``S``.
      decoder_matrix: ``(n, d)`` ``W``.
      decoder_bias: ``(n,)`` ``b``.
      operator_matrix: ``(k, n)`` ``A``.
      noise_std: ``sigma_y``.
      alpha_bars: ``(T,)`` the VP schedule.
      prior_eigvals: ``(d,)`` eigenvalues of ``S``.
      prior_eigvecs: ``(d, d)`` its orthonormal eigenvectors (columns).
    """

    prior_mean: jax.Array  # (d,)
    prior_cov: jax.Array  # (d, d)
    decoder_matrix: jax.Array  # (n, d)
    decoder_bias: jax.Array  # (n,)
    operator_matrix: jax.Array  # (k, n)
    noise_std: float
    alpha_bars: jax.Array  # (T,)
    prior_eigvals: jax.Array  # (d,) eigenvalues of S
    prior_eigvecs: jax.Array  # (d, d) its orthonormal eigenvectors (columns)

    @property
    def latent_shape(self) -> tuple:
        """The shape of one latent, ``(d,)``."""
        return (self.prior_mean.shape[0],)

    def _level(self, alpha_bar):
        """``(mu_t, C_t, C_t^{-1})`` through the eigendecomposition of ``S``."""
        lam, q = self.prior_eigvals, self.prior_eigvecs
        c = alpha_bar * lam + (1.0 - alpha_bar)
        return (jnp.sqrt(alpha_bar) * self.prior_mean, (q * c) @ q.T, (q / c) @ q.T)

    def eps_model(self, z, t):
        """The exact noise-prediction denoiser (G.1).

        Args:
          z: one latent of shape ``(d,)``.
          t: int index into ``alpha_bars``.

        Returns:
          ``eps*(z, t)``, shape ``(d,)``.
        """
        ab = self.alpha_bars[t]
        mu, _, cov_inv = self._level(ab)
        return jnp.sqrt(1.0 - ab) * (cov_inv @ (z - mu))

    def decoder(self, z):
        """The linear decoder ``x = W z + b``.

        Args:
          z: ``(d,)`` a latent.

        Returns:
          ``(n,)`` the data point.
        """
        return self.decoder_matrix @ z + self.decoder_bias

    def encoder(self, x):
        """The pseudo-inverse of the decoder, ``W^+ (x - b)``.

        Args:
          x: ``(n,)`` a data point.

        Returns:
          ``(d,)`` the latent.
        """
        w = self.decoder_matrix
        return jnp.linalg.solve(w.T @ w, w.T @ (x - self.decoder_bias))  # W^+ (x - b)

    @property
    def operator(self) -> LinearOperator:
        """The measurement operator ``A`` as a
        :class:`~jaxlib_ext.samplers.inverse.LinearOperator`."""
        a = self.operator_matrix
        return linear_operator(lambda x: a @ x, lambda u: a.T @ u, name="operator_matrix")

    def sample_measurement(self, key):
        """A draw from the model.

        Args:
          key: PRNG key.

        Returns:
          ``(z_0, x, y)``: the latent, the data point and the noisy measurement.
        """
        k1, k2 = jax.random.split(key)
        chol = jnp.linalg.cholesky(self.prior_cov)
        z0 = self.prior_mean + chol @ jax.random.normal(k1, self.prior_mean.shape)
        x = self.decoder(z0)
        y = self.operator_matrix @ x + self.noise_std * jax.random.normal(
            k2, (self.operator_matrix.shape[0],))
        return z0, x, y

    def problem(self, y, *, check_operator: bool = True) -> LatentInverseProblem:
        """The :class:`LatentInverseProblem` of a measurement.

        Args:
          y: ``(k,)`` the measurement.
          check_operator: run the adjoint test of ``check_adjoint``.

        Returns:
          The problem, with the exact denoiser and the pseudo-inverse encoder.
        """
        return latent_inverse_problem(self.eps_model, self.decoder, self.operator, y,
                                      self.alpha_bars, latent_shape=self.latent_shape,
                                      encoder=self.encoder, check_operator=check_operator)

    def posterior(self, y, t=None):
        """The Gaussian (G.3): the exact posterior of ``z_0`` or the surrogate posterior at
        level ``t``.

        Args:
          y: ``(k,)`` the measurement.
          t: ``None`` for the exact posterior of ``z_0``, or an int level for ``p_t(z) N(y; A
            D(zhat_0(z, t)), sigma_y^2 I)``.

        Returns:
          ``(mean, cov)`` of shapes ``(d,)`` and ``(d, d)``.
        """
        ab = jnp.ones(()) if t is None else self.alpha_bars[t]
        mu, _, cov_inv = self._level(ab)
        gain = jnp.sqrt(ab) * self.prior_cov @ cov_inv  # K_t of (G.2)
        h = self.operator_matrix @ self.decoder_matrix @ gain
        c = self.operator_matrix @ (self.decoder_matrix @ self.prior_mean
                                    + self.decoder_bias) - h @ mu
        prec = cov_inv + h.T @ h / self.noise_std ** 2
        post_cov = jnp.linalg.inv(prec)
        post_mean = post_cov @ (cov_inv @ mu + h.T @ (y - c) / self.noise_std ** 2)
        return post_mean, 0.5 * (post_cov + post_cov.T)


def linear_gaussian_model(key, latent_dim: int = 4, data_dim: int = 6,
                          measurement_dim: int = 2, noise_std: float = 0.1,
                          num_train_steps: int = 1000, *,
                          orthonormal_pullback: bool = True) -> LinearGaussianLatentModel:
    """A random instance of the linear-Gaussian latent model.

    Prior mean ``N(0, 0.25 I)``, prior covariance with eigenvalues in ``[0.3, 2]``, ``W``
    Gaussian with ``1/sqrt(d)`` scale, the DDPM schedule
    (:func:`~jaxlib_ext.models.diffusion.linear_schedule`, betas from ``1e-4`` to ``0.02``).

    Args:
      key: PRNG key.
      latent_dim: ``d``.
      data_dim: ``n >= d``.
      measurement_dim: ``k``, ``1 <= k <= n``.
      noise_std: ``sigma_y > 0``.
      num_train_steps: ``T`` of the schedule.
      orthonormal_pullback: build ``A = R W^+`` with ``R`` of orthonormal rows, so that ``A W =
        R``: the residual's gradient then has the same norm everywhere on a level set (the
        co-area factor is constant at ``t = None``), the case where level-set Langevin preserves
        the posterior exactly in the small-step limit (needs ``k <= d``). Otherwise ``A`` is
        Gaussian.

    Returns:
      The :class:`LinearGaussianLatentModel`.

    Raises:
      ValueError: the dimensions or ``noise_std`` out of range.
    """
    if not 1 <= measurement_dim <= data_dim or latent_dim > data_dim or latent_dim < 1:
        raise ValueError(f"latent_dim, data_dim, measurement_dim: expected 1 <= latent_dim <= "
                         f"data_dim and 1 <= measurement_dim <= data_dim, got {latent_dim}, "
                         f"{data_dim}, {measurement_dim}")
    if not noise_std > 0:
        raise ValueError(f"noise_std: expected > 0, got {noise_std}")
    if orthonormal_pullback and measurement_dim > latent_dim:
        raise ValueError("measurement_dim: orthonormal_pullback needs measurement_dim <= "
                         f"latent_dim, got {measurement_dim} > {latent_dim}")
    ks = jax.random.split(key, 6)

    def normal(k, shape):
        return np.asarray(jax.random.normal(k, shape, jnp.float32), np.float64)

    q, _ = np.linalg.qr(normal(ks[0], (latent_dim, latent_dim)))
    cov = q @ np.diag(np.linspace(0.3, 2.0, latent_dim)) @ q.T
    mean = 0.5 * normal(ks[1], (latent_dim,))
    w = normal(ks[2], (data_dim, latent_dim)) / np.sqrt(latent_dim)
    b = 0.1 * normal(ks[3], (data_dim,))
    if orthonormal_pullback:
        r, _ = np.linalg.qr(normal(ks[4], (latent_dim, measurement_dim)))
        a = r.T @ np.linalg.pinv(w)
    else:
        a = normal(ks[5], (measurement_dim, data_dim)) / np.sqrt(data_dim)
    f = jnp.float32
    lam, vec = np.linalg.eigh(cov)
    return LinearGaussianLatentModel(jnp.asarray(mean, f), jnp.asarray(cov, f),
                                     jnp.asarray(w, f), jnp.asarray(b, f), jnp.asarray(a, f),
                                     float(noise_std),
                                     linear_schedule(num_train_steps).alphas_cumprod,
                                     jnp.asarray(lam, f), jnp.asarray(vec, f))


def gaussian_kl(mean0, cov0, mean1, cov1):
    """``KL(N(mean0, cov0) || N(mean1, cov1))`` in float64 NumPy.

    Args:
      mean0: ``(d,)``.
      cov0: ``(d, d)``.
      mean1: ``(d,)``.
      cov1: ``(d, d)``.

    Returns:
      The divergence (a float).
    """
    m0, s0 = np.asarray(mean0, np.float64), np.asarray(cov0, np.float64)
    m1, s1 = np.asarray(mean1, np.float64), np.asarray(cov1, np.float64)
    s1_inv = np.linalg.inv(s1)
    diff = m1 - m0
    _, ld0 = np.linalg.slogdet(s0)
    _, ld1 = np.linalg.slogdet(s1)
    return 0.5 * float(np.trace(s1_inv @ s0) + diff @ s1_inv @ diff - m0.shape[0] + ld1 - ld0)


class PCALatentPrior(NamedTuple):
    """A Gaussian latent prior on the leading principal components of a set of images.

    Latent ``z`` of shape ``(dim,)``, ``x = mean + V z`` (``V`` orthonormal columns), ``z ~ N(0,
    diag(variances))``; its exact denoiser is (G.1) with a diagonal ``S``. A latent diffusion
    model that needs no training, for quick experiments on real images.

    Attributes:
      mean: ``(H, W, C)`` the images' mean.
      basis: ``(H*W*C, dim)`` ``V``.
      variances: ``(dim,)`` the components' variances.
      alpha_bars: ``(T,)`` the VP schedule.
    """

    mean: jax.Array  # (H, W, C)
    basis: jax.Array  # (H*W*C, dim)
    variances: jax.Array  # (dim,)
    alpha_bars: jax.Array  # (T,)

    @property
    def latent_shape(self) -> tuple:
        """The shape of one latent, ``(dim,)``."""
        return (self.variances.shape[0],)

    def eps_model(self, z, t):
        """The exact denoiser (G.1) for one latent.

        Args:
          z: ``(dim,)`` a latent.
          t: int index into ``alpha_bars``.

        Returns:
          ``eps*(z, t)``, shape ``(dim,)``.
        """
        ab = self.alpha_bars[t]
        return jnp.sqrt(1.0 - ab) * z / (ab * self.variances + 1.0 - ab)

    def decoder(self, z):
        """``x = mean + V z``.

        Args:
          z: ``(dim,)`` a latent.

        Returns:
          ``(H, W, C)`` the image.
        """
        return self.mean + (self.basis @ z).reshape(self.mean.shape)

    def encoder(self, x):
        """``z = V^T (x - mean)``, the projection on the components.

        Args:
          x: ``(H, W, C)`` an image.

        Returns:
          ``(dim,)`` the latent.
        """
        return self.basis.T @ (x - self.mean).reshape(-1)


def pca_latent_prior(images, dim: int, num_train_steps: int = 1000) -> PCALatentPrior:
    """Fit :class:`PCALatentPrior` to images.

    Args:
      images: ``[N, H, W, C]``.
      dim: the number of components, ``1 <= dim < min(N, H*W*C)``.
      num_train_steps: ``T`` of the schedule
        (:func:`~jaxlib_ext.models.diffusion.linear_schedule`).

    Returns:
      The :class:`PCALatentPrior`.

    Raises:
      ValueError: ``images`` not 4-D or ``dim`` out of range.
    """
    images = np.asarray(images, np.float64)
    if images.ndim != 4:
        raise ValueError(f"images: expected [N, H, W, C], got shape {images.shape}")
    n = images.shape[0]
    if not 1 <= dim < min(n, images[0].size):
        raise ValueError(f"dim: expected 1 <= dim < min(N, H*W*C) = "
                         f"{min(n, images[0].size)}, got {dim}")
    x = images.reshape(n, -1)
    mean = x.mean(0)
    _, s, vt = np.linalg.svd(x - mean, full_matrices=False)
    f = jnp.float32
    return PCALatentPrior(jnp.asarray(mean.reshape(images.shape[1:]), f),
                          jnp.asarray(vt[:dim].T, f), jnp.asarray(s[:dim] ** 2 / (n - 1), f),
                          linear_schedule(num_train_steps).alphas_cumprod)
