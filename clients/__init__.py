"""Client side of every protocol: handlers a node runs on its own rows when a request arrives.

Each module registers its handlers with :func:`clients.handlers.handler`; the ClientApp
(``fl_app.client_app``) exposes every registered handler as a Flower ``query.<action>``.
"""
