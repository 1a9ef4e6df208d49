"""Test problems for SOSMC and its baselines (arXiv 2601.22003): maximum marginal likelihood
(MMLE) in latent-variable models and reward tuning of energy-based models.

Each constructor returns a :class:`Problem`: the potential ``U(params, x)`` of one particle,
initial parameters, an exact sampler of initial particles from ``pi_{theta_0}``, a ``loss``
of the parameters (the objective to *minimise*, evaluated exactly or with fixed draws so that
methods are compared on the same yardstick), the ``objective_grad`` for the reward problems
(``None``: the default (G.1)), and a suggested move step size.

1. :func:`gaussian_mmle` -- ``x_i ~ N(theta, 1)``, ``y_i | x_i ~ N(x_i, 1)``, ``i = 1..n``::

       U_theta(x) = 1/2 sum_i (x_i - theta)^2 + 1/2 sum_i (y_i - x_i)^2
       -log p_theta(y) / n = mean_i (y_i - theta)^2 / 4 + log(4 pi) / 2,   theta* = mean(y)

2. :func:`ppca_mmle` -- probabilistic PCA (a linear-Gaussian factor model) on a standardised
   scikit-learn dataset (``wine``: 178 x 13 by default); latent ``z_n ~ N(0, I_k)``,
   ``y_n | z_n ~ N(W z_n + mu, psi I)``, ``theta = (W, mu, log psi)``, particle = all ``z``
   (shape ``(n, k)``)::

       U_theta(Z) = sum_n [ |z_n|^2 / 2 + |y_n - W z_n - mu|^2 / (2 psi) ] + n d/2 log(2 pi psi)
       -log p_theta(Y) / n = 1/2 [ d log 2 pi + log det C + tr(C^-1 S_mu) ],  C = W W^T + psi I

   with ``S_mu`` the scatter matrix about ``mu``; the optimum is Tipping & Bishop's closed form
   (``psi*`` = mean of the discarded eigenvalues of the sample covariance).

3. :func:`mixture2d_reward` -- a 2-D Gaussian mixture EBM whose parameters are the mixture
   logits (six components on a hexagon, after DeepMind's ``implicit_diffusion`` ``hex_mixture``
   toy used by the authors' notebooks), tuned to maximise
   ``J(theta) = E_pi[r] - lam KL(p_ref || pi_theta)`` with ``p_ref = pi_{theta_0}`` (uniform
   logits) and one of the toy rewards (``c`` a bump centre)::

       hard:       r(x) = 1[x_0 >= 0] exp(-|x - c|^2 / 20) / 2.5
       smooth:     r(x) = sigmoid(2 x_0) exp(-|x - c|^2 / 20) / 0.7
       multimodal: r(x) = max_j exp(-|x - c_j|^2 / 20) / 1.5

   The gates, the sigmoid's slope and the centres are this module's choice (the reference
   notebooks' constants could not be checked); the normalisers are the authors'.

4. :func:`digits_reward` -- an EBM on scikit-learn's 8x8 digits (pixels scaled to [0, 1]): a
   diagonal Gaussian mixture fitted by EM (``sklearn.mixture.GaussianMixture``), whose logits are
   tuned toward a classifier's probability of one digit (multinomial logistic regression fitted
   on the same data), with the KL penalty to the fitted model.

Losses of the reward problems: ``-J(theta)``, with ``E_pi[r] = sum_j p_j E_j[r]`` and
``KL(p_ref || pi_theta)`` estimated once per problem from fixed per-component draws (the same
draws for every method and every step).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.samplers.smc.objectives import reward_tuning_grad

__all__ = ["Problem", "digits_reward", "gaussian_mmle", "mixture2d_reward", "ppca_mmle",
           "REWARDS"]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One optimisation problem with an intractable gradient.

    Attributes:
      name: short name for tables.
      potential: ``U(params, x) -> scalar`` for one particle ``x``.
      params0: initial parameters ``theta_0``.
      sample_initial: ``(key, num_particles) -> particles``, exact draws from ``pi_{theta_0}``.
      loss: ``params -> scalar`` to minimise (exact, or with fixed draws).
      objective_grad: the gradient estimator for :func:`~.sosmc.sosmc` and the baselines, or
        ``None`` for the default (G.1).
      step_size: a move step size ``h`` suited to the problem's scale.
      step_size_bounds: ``(h_min, h_max)`` for SOSMC's step-size rule.
      optimum: the minimal loss where known in closed form, else ``None``.
      extra: problem-specific arrays (data, mixture parameters, reward function, ...).
    """

    name: str
    potential: Callable
    params0: Any
    sample_initial: Callable
    loss: Callable
    objective_grad: Callable | None
    step_size: float
    step_size_bounds: tuple[float, float]
    optimum: float | None
    extra: dict


def _check_positive_int(name, v, minimum=1):
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {v!r}")


# --------------------------------------------------------------------------- 1. Gaussian toy


def gaussian_mmle(y=None, *, key=None, num_data: int = 20, theta_true: float = 1.0,
                  theta0: float = 0.0) -> Problem:
    """The Gaussian MMLE toy (module docstring, 1).

    Args:
      y: the data (a finite 1-D array), or ``None`` to draw it from the model at ``theta_true``.
      key: PRNG key of the drawn data; ``None``: ``key(0)``.
      num_data: size of the drawn data, an int ``>= 1`` (used when ``y`` is ``None``).
      theta_true: parameter of the drawn data.
      theta0: the initial parameter.

    Returns:
      The :class:`Problem` ``"gaussian-mmle"``.

    Raises:
      ValueError: if ``y`` is not a finite non-empty 1-D array or ``num_data < 1``.
    """
    if y is None:
        _check_positive_int("num_data", num_data)
        key = jax.random.key(0) if key is None else key
        y = theta_true + jnp.sqrt(2.0) * jax.random.normal(key, (num_data,))
    y = jnp.asarray(y, jnp.float32)
    if y.ndim != 1 or y.shape[0] < 1 or not bool(jnp.all(jnp.isfinite(y))):
        raise ValueError(f"y: expected a finite 1-D array, got shape {y.shape}")
    n = y.shape[0]

    def potential(theta, x):
        return 0.5 * jnp.sum((x - theta) ** 2) + 0.5 * jnp.sum((y - x) ** 2)

    def sample_initial(key, num_particles):
        # x | y, theta ~ N((theta + y) / 2, 1/2) coordinatewise
        z = jax.random.normal(key, (num_particles, n))
        return (theta0 + y) / 2 + jnp.sqrt(0.5) * z

    def loss(theta):
        return jnp.mean((y - theta) ** 2) / 4 + 0.5 * math.log(4 * math.pi)

    theta_star = jnp.mean(y)
    return Problem("gaussian-mmle", potential, jnp.asarray(theta0, jnp.float32), sample_initial,
                   loss, None, 0.1, (1e-3, 0.99), float(loss(theta_star)),
                   {"y": y, "theta_star": theta_star})


# --------------------------------------------------------------------------- 2. PPCA


def _load_sklearn(dataset: str) -> np.ndarray:
    from sklearn import datasets

    loaders = {"wine": datasets.load_wine, "diabetes": datasets.load_diabetes,
               "breast_cancer": datasets.load_breast_cancer, "iris": datasets.load_iris}
    if dataset not in loaders:
        raise ValueError(f"dataset: expected one of {sorted(loaders)}, got {dataset!r}")
    x = loaders[dataset]().data.astype(np.float64)
    return (x - x.mean(0)) / x.std(0)


def ppca_mmle(dataset: str = "wine", *, latent_dim: int = 2, key=None) -> Problem:
    """PPCA maximum marginal likelihood on a standardised scikit-learn dataset.

    Module docstring, 2. ``theta_0``: ``W`` with N(0, 0.1^2) entries, ``mu = 0``, ``psi = 1``.

    Args:
      dataset: ``"wine"``, ``"diabetes"``, ``"breast_cancer"`` or ``"iris"``.
      latent_dim: ``k``, an int in ``[1, d)`` for data of dimension ``d``.
      key: PRNG key of the initial ``W``; ``None``: ``key(0)``.

    Returns:
      The :class:`Problem` ``"ppca-<dataset>"``.

    Raises:
      ValueError: for an unknown ``dataset`` or a ``latent_dim`` out of range.
    """
    y_np = _load_sklearn(dataset)
    n, d = y_np.shape
    _check_positive_int("latent_dim", latent_dim)
    if latent_dim >= d:
        raise ValueError(f"latent_dim: expected < {d} (the data dimension), got {latent_dim}")
    k = latent_dim
    y = jnp.asarray(y_np, jnp.float32)
    key = jax.random.key(0) if key is None else key
    params0 = {"W": 0.1 * jax.random.normal(key, (d, k)), "mu": jnp.zeros((d,)),
               "log_psi": jnp.zeros(())}

    def potential(params, z):
        psi = jnp.exp(params["log_psi"])
        r = y - z @ params["W"].T - params["mu"]
        return (0.5 * jnp.sum(z ** 2) + 0.5 * jnp.sum(r ** 2) / psi
                + 0.5 * n * d * (math.log(2 * math.pi) + params["log_psi"]))

    def posterior_sample(params, key, num_particles):
        w, psi = params["W"], jnp.exp(params["log_psi"])
        m = w.T @ w + psi * jnp.eye(k)
        minv = jnp.linalg.inv(m)
        mean = (y - params["mu"]) @ w @ minv  # (n, k)
        chol = jnp.linalg.cholesky(psi * minv)
        eps = jax.random.normal(key, (num_particles, n, k))
        return mean + eps @ chol.T

    def sample_initial(key, num_particles):
        return posterior_sample(params0, key, num_particles)

    def loss(params):
        w, psi = params["W"], jnp.exp(params["log_psi"])
        c = w @ w.T + psi * jnp.eye(d)
        r = y - params["mu"]
        s = r.T @ r / n
        _, logdet = jnp.linalg.slogdet(c)
        return 0.5 * (d * math.log(2 * math.pi) + logdet + jnp.trace(jnp.linalg.solve(c, s)))

    evals = np.sort(np.linalg.eigvalsh(np.cov(y_np.T, bias=True)))[::-1]
    psi_star = evals[k:].mean()
    opt = 0.5 * (d * math.log(2 * math.pi) + np.log(evals[:k]).sum()
                 + (d - k) * math.log(psi_star) + k + (d - k))
    return Problem(f"ppca-{dataset}", potential, params0, sample_initial, loss, None, 0.05,
                   (1e-3, 0.99), float(opt), {"y": y, "psi_star": float(psi_star)})


# --------------------------------------------------------------------------- mixtures


def _mixture_log_components(means, variances, x):
    """``log N(x; m_j, diag v_j)`` for every component, shape ``(K,)``."""
    d = x.shape[-1]
    return (-0.5 * jnp.sum((x - means) ** 2 / variances, -1)
            - 0.5 * jnp.sum(jnp.log(variances), -1) - 0.5 * d * math.log(2 * math.pi))


def _mixture_problem(name, means, variances, reward, kl_weight, *, num_eval_draws, step_size,
                     step_size_bounds, num_reference, extra):
    means = jnp.asarray(means, jnp.float32)
    variances = jnp.asarray(variances, jnp.float32)
    k, d = means.shape
    kl_weight = float(kl_weight)
    if not (kl_weight >= 0 and math.isfinite(kl_weight)):
        raise ValueError(f"kl_weight: expected a finite value >= 0, got {kl_weight}")
    params0 = jnp.zeros((k,), jnp.float32)

    def log_density(logits, x):
        return jax.nn.logsumexp(jax.nn.log_softmax(logits)
                                + _mixture_log_components(means, variances, x))

    def potential(logits, x):
        return -log_density(logits, x)

    def sample(logits, key, num):
        kc, kx = jax.random.split(key)
        comp = jax.random.categorical(kc, logits, shape=(num,))
        z = jax.random.normal(kx, (num, d))
        return means[comp] + jnp.sqrt(variances[comp]) * z

    def sample_initial(key, num_particles):
        return sample(params0, key, num_particles)

    def reference_sampler(key):
        return sample(params0, key, num_reference)

    # fixed per-component draws for the loss: (K, M, d)
    z = jax.random.normal(jax.random.key(12345), (k, num_eval_draws, d))
    draws = means[:, None] + jnp.sqrt(variances[:, None]) * z
    flat = draws.reshape(-1, d)
    comp_reward = jax.vmap(jax.vmap(reward))(draws).mean(1)  # E_j[r], (K,)
    log_comp = jax.vmap(lambda x: _mixture_log_components(means, variances, x))(flat)
    log_ref = jax.nn.logsumexp(jax.nn.log_softmax(params0) + log_comp, -1)

    def expected_reward(logits):
        return jnp.dot(jax.nn.softmax(logits), comp_reward)

    def kl_ref(logits):
        log_pi = jax.nn.logsumexp(jax.nn.log_softmax(logits) + log_comp, -1)
        return jnp.mean(log_ref - log_pi)  # p_ref uniform over components: all draws count 1/K

    def loss(logits):
        return -(expected_reward(logits) - kl_weight * kl_ref(logits))

    grad = reward_tuning_grad(potential, reward, kl_weight=kl_weight,
                              reference_sampler=reference_sampler)
    extra = dict(extra, means=means, variances=variances, reward=reward, sample=sample,
                 expected_reward=expected_reward, kl_ref=kl_ref, kl_weight=kl_weight,
                 log_density=log_density)
    return Problem(name, potential, params0, sample_initial, loss, grad, step_size,
                   step_size_bounds, None, extra)


def _bump(x, c):
    return jnp.exp(-jnp.sum((x - c) ** 2) / 20.0)


REWARDS = ("hard", "smooth", "multimodal")


def mixture2d_reward(reward: str = "hard", *, kl_weight: float = 0.1, radius: float = 3.0,
                     variance: float = 0.15, num_reference: int = 256,
                     num_eval_draws: int = 4096) -> Problem:
    """The 2-D mixture EBM with a toy reward (module docstring, 3).

    Components: ``radius`` (cos, sin)(j pi / 3), ``j = 0..5``, isotropic ``variance``; bump centre
    ``c = (radius, 0)`` (``multimodal``: also ``radius (cos, sin)(4 pi / 3)``).

    Args:
      reward: ``"hard"``, ``"smooth"`` or ``"multimodal"``.
      kl_weight: ``lam >= 0``, weight of the KL term to the initial model.
      radius: distance of the component means from the origin, ``> 0``.
      variance: the components' isotropic variance, ``> 0``.
      num_reference: reference draws per objective-gradient evaluation.
      num_eval_draws: fixed draws per component for the loss.

    Returns:
      The :class:`Problem` ``"mixture2d-<reward>"``.

    Raises:
      ValueError: for an unknown ``reward``, a non-positive ``radius`` or ``variance``, or a
        negative or non-finite ``kl_weight``.
    """
    if reward not in REWARDS:
        raise ValueError(f"reward: expected one of {REWARDS}, got {reward!r}")
    if not (radius > 0 and variance > 0):
        raise ValueError(f"radius, variance: expected positive values, got {radius}, {variance}")
    ang = jnp.arange(6) * math.pi / 3
    means = radius * jnp.stack([jnp.cos(ang), jnp.sin(ang)], -1)
    variances = jnp.full((6, 2), variance)
    c1 = jnp.array([radius, 0.0])
    c2 = radius * jnp.array([math.cos(4 * math.pi / 3), math.sin(4 * math.pi / 3)])

    if reward == "hard":
        def r(x):
            return jnp.where(x[0] >= 0, _bump(x, c1), 0.0) / 2.5
    elif reward == "smooth":
        def r(x):
            return jax.nn.sigmoid(2.0 * x[0]) * _bump(x, c1) / 0.7
    else:
        def r(x):
            return jnp.maximum(_bump(x, c1), _bump(x, c2)) / 1.5

    return _mixture_problem(f"mixture2d-{reward}", means, variances, r, kl_weight,
                            num_eval_draws=num_eval_draws, step_size=0.05,
                            step_size_bounds=(1e-3, 0.3), num_reference=num_reference,
                            extra={"reward_name": reward})


def digits_reward(target: int = 3, *, num_components: int = 20, kl_weight: float = 0.05,
                  min_variance: float = 0.02, num_reference: int = 256,
                  num_eval_draws: int = 256) -> Problem:
    """The digits EBM tuned toward a classifier's ``P(digit = target | x)`` (module docstring, 4).

    The mixture is fitted with ``GaussianMixture(num_components, covariance_type="diag",
    reg_covar=min_variance, random_state=0)``; the classifier is
    ``LogisticRegression(C=1.0, max_iter=2000)`` on all 1797 images (both deterministic).

    Args:
      target: the digit, an int in ``0..9``.
      num_components: mixture components, an int ``>= 2``.
      kl_weight: ``lam >= 0``, weight of the KL term to the fitted mixture.
      min_variance: ``reg_covar`` of the fit, ``> 0``.
      num_reference: reference draws per objective-gradient evaluation.
      num_eval_draws: fixed draws per component for the loss.

    Returns:
      The :class:`Problem` ``"digits-<target>"``.

    Raises:
      ValueError: for a bad ``target``, ``num_components``, ``min_variance`` or ``kl_weight``.
    """
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.mixture import GaussianMixture

    if isinstance(target, bool) or not isinstance(target, int) or not 0 <= target <= 9:
        raise ValueError(f"target: expected an int digit in 0..9, got {target!r}")
    _check_positive_int("num_components", num_components, 2)
    if not min_variance > 0:
        raise ValueError(f"min_variance: expected > 0, got {min_variance}")
    data = load_digits()
    x = data.data / 16.0
    gm = GaussianMixture(num_components, covariance_type="diag", reg_covar=min_variance,
                         random_state=0, max_iter=200).fit(x)
    clf = LogisticRegression(C=1.0, max_iter=2000).fit(x, data.target)
    w = jnp.asarray(clf.coef_, jnp.float32)
    b = jnp.asarray(clf.intercept_, jnp.float32)

    def r(xx):
        return jax.nn.softmax(w @ xx + b)[target]

    prob = _mixture_problem(f"digits-{target}", gm.means_, gm.covariances_, r, kl_weight,
                            num_eval_draws=num_eval_draws, step_size=0.003,
                            step_size_bounds=(1e-4, 0.01), num_reference=num_reference,
                            extra={"target": target, "fitted_logits": np.log(gm.weights_)})
    return prob
