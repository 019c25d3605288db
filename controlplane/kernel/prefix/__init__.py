"""Prompt prefixes: their identity as vLLM's prefix cache keys it (``identity``), the gateways'
tracker and its sketches (``tracker``, ``sketches``), the leader's catalog (``catalog``) and
the pre-warm's payloads and choice (``prewarm``)."""
