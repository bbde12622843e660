"""Benchmarks that reproduce the project's measurements into ``results/``."""
