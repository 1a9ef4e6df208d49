"""Gated delta rule op (placeholder until the op lands)."""
