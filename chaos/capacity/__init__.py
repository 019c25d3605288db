"""The capacity probe: step-load one replica that is out of rotation and read what it
bears under its SLO (the model is ``controlplane.kernel.capacity.bearing``; the stored result
``controlplane.kernel.capacity.record.CapacityRecord``).

- ``workload``: requests shaped like a region's traffic (prompt lengths, shared
  prefixes for the warm workload, every prompt unique for the cold one), seeded;
- ``load``: an open-loop Poisson load generator of streaming chat completions;
- ``results``: what one request came to;
- ``stats``: what a step's requests say (p99, errors, throughput, recovery, waste);
- ``probe_config``: a probe's settings;
- ``steps``: one step at one rate; ``phases``: which rates a probe's steps run at
  (screening, saturation, sustained); ``recovery``: T_recover; ``pair``: the
  scaling efficiency; ``replica_watch`` and ``prefix_cache``: the replicas' ``/metrics``;
- ``probe``: the I/O loop around ``ProbePlan`` that returns a ``CapacityRecord``.

It never picks, wakes or parks a replica: it is given a URL.
"""
