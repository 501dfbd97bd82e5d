"""Helpers every layer may use: sentence and token splitting, fixed-width text tables."""
