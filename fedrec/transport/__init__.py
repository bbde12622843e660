"""The server side of the core: the push/poll loop over Flower's Grid, the aggregators that
form sums and the relays. Strategies use it; node code never does (docs/architecture.md)."""
