"""fedrec-privacy Flower application: the wiring on top (ServerApp, ClientApp, simulation, the\nconfiguration reference generator). It is the only layer that loads strategies and clients."""
