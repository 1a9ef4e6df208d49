"""jaxlib_ext.samplers.inverse: pieces shared by the image inverse-problem samplers.

* :func:`psnr`, :func:`ssim` (:mod:`~jaxlib_ext.samplers.inverse.quality`): a reconstruction's
  quality against the truth.
"""

from jaxlib_ext.samplers.inverse.quality import psnr, ssim

__all__ = ["psnr", "ssim"]
