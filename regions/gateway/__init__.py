"""The gateway: an OpenAI-compatible reverse proxy with sticky sessions across regions.

It runs the data plane's core (``regions/dataplane/``: routing, pins, replica choice,
admission, actuators, prefix tracking, which the endpoint picker runs too) and adds
what only it does, forwarding. Modules: ``app`` (HTTP handlers), ``server``
(lifecycle), ``proxy`` (forwarding, streaming, retries), ``upstream`` and ``http1``
(the HTTP/1.1 client to the replicas), ``resume`` and ``continuation`` (continuing a
stream cut mid-way), ``warmth`` and ``prompt_memory`` (warm first), ``metrics`` and
``options`` (the data plane's, extended). Run it with ``python -m regions.gateway``.
"""
