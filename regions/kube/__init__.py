"""Tectonic on Kubernetes: the adapters that talk to the API server (issue 19).

- :mod:`regions.kube.client`     an ``ApiClient`` from in-cluster config or a kubeconfig
- :mod:`regions.kube.endpoints`  pure: EndpointSlices folded into replica endpoints
- :mod:`regions.kube.workload`   pure: ``deployment/NAME`` / ``statefulset/NAME``
- :mod:`regions.kube.discovery`  ``EndpointSliceDiscovery``: list, watch, resume, relist
- :mod:`regions.kube.replicas`   the agent's view of discovered replicas (awake or asleep)
- :mod:`regions.kube.launcher`   ``KubernetesLauncher``: a warm pool scaling a workload
- :mod:`regions.kube.pod_labels` ``PodStateLabeler``: ``tectonic.io/pool-state`` on pods

Built on ``kubernetes-asyncio`` (generated from the Kubernetes OpenAPI spec). Tested
against a stand-in API server speaking the wire protocol (tests/kube_standin/), never
a real kube-apiserver: none can run where the tests run. Nothing is imported here, so
that importing the pure module loads no client library.
"""
