"""Notebook views (HTML reprs) and plots."""
