"""Figures, tables and the HTML report."""
