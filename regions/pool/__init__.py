"""The warm pool: one region's replicas kept COLD / WARM / ACTIVE / IDLE (README.md).

- :mod:`regions.pool.states`   pure: states, edges, dwell times, the moves (``Action``)
- :mod:`regions.pool.planner`  pure: the planner, ``plan`` (its phases in
  :mod:`regions.pool.plan_phases`, its loans in :mod:`regions.pool.lending`)
- :mod:`controlplane.kernel.pool.sizing` pure: WARM replicas for a burst, ``PoolSizeReport``
- :mod:`regions.pool.launchers` simulator / vLLM (GPU, CPU) launchers, static endpoints
- :mod:`regions.pool.client`   vLLM's admin HTTP API (sleep, wake + reset, probe)
- :mod:`regions.pool.snapshot` pure: ``PoolSnapshot``, the pool as its owner sees it
- :mod:`regions.pool.hooks`    pure: what the pool tells its owner (``PoolHooks``), and
  which of those hooks are off
- :mod:`regions.pool.manager`  ``WarmPool``, the adapter that does what the planner says

Nothing is imported here, so that importing the pure modules loads no I/O library.
"""
