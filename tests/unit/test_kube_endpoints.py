"""The pure parts of the Kubernetes adapters, without any server: EndpointSlices folded
into endpoints (regions/kube/endpoints.py), the workload a pool scales, the pool-state
label, the leader's pod, and the objects a drill creates (chaos/kube/manifests.py).

The slices are kubernetes-asyncio's own models, as the client hands them over."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import (
    ApiClient,
    DiscoveryV1EndpointPort,
    V1Endpoint,
    V1EndpointConditions,
    V1EndpointSlice,
    V1ObjectMeta,
    V1ObjectReference,
)

from chaos.kube.manifests import FaultRefused, blackout_policy, chaos_objects, drill_selector
from chaos.kube.pods import leader_pod
from regions.kube.endpoints import (
    KubeEndpoint,
    PortNotFound,
    fold_slices,
    routable_urls,
    service_selector,
)
from regions.kube.pod_labels import POOL_STATE_LABEL, label_patch, pool_state_label
from regions.kube.workload import Workload
from regions.pool.states import ReplicaState


def endpoint(
    ip: str,
    pod: str | None = None,
    *,
    ready: bool | None = True,
    serving: bool | None = True,
    terminating: bool | None = False,
    zone: str | None = "z1",
    kind: str = "Pod",
) -> V1Endpoint:
    conditions = V1EndpointConditions(ready=ready, serving=serving, terminating=terminating)
    ref = V1ObjectReference(kind=kind, name=pod or f"pod-{ip}", namespace="models")
    return V1Endpoint(addresses=[ip], conditions=conditions, target_ref=ref, zone=zone)


def eslice(
    name: str,
    endpoints: list[V1Endpoint],
    ports: list[tuple[str | None, int]] | None = None,
    address_type: str = "IPv4",
) -> V1EndpointSlice:
    return V1EndpointSlice(
        address_type=address_type,
        metadata=V1ObjectMeta(name=name, labels={"kubernetes.io/service-name": "vllm"}),
        endpoints=endpoints,
        ports=[DiscoveryV1EndpointPort(name=n, port=p) for n, p in (ports or [("http", 8000)])],
    )


def test_an_endpoint_carries_address_port_conditions_pod_and_zone() -> None:
    (e,) = fold_slices([eslice("s1", [endpoint("10.0.0.5", "vllm-abc")])], port_name="http")
    assert e == KubeEndpoint(
        address="10.0.0.5",
        port=8000,
        ready=True,
        serving=True,
        terminating=False,
        pod="vllm-abc",
        pod_namespace="models",
        zone="z1",
        slice="s1",
    )
    assert e.url == "http://10.0.0.5:8000" and e.routable


def test_nil_conditions_read_as_the_api_says() -> None:
    # ready nil: true; serving nil: true; terminating nil: false
    no_conditions = V1Endpoint(addresses=["10.0.0.1"])
    (e,) = fold_slices([eslice("s", [no_conditions])])
    assert (e.ready, e.serving, e.terminating, e.routable) == (True, True, False, True)
    assert e.pod is None  # no targetRef


def test_serving_but_terminating_is_listed_and_never_routed() -> None:
    draining = endpoint("10.0.0.2", ready=False, serving=True, terminating=True)
    starting = endpoint("10.0.0.3", ready=False, serving=False, terminating=False)
    fine = endpoint("10.0.0.4")
    eps = fold_slices([eslice("s", [draining, starting, fine])])
    assert [e.address for e in eps] == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert routable_urls(eps) == ["http://10.0.0.4:8000"]
    # a controller that left ready true on a terminating endpoint: still not routed
    odd = endpoint("10.0.0.9", ready=True, terminating=True)
    assert routable_urls(fold_slices([eslice("s", [odd])])) == []


def test_the_port_is_chosen_by_name_by_number_or_as_the_only_one() -> None:
    two = [("http", 8000), ("metrics", 9090)]
    s = eslice("s", [endpoint("10.0.0.1")], ports=two)
    assert fold_slices([s], port_name="metrics")[0].port == 9090
    assert fold_slices([s], port=8000)[0].port == 8000
    with pytest.raises(PortNotFound, match="several ports"):
        fold_slices([s])
    with pytest.raises(PortNotFound, match="no port named 'grpc'"):
        fold_slices([s], port_name="grpc")
    with pytest.raises(PortNotFound, match="no port 1234"):
        fold_slices([s], port=1234)
    only = eslice("s", [endpoint("10.0.0.1")], ports=[(None, 8000)])
    assert fold_slices([only])[0].port == 8000
    # a slice with no ports (a Service with no matching pods) lists nothing
    empty = V1EndpointSlice(address_type="IPv4", metadata=V1ObjectMeta(name="e"), endpoints=[])
    assert fold_slices([empty], port_name="http") == ()


def test_an_endpoint_in_two_slices_is_taken_once_from_where_it_is_routable() -> None:
    moving_old = eslice("a", [endpoint("10.0.0.7", ready=False, serving=False)])
    moving_new = eslice("b", [endpoint("10.0.0.7"), endpoint("10.0.0.8")])
    one = fold_slices([moving_old, moving_new])
    other = fold_slices([moving_new, moving_old])
    assert one == other  # the order slices arrive in does not matter
    assert [(e.address, e.routable, e.slice) for e in one] == [
        ("10.0.0.7", True, "b"),
        ("10.0.0.8", True, "b"),
    ]


def test_fqdn_slices_ipv6_addresses_and_other_target_kinds() -> None:
    fqdn = eslice("f", [endpoint("vllm.example.com")], address_type="FQDN")
    v6 = eslice("v6", [endpoint("fd00::5")], address_type="IPv6")
    node = eslice("n", [endpoint("10.0.0.1", "node-1", kind="Node")])
    eps = fold_slices([fqdn, v6, node])
    assert [e.url for e in eps] == ["http://10.0.0.1:8000", "http://[fd00::5]:8000"]
    assert eps[0].pod is None  # a targetRef that is not a pod names no pod


def test_a_slice_from_json_folds_the_same_as_the_model() -> None:
    # what the client deserializes from the wire is what the fold reads
    api = ApiClient.__new__(ApiClient)  # the serializer only: no session
    s = eslice("s", [endpoint("10.0.0.5", "vllm-abc", serving=None)])
    raw = ApiClient.sanitize_for_serialization(api, s)
    assert raw["endpoints"][0]["targetRef"]["name"] == "vllm-abc"
    assert "serving" not in raw["endpoints"][0]["conditions"]


def test_service_selector() -> None:
    assert service_selector("vllm-eu") == "kubernetes.io/service-name=vllm-eu"


def test_a_workload_is_kind_slash_name() -> None:
    assert Workload.parse("deployment/vllm-eu", "models") == Workload(
        "deployment", "vllm-eu", "models"
    )
    assert Workload.parse("sts/etcd", "t").kind == "statefulset"
    assert str(Workload.parse("deploy/x", "ns")) == "deployment/x in namespace ns"
    for bad in ("vllm", "pod/x", "deployment/", "deployment/Upper", "deployment/a/b"):
        with pytest.raises(ValueError, match="deployment/NAME or statefulset/NAME"):
            Workload.parse(bad, "ns")


def test_pool_states_become_a_label_and_cold_removes_it() -> None:
    assert [pool_state_label(s) for s in ReplicaState] == [None, "warm", "active", "idle", "lent"]
    assert label_patch("active") == {"metadata": {"labels": {POOL_STATE_LABEL: "active"}}}
    assert label_patch(None) == {"metadata": {"labels": {POOL_STATE_LABEL: None}}}


def test_the_leaders_pod_is_its_id_or_its_id_less_the_pid() -> None:
    pods = ["tectonic-cp-0", "tectonic-cp-1"]
    assert leader_pod("tectonic-cp-1", pods) == "tectonic-cp-1"  # --id=$(POD_NAME)
    assert leader_pod("tectonic-cp-0-7", pods) == "tectonic-cp-0"  # the default host-pid
    assert leader_pod("tectonic-cp-2-7", pods) is None
    assert leader_pod("laptop-99", pods) is None


def test_a_blackout_policy_denies_everything_to_and_from_the_regions_pods() -> None:
    policy = blackout_policy("us-east", "models", {"tectonic.io/region": "us-east"})
    raw = ApiClient.sanitize_for_serialization(ApiClient.__new__(ApiClient), policy)
    assert raw["metadata"]["name"] == "tectonic-blackout-us-east"
    assert raw["spec"] == {
        "podSelector": {"matchLabels": {"tectonic.io/region": "us-east"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [],
    }
    assert drill_selector("us-east") == "tectonic.io/drill-region=us-east"
    assert raw["metadata"]["labels"]["tectonic.io/drill-region"] == "us-east"


def test_faults_become_chaos_mesh_objects() -> None:
    labels = {"tectonic.io/region": "eu"}
    (latency,) = chaos_objects("eu", "models", labels, {"added_latency_s": 1.5}, pods=2, port=8000)
    assert latency.plural == "httpchaos"
    spec = latency.body["spec"]
    assert spec["delay"] == "1500ms" and spec["target"] == "Request" and spec["port"] == 8000
    assert spec["mode"] == "all" and spec["duration"] == "600s"
    assert spec["selector"] == {"namespaces": ["models"], "labelSelectors": labels}
    (storm,) = chaos_objects("eu", "models", labels, {"unavailable_rate": 0.35}, pods=4, port=8000)
    assert storm.body["spec"]["replace"] == {"code": 503}
    assert (storm.body["spec"]["mode"], storm.body["spec"]["value"]) == ("fixed", "2")
    assert "whole pods, not a share of requests" in storm.note
    hang, health = sorted(
        chaos_objects("eu", "m", labels, {"hang": True, "health_down": True}, pods=1, port=1),
        key=lambda o: o.plural,
        reverse=True,
    )
    assert hang.plural == "networkchaos" and hang.body["spec"]["action"] == "loss"
    assert health.body["spec"]["path"] == "/health"


def test_a_fault_without_a_chaos_mesh_counterpart_is_refused() -> None:
    with pytest.raises(FaultRefused, match="stream_error_after"):
        chaos_objects("eu", "m", {}, {"stream_error_after": 3}, pods=1, port=1)
    with pytest.raises(FaultRefused, match="injects nothing"):
        chaos_objects("eu", "m", {}, {"error_rate": 0.0}, pods=1, port=1)
