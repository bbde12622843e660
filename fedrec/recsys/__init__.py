"""Recommendation models and metrics for fedrec-privacy."""
