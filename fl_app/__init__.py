"""fedrec-privacy Flower application: wiring (server/client apps, messaging) and the shared core."""
