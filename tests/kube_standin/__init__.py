"""A STAND-IN for the Kubernetes API server, for the tests of regions/kube and chaos/kube.

This is not a kube-apiserver (none can run where these tests run: no package ships one,
and nothing can be downloaded). It is a small aiohttp server on 127.0.0.1 that speaks
the part of the API server's wire protocol Tectonic's adapters use, so that the real
client (``kubernetes-asyncio``) and the real adapters are exercised over real HTTP:

- list and watch of EndpointSlices and Pods: chunked JSON lines, ``resourceVersion``,
  BOOKMARK events (with ``allowWatchBookmarks``), ``timeoutSeconds``, a watch from a
  compacted version answered with an ERROR event of code 410 (or, ``gone_as_status``,
  an HTTP 410), and hooks for a test to drop the streams (now, or cutting the next
  event in the middle of its line);
- GET/PATCH ``deployments/NAME/scale`` and ``statefulsets/NAME/scale`` (a
  ``metadata.resourceVersion`` in the patch is a precondition: 409 when stale);
- PATCH pods (strategic-merge and JSON merge patches of maps: the two agree there),
  DELETE pods (``gracePeriodSeconds``), GET pods;
- create / delete / list NetworkPolicies (stored, never enforced: a CNI enforces them);
- API discovery for Chaos Mesh (``GET /apis/chaos-mesh.org/v1alpha1``: present or 404
  per stand-in) and its HTTPChaos / NetworkChaos objects (stored, never acted on);
- list HorizontalPodAutoscalers (``autoscaling/v2``) and KEDA ScaledObjects
  (``keda.sh/v1alpha1``) of a namespace (stored, never acted on): ``keda=False`` (the
  default) answers 404 for scaledobjects, as a cluster without KEDA's CRD does, and a
  plural in :attr:`StandIn.forbidden` answers 403, as RBAC does;
- every call recorded (:attr:`StandIn.calls`).

Every object it serves goes through ``kubernetes-asyncio``'s own models and
``ApiClient.sanitize_for_serialization`` (custom resources, which have no model, are
the dicts the client sent; a BOOKMARK's object is kind, apiVersion and metadata only, as a
real server's), so the JSON cannot drift from what the client parses.

It also plays the controllers the adapters rely on: a Deployment's ReplicaSet (scale
up creates pods; scale down removes the pods that rank first: not ready, then the
lowest ``controller.kubernetes.io/pod-deletion-cost``, then the newest; a deleted pod
is replaced), a StatefulSet (``name-0..N-1``; scale down removes the highest ordinal)
and the EndpointSlice controller (one slice per ``slice_size`` endpoints of a Service;
``ready`` = the pod is ready and not terminating, ``serving`` = ready, ``terminating``).
The "pods" are real simulators (``chaos.lab.procs.start_simulator``) on their own
127.0.0.x address and the stand-in's port, so whatever probes them speaks real HTTP;
``process=False`` workloads (a control plane, etcd) are pods with nothing behind them.

The server runs in a thread of its own with its own event loop, as a real API server is
another process: code that blocks on it from a test's loop (a drill target) does not
deadlock. Test-facing methods are ``async`` and run their work in that loop.

The package's modules: ``server`` (``StandIn``: its life, its routes, what tests call),
``core`` (its state, the recorder, serialization through the client's models, events),
``controllers`` (the pods' lives, the ReplicaSet / StatefulSet and EndpointSlice
controllers), ``watch`` (list and watch), ``handlers`` (pods, scale, NetworkPolicies,
Chaos Mesh, autoscalers) and ``records`` (the records it keeps, selectors, merge patches). Tests
import ``StandIn`` from ``tests.kube_standin.server``.
"""
