"""The Compute port as requests to a compute executor in another process.

``compute`` (``RemoteCompute``, the port), ``codec`` (the request wire: ids, deadlines,
ordering keys, apply), ``bus`` (the delivery interface and an in-process bus), ``pubsub``
(the Pub/Sub topic and the executor's ordered subscription).
"""
