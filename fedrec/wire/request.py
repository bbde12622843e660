"""The records of a protocol's request and of Flower's stock messages, declared once for the
server (``strategies/base.py``: ``Federation.request``) and the node
(``clients/node.py``: ``NodeContext.arrays`` / ``NodeContext.config``).

A protocol request carries its named arrays in one ArrayRecord (:data:`ARRAYS`) and its
parameters in one ConfigRecord (:data:`CONFIG`, unless the protocol names its own). A stock
Flower strategy (``FedAvg``) sends the model in :data:`ARRAYS` and its config in
:data:`STOCK_CONFIG`, and reads the reply's :data:`METRICS`.
"""

from __future__ import annotations

#: ArrayRecord of a request's named arrays (also a stock Flower strategy's model record).
ARRAYS = "arrays"
#: ConfigRecord of a protocol request's parameters (``Federation.request``).
CONFIG = "protocol"
#: ConfigRecord a stock Flower strategy sends (``FedAvg``'s ``configrecord_key``).
STOCK_CONFIG = "config"
#: MetricRecord of a reply to a stock Flower train or evaluate message.
METRICS = "metrics"
#: Config field of a stock Flower strategy's config naming the protocol whose stock handler
#: answers (``clients/handlers.py``: ``train_handler``).
STOCK_PROTOCOL = "fedrec-protocol"
#: Flower's weighting key in a reply to a stock train or evaluate message.
NUM_EXAMPLES = "num-examples"
