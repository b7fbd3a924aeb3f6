"""Shipped as dpl.grammar."""
