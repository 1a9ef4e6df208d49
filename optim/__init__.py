"""jaxlib_ext.optim."""
