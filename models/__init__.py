"""jaxlib_ext.models."""
