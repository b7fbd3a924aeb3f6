"""Shipped as dpl.backends."""
