"""Drills against pods: ``KubernetesDrillTarget`` behind the drill runner's DrillTarget seam.

- :mod:`chaos.kube.manifests` pure: the deny-all NetworkPolicy of a region blackout and
  the Chaos Mesh objects (HTTPChaos, NetworkChaos) of injected faults
- :mod:`chaos.kube.target`    the target (every API call recorded) and
  ``KubernetesDrillRunner``, the runner that journals those calls; what it does, by
  :mod:`chaos.kube.pods` (pods listed and deleted), :mod:`chaos.kube.workloads`
  (workloads scaled, Service endpoints waited for), :mod:`chaos.kube.blackout` (the
  NetworkPolicy blackout) and :mod:`chaos.kube.chaos_mesh` (Chaos Mesh objects created
  and removed)

The drill's journal, measurements and verdict stay Tectonic's (chaos/drills/). Tested
against a stand-in API server (tests/kube_standin/), not a real cluster.
"""
