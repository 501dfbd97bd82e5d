"""Thin adapters between the engine and MLflow: no metric logic here."""
