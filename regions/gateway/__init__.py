"""The gateway: an OpenAI-compatible reverse proxy with sticky sessions across regions.

Modules: ``app`` (HTTP handlers), ``server`` (lifecycle), ``routing_cache`` (routing
from one etcd watch), ``sessions`` (pin cache in front of the session store, fail-
static), ``replicas`` (prefix-aware bounded-load hashing), ``proxy`` (forwarding,
streaming, retries), ``requests`` (validation), ``metrics``, ``observe`` (the prefix
hook for pre-warm). Run it with ``python -m regions.gateway``.
"""
