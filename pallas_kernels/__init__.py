"""jaxlib_ext.pallas_kernels."""
