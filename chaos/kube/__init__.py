"""Drills against pods: ``KubernetesDrillTarget`` behind the drill runner's DrillTarget seam.

- :mod:`chaos.kube.manifests` pure: the deny-all NetworkPolicy of a region blackout and
  the Chaos Mesh objects (HTTPChaos, NetworkChaos) of injected faults
- :mod:`chaos.kube.target`    the target (pods deleted, workloads scaled, policies and
  Chaos Mesh objects created and removed, every API call recorded) and
  ``KubernetesDrillRunner``, the runner that journals those calls

The drill's journal, measurements and verdict stay Tectonic's (chaos/drills/). Tested
against a stand-in API server (tests/kube_standin.py), not a real cluster.
"""
