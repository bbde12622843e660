"""Deployment helpers: certificates and a local SuperLink + SuperNodes launcher (docs/deployment.md)."""
