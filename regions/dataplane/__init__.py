"""What the data plane shares: the gateway and the endpoint picker build on it (the
region agent on its prompts and ring), and it builds on none of them, only on the
kernel.

The core both run (``core``: built from ``options``, supervised as one):
``routing_cache``, ``pool_cache``, ``degradation_cache``, ``spec_watch`` and
``session_moves`` (the etcd watches), ``sessions`` (the pin cache and resolver in front
of the session store, fail-static), ``replicas`` with ``replica_cache``,
``replica_costs`` and ``replica_load`` (prefix-aware bounded-load replica choice and
what each replica bears), ``admission`` (a request's session, region and the ladder's
``actuators``), ``requests`` (validation), ``admission_gate`` with ``capacity_bounds``
(admission control, bounded by the measured capacity), ``report`` (health votes to the
control plane), ``observe`` and ``prefix_export`` (prefix tracking for pre-warm),
``metrics`` (the ``tectonic_gateway_*`` series) with ``failures`` (the error kinds it
counts and the forwarding's failure kinds, as types), ``off`` (the stand-ins of parts a
setting turns off), ``cli_common`` (the flags and process life both command lines
share).

Beneath them: the prompt characters that route a request (``prompts``) and the replica
ring (``ring``), which the region agent's pre-warm uses too, and admission control's
pure limiter and its bound (``admission_limit``, ``admission_bound``).
"""
