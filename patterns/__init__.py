"""Shipped as dpl.patterns."""
