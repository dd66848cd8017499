"""Prefect flows (compose tasks only) and the `libra` CLI."""
