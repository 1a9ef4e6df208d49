"""jaxlib_ext.samplers."""
