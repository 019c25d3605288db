"""The warm pool: one region's replicas kept COLD / WARM / ACTIVE / IDLE (README.md).

- :mod:`regions.pool.states`   pure: states, edges, dwell times, the planner
- :mod:`regions.pool.sizing`   pure: WARM replicas needed for a burst, ``PoolSizeReport``
- :mod:`regions.pool.launchers` simulator / vLLM (GPU, CPU) launchers, static endpoints
- :mod:`regions.pool.client`   vLLM's admin HTTP API (sleep, wake + reset, probe)
- :mod:`regions.pool.manager`  ``WarmPool``, the adapter that does what the planner says

Nothing is imported here, so that importing the pure modules loads no I/O library.
"""
