"""jaxlib_ext.samplers.inverse: the pieces of image inverse problems that the energy prior
(:mod:`jaxlib_ext.samplers.energy`) and the latent solvers (:mod:`jaxlib_ext.samplers.mclc`)
share.

* :mod:`~jaxlib_ext.samplers.inverse.operators`: :class:`LinearOperator`, the one operator
  type with its adjoint; the degradations :func:`inpainting`, :func:`box_inpainting`,
  :func:`random_inpainting`, :func:`gaussian_blur`, :func:`motion_blur`, :func:`downsampling`;
  operators given by their maps (:func:`linear_operator`, :func:`as_linear_operator`); noisy
  measurements (:func:`measure`) and the dot-product test of an adjoint
  (:func:`check_adjoint`).
* :mod:`~jaxlib_ext.samplers.inverse.quality`: :func:`psnr`, :func:`ssim`, a reconstruction's
  quality against the truth; :func:`frechet_distance` (with :func:`gaussian_statistics` and
  :func:`frechet_distance_from_statistics`), the distance between two sets of image features.
* The variance-preserving diffusion of :mod:`jaxlib_ext.models.diffusion` (it lives with the
  models, which the latent diffusion model builds on; the names are the same objects):
  :class:`Schedule`, :func:`make_schedule`, :func:`linear_schedule`, :func:`alpha_bar`,
  Tweedie's :func:`predict_z0`, :func:`q_sample`, :func:`clip_eps`, :func:`ddim_step`,
  :func:`ancestral_step` and :func:`ddim_timesteps`.
"""

from jaxlib_ext.models.diffusion import (
    SCHEDULES,
    Schedule,
    alpha_bar,
    ancestral_step,
    clip_eps,
    ddim_step,
    ddim_timesteps,
    linear_schedule,
    make_schedule,
    predict_z0,
    q_sample,
)
from jaxlib_ext.samplers.inverse import operators, quality
from jaxlib_ext.samplers.inverse.operators import (
    BASES,
    LinearOperator,
    as_linear_operator,
    box_inpainting,
    check_adjoint,
    downsampling,
    fourier_transform,
    gaussian_blur,
    inpainting,
    inverse_fourier_transform,
    linear_operator,
    measure,
    motion_blur,
    random_inpainting,
)
from jaxlib_ext.samplers.inverse.quality import (
    frechet_distance,
    frechet_distance_from_statistics,
    gaussian_statistics,
    psnr,
    ssim,
)

__all__ = [
    "BASES",
    "SCHEDULES",
    "LinearOperator",
    "Schedule",
    "alpha_bar",
    "ancestral_step",
    "as_linear_operator",
    "box_inpainting",
    "check_adjoint",
    "clip_eps",
    "ddim_step",
    "ddim_timesteps",
    "downsampling",
    "fourier_transform",
    "frechet_distance",
    "frechet_distance_from_statistics",
    "gaussian_blur",
    "gaussian_statistics",
    "inpainting",
    "inverse_fourier_transform",
    "linear_operator",
    "linear_schedule",
    "make_schedule",
    "measure",
    "motion_blur",
    "operators",
    "predict_z0",
    "psnr",
    "q_sample",
    "quality",
    "random_inpainting",
    "ssim",
]
