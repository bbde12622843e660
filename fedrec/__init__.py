"""fedrec-privacy's core library: what every protocol's two sides build on.

- ``config``, ``records``, ``protocols``: run-config keys, Flower record helpers, the protocol
  table (by import path only).
- ``wire``: what travels, declared once for both sides.
- ``secure``: crypto (masks, fixed point, keys, sealing, identities, HE, SecAgg+ math).
- ``dp``: DP mechanisms and accounting.
- ``recsys``: the recommendation math and metrics.
- ``results``: a run's results file.
- ``transport``: the server side only (push/poll loop, aggregators, relays); a node never
  imports it.

The layers are a contract checked by import-linter (``pyproject.toml``, docs/architecture.md).
"""
