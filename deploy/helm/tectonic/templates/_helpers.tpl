{{/* Names: Kubernetes object names are DNS labels, at most 63 characters. */}}
{{- define "tectonic.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tectonic.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<fullname>-<suffix>", cut to 63 characters: (dict "root" $ "suffix" "agent-eu") */}}
{{- define "tectonic.componentName" -}}
{{- printf "%s-%s" (include "tectonic.fullname" .root) .suffix | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tectonic.labels" -}}
app.kubernetes.io/name: {{ include "tectonic.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "tectonic.commonMeta" . }}
{{- end }}

{{/* The labels of every object but the selector's (pod templates add those). */}}
{{- define "tectonic.commonMeta" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tectonic
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "agent" "region" "eu");
region is optional. Selectors are immutable, so these never change between versions. */}}
{{- define "tectonic.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tectonic.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if .region }}
tectonic.io/region: {{ .region }}
{{- end }}
{{- end }}

{{/* An image reference: (dict "image" .Values.x.image "default" tag); digest wins. */}}
{{- define "tectonic.imageRef" -}}
{{- if .image.digest -}}
{{ .image.repository }}@{{ .image.digest }}
{{- else -}}
{{ .image.repository }}:{{ default .default .image.tag }}
{{- end }}
{{- end }}

{{- define "tectonic.image" -}}
{{ include "tectonic.imageRef" (dict "image" .Values.image "default" .Chart.AppVersion) }}
{{- end }}

{{/* The pod-level fields every pod of the chart shares. */}}
{{- define "tectonic.podCommon" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The pod template's annotations: the chart's own (lines of "key: value", such as the
topology checksum) over the component's podAnnotations over the global podAnnotations;
nothing when there are none:
(dict "root" $ "component" .Values.gateway "own" (include "tectonic.topologyChecksum" $)) */}}
{{- define "tectonic.podAnnotations" -}}
{{- $own := default dict (fromYaml (default "" .own)) }}
{{- $all := merge $own (deepCopy (default dict .component.podAnnotations)) (deepCopy (default dict .root.Values.podAnnotations)) }}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A pod's priorityClassName and topologySpreadConstraints: the component's, else the
global ones. A constraint without a labelSelector gets the pod's own selector labels, so
that a global constraint spreads each component's (and region's) pods by themselves:
(dict "root" $ "component" .Values.gateway "sel" $sel) */}}
{{- define "tectonic.podPlacement" -}}
{{- with default .root.Values.priorityClassName .component.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- $constraints := list }}
{{- range default .root.Values.topologySpreadConstraints .component.topologySpreadConstraints }}
{{- $c := deepCopy . }}
{{- if not $c.labelSelector }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (include "tectonic.selectorLabels" $.sel | fromYaml)) }}
{{- end }}
{{- $constraints = append $constraints $c }}
{{- end }}
{{- with $constraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The Deployment's replicas, unless its HorizontalPodAutoscaler owns them:
(dict "component" .Values.gateway "field" "gateway") */}}
{{- define "tectonic.replicas" -}}
{{- if .component.autoscaling.enabled -}}
# No replicas: the HorizontalPodAutoscaler ({{ .field }}.autoscaling) owns them, and an
# upgrade that set them would undo its scaling.
{{- else -}}
replicas: {{ .component.replicas }}
{{- end }}
{{- end }}

{{/* An autoscaling/v2 HorizontalPodAutoscaler on CPU for one Deployment, when the
component's autoscaling is enabled:
(dict "root" $ "component" .Values.gateway "field" "gateway" "name" $name "region" "us-east") */}}
{{- define "tectonic.hpa" -}}
{{- $as := .component.autoscaling }}
{{- if $as.enabled }}
{{- if gt (int $as.minReplicas) (int $as.maxReplicas) }}
{{- fail (printf "%s.autoscaling.minReplicas (%d) must be at most maxReplicas (%d)" .field (int $as.minReplicas) (int $as.maxReplicas)) }}
{{- end }}
{{- if not (and .component.resources .component.resources.requests .component.resources.requests.cpu) }}
{{- fail (printf "%s.autoscaling: the HorizontalPodAutoscaler scales on CPU utilization of the request; set %s.resources.requests.cpu" .field .field) }}
{{- end }}
---
# {{ .field }}.autoscaling: CPU utilization of {{ .field }}.resources.requests.cpu,
# averaged over the Deployment's pods, sizes it between minReplicas and maxReplicas.
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "tectonic.labels" .root | nindent 4 }}
    app.kubernetes.io/component: {{ .field }}
    tectonic.io/region: {{ .region }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ .name }}
  minReplicas: {{ $as.minReplicas }}
  maxReplicas: {{ $as.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ $as.targetCPUUtilizationPercentage }}
{{- end }}
{{- end }}

{{- define "tectonic.containerSecurity" -}}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
{{- end }}

{{/* Soft or hard anti-affinity over nodes among one component's pods:
(dict "root" $ "component" "controlplane" "region" "" "mode" "soft") */}}
{{- define "tectonic.antiAffinity" -}}
podAntiAffinity:
  {{- if eq .mode "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "tectonic.selectorLabels" . | nindent 10 }}
  {{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "tectonic.selectorLabels" . | nindent 12 }}
  {{- end }}
{{- end }}

{{/* ---- etcd ------------------------------------------------------------------------- */}}
{{- define "tectonic.etcdName" -}}
{{ include "tectonic.componentName" (dict "root" . "suffix" "etcd") }}
{{- end }}

{{/* The etcd endpoints as a JSON list (fromJsonArray reads it back). */}}
{{- define "tectonic.etcdEndpoints" -}}
{{- if eq .Values.etcd.mode "bundled" }}
{{- $name := include "tectonic.etcdName" . }}
{{- $eps := list }}
{{- range $i := until (int .Values.etcd.bundled.replicas) }}
{{- $eps = append $eps (printf "%s-%d.%s.%s.svc:2379" $name $i $name $.Release.Namespace) }}
{{- end }}
{{- toJson $eps }}
{{- else if .Values.etcd.external.endpoints }}
{{- toJson .Values.etcd.external.endpoints }}
{{- else }}
{{- fail "etcd.external.endpoints is required (host:port of your etcd members), or set etcd.mode: bundled (a small etcd of this chart, for trials and single-cluster installs; see docs/kubernetes.md)" }}
{{- end }}
{{- end }}

{{- define "tectonic.etcdTlsDir" -}}/etc/tectonic/etcd-tls{{- end }}
{{- define "tectonic.etcdAuthDir" -}}/etc/tectonic/etcd-auth{{- end }}

{{/* The topology's etcd section, built from .Values.etcd. */}}
{{- define "tectonic.etcdSection" -}}
{{- $e := dict "endpoints" (include "tectonic.etcdEndpoints" . | fromJsonArray) "request_timeout_s" .Values.etcd.requestTimeoutS }}
{{- if .Values.etcd.tls.enabled }}
{{- $dir := include "tectonic.etcdTlsDir" . }}
{{- $_ := set $e "ca" (printf "%s/ca.crt" $dir) }}
{{- if .Values.etcd.tls.clientCert }}
{{- $_ := set $e "cert" (printf "%s/tls.crt" $dir) }}
{{- $_ := set $e "key" (printf "%s/tls.key" $dir) }}
{{- end }}
{{- with .Values.etcd.tls.serverName }}
{{- $_ := set $e "server_name" . }}
{{- end }}
{{- end }}
{{- if .Values.etcd.auth.user }}
{{- $_ := set $e "user" .Values.etcd.auth.user }}
{{- $_ := set $e "password_file" (printf "%s/password" (include "tectonic.etcdAuthDir" .)) }}
{{- end }}
{{- toYaml $e }}
{{- end }}

{{/* ---- addresses ---------------------------------------------------------------------- */}}
{{- define "tectonic.agentName" -}}
{{ include "tectonic.componentName" (dict "root" .root "suffix" (printf "agent-%s" .region)) }}
{{- end }}

{{- define "tectonic.controlPlaneName" -}}
{{ include "tectonic.componentName" (dict "root" . "suffix" "controlplane") }}
{{- end }}

{{/* host:port[,...] of the control planes this release's agents and data plane report to. */}}
{{- define "tectonic.controlPlaneAddresses" -}}
{{- if .Values.controlPlane.addresses }}
{{- .Values.controlPlane.addresses }}
{{- else if .Values.controlPlane.enabled }}
{{- printf "%s.%s.svc:50051" (include "tectonic.controlPlaneName" .) .Release.Namespace }}
{{- else }}
{{- fail "controlPlane.addresses: set it (host:port of the control planes) when controlPlane.enabled is false" }}
{{- end }}
{{- end }}

{{/* The failover units of this cluster's regions (.Values.regions), as a JSON list: a
region without model pools is one; a region whose topology entry has pools
(docs/models.md) is one per pool. Each is a region entry as .Values.regions has them
(discovery, modelSelector, pool: the warm pool), a pool's from regions[].pools.<pool>,
with: name (Kubernetes names and the tectonic.io/region label: <region> or
<region>-<pool>), unit (the topology's name: <region> or <region>.<pool>), site (the
region), modelPool (the pool's name, "" without pools) and models (its model names). */}}
{{- define "tectonic.localUnits" -}}
{{- $units := list }}
{{- range $r := .Values.regions }}
{{- $pools := list }}
{{- range $t := $.Values.topology.regions }}
{{- if eq $t.name $r.name }}
{{- $pools = default list $t.pools }}
{{- end }}
{{- end }}
{{- if $pools }}
{{- range $p := $pools }}
{{- $local := default dict (get (default dict $r.pools) $p.name) }}
{{- $unit := deepCopy $local }}
{{- $_ := set $unit "name" (printf "%s-%s" $r.name $p.name) }}
{{- $_ := set $unit "unit" (printf "%s.%s" $r.name $p.name) }}
{{- $_ := set $unit "site" $r.name }}
{{- $_ := set $unit "modelPool" $p.name }}
{{- $_ := set $unit "models" $p.models }}
{{- $units = append $units $unit }}
{{- end }}
{{- else }}
{{- $unit := omit (deepCopy $r) "pools" }}
{{- $_ := set $unit "unit" $r.name }}
{{- $_ := set $unit "site" $r.name }}
{{- $_ := set $unit "modelPool" "" }}
{{- $_ := set $unit "models" list }}
{{- $units = append $units $unit }}
{{- end }}
{{- end }}
{{- toJson $units }}
{{- end }}

{{/* The model-server workload and Service of a local region: (dict "root" $ "region" r) */}}
{{- define "tectonic.modelServerName" -}}
{{ include "tectonic.componentName" (dict "root" .root "suffix" (printf "vllm-%s" .region.name)) }}
{{- end }}

{{- define "tectonic.discoveryService" -}}
{{- if .root.Values.modelServer.enabled }}
{{- include "tectonic.modelServerName" . }}
{{- else if and .region.discovery .region.discovery.service }}
{{- .region.discovery.service }}
{{- else }}
{{- fail (printf "regions[%s].discovery.service: name the Service that selects the region's model pods (or set modelServer.enabled)" .region.name) }}
{{- end }}
{{- end }}

{{- define "tectonic.discoveryNamespace" -}}
{{- if and .region.discovery .region.discovery.namespace (not .root.Values.modelServer.enabled) }}
{{- .region.discovery.namespace }}
{{- else }}
{{- .root.Release.Namespace }}
{{- end }}
{{- end }}

{{/* The replicas gateways forward to for a unit of this cluster (a region, or a model pool
of one) without a warm pool and without the chart's model servers, as a JSON list: its
discovery Service at discovery.port (http://<service>.<namespace>.svc:<port>); [] when
the pool publishes them (pools/<unit> in etcd), modelServer.enabled fills them in, or
discovery.port is 0: (dict "root" $ "unit" unit) */}}
{{- define "tectonic.discoveryReplicas" -}}
{{- $pool := default dict .unit.pool }}
{{- $discovery := default dict .unit.discovery }}
{{- if or $pool.enabled .root.Values.modelServer.enabled (not $discovery.port) }}
{{- toJson list }}
{{- else }}
{{- $ctx := dict "root" .root "region" .unit }}
{{- toJson (list (printf "http://%s.%s.svc:%d" (include "tectonic.discoveryService" $ctx) (include "tectonic.discoveryNamespace" $ctx) (int $discovery.port))) }}
{{- end }}
{{- end }}

{{/* "yes" when the topology lists replicas for a unit of this cluster: (dict "root" $ "unit" unit) */}}
{{- define "tectonic.topologyHasReplicas" -}}
{{- range $t := .root.Values.topology.regions }}
{{- if eq $t.name $.unit.site }}
{{- if $.unit.modelPool }}
{{- range $p := $t.pools }}
{{- if and (eq $p.name $.unit.modelPool) $p.replicas }}yes{{ end }}
{{- end }}
{{- else if $t.replicas }}yes
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Fails the render when the gateway of a unit of this cluster would have nothing to
forward to (every request a 503): no replicas in the topology, no warm pool to publish
them, no model server of the chart's and no discovery.port: (dict "root" $ "unit" unit) */}}
{{- define "tectonic.gatewayHasReplicas" -}}
{{- $u := .unit }}
{{- $pool := default dict $u.pool }}
{{- $derived := include "tectonic.discoveryReplicas" . | fromJsonArray }}
{{- if not (or $pool.enabled .root.Values.modelServer.enabled $derived (include "tectonic.topologyHasReplicas" .)) }}
{{- $local := ternary (printf "regions[%s].pools.%s" $u.site $u.modelPool) (printf "regions[%s]" $u.site) (ne $u.modelPool "") }}
{{- $topo := ternary (printf "topology.regions[%s].pools[%s].replicas" $u.site $u.modelPool) (printf "topology.regions[%s].replicas" $u.site) (ne $u.modelPool "") }}
{{- fail (printf "gateway.enabled: the gateway has nothing to forward %s's requests to. Set %s.discovery.port (the port of its Service %s; the gateway then forwards to that Service), or list its model servers' base URLs in %s, or run its warm pool (%s.pool.enabled), or set modelServer.enabled, or gateway.enabled: false (with Envoy and the picker as the data plane)" $u.unit $local (include "tectonic.discoveryService" (dict "root" .root "region" $u)) $topo $local) }}
{{- end }}
{{- end }}

{{/* deployment/NAME the warm pool of a local region scales. */}}
{{- define "tectonic.poolWorkload" -}}
{{- if .region.pool.workload }}
{{- .region.pool.workload }}
{{- else if .root.Values.modelServer.enabled }}
{{- printf "deployment/%s" (include "tectonic.modelServerName" .) }}
{{- else }}
{{- fail (printf "regions[%s].pool.workload: name the deployment/NAME or statefulset/NAME the warm pool scales (or set modelServer.enabled)" .region.name) }}
{{- end }}
{{- end }}

{{/* ---- what every Tectonic container mounts ------------------------------------------ */}}
{{- define "tectonic.topologyName" -}}
{{ include "tectonic.componentName" (dict "root" . "suffix" "topology") }}
{{- end }}

{{- define "tectonic.topologyFile" -}}/etc/tectonic/topology/topology.yaml{{- end }}

{{- define "tectonic.volumeMounts" -}}
- name: topology
  mountPath: /etc/tectonic/topology
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .Values.etcd.tls.enabled }}
- name: etcd-tls
  mountPath: {{ include "tectonic.etcdTlsDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.etcd.auth.user }}
- name: etcd-auth
  mountPath: {{ include "tectonic.etcdAuthDir" . }}
  readOnly: true
{{- end }}
{{- range .Values.extraSecretMounts }}
- name: {{ .name }}
  mountPath: {{ .mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "tectonic.volumes" -}}
- name: topology
  configMap:
    name: {{ include "tectonic.topologyName" . }}
- name: tmp
  emptyDir: {sizeLimit: 256Mi}
{{- if .Values.etcd.tls.enabled }}
- name: etcd-tls
  secret:
    secretName: {{ required "etcd.tls.secretName: name the Secret with ca.crt (and tls.crt, tls.key)" .Values.etcd.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- if .Values.etcd.auth.user }}
- name: etcd-auth
  secret:
    secretName: {{ required "etcd.auth.passwordSecret.name: name the Secret with etcd's password" .Values.etcd.auth.passwordSecret.name }}
    defaultMode: 0440
    items:
      - {key: {{ .Values.etcd.auth.passwordSecret.key }}, path: password}
{{- end }}
{{- range .Values.extraSecretMounts }}
- name: {{ .name }}
  secret:
    secretName: {{ .secretName }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* ---- own tokens (security.tokenSecret) ------------------------------------------- */}}
{{- define "tectonic.defaultTokenFile" -}}/etc/tectonic/token/token{{- end }}

{{/* The file Tectonic's processes read their own bearer token from: the topology's
security.token_file, else with security.tokenSecret.name the chart's default (which the
rendered topology then names); "" when neither. */}}
{{- define "tectonic.tokenFile" -}}
{{- $sec := default dict .Values.topology.security }}
{{- if $sec.token_file }}
{{- $sec.token_file }}
{{- else if and $sec (dig "tokenSecret" "name" "" (default dict .Values.security)) }}
{{- include "tectonic.defaultTokenFile" . }}
{{- end }}
{{- end }}

{{/* The key of security.tokenSecret a component's pods mount (controlPlane, agent,
gateway, picker, drills, tests), as JSON {secret, key, dir, file}; {} when none:
(dict "root" $ "component" "agent") */}}
{{- define "tectonic.ownToken" -}}
{{- $ts := dig "tokenSecret" dict (default dict .root.Values.security) }}
{{- $key := get (default dict $ts.keys) .component }}
{{- $file := include "tectonic.tokenFile" .root }}
{{- if and $ts.name $key $file }}
{{- toJson (dict "secret" $ts.name "key" $key "dir" (dir $file) "file" (base $file)) }}
{{- else }}
{{- toJson dict }}
{{- end }}
{{- end }}

{{/* The volumeMount and the volume of a component's own token (nothing without one):
(dict "root" $ "component" "agent") */}}
{{- define "tectonic.tokenVolumeMount" -}}
{{- $t := include "tectonic.ownToken" . | fromJson }}
{{- if $t }}
- name: own-token
  mountPath: {{ $t.dir }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "tectonic.tokenVolume" -}}
{{- $t := include "tectonic.ownToken" . | fromJson }}
{{- if $t }}
- name: own-token
  secret:
    secretName: {{ $t.secret }}
    defaultMode: 0440
    items:
      - {key: {{ $t.key | quote }}, path: {{ $t.file | quote }}}
{{- end }}
{{- end }}

{{/* The directories the chart mounts into Tectonic's pods, besides the own token's and
the payload keys' (their checks compare against these), as a JSON list of [what, path]:
the topology, /tmp, the warm pool's file, the prefix session key, the drills' files,
etcd's TLS and password, and each of extraSecretMounts. */}}
{{- define "tectonic.takenMounts" -}}
{{- $v := .Values }}
{{- $taken := list (list "the topology" "/etc/tectonic/topology") (list "the /tmp emptyDir" "/tmp") (list "the warm pool's file" "/etc/tectonic/pool") (list "the prefix session key" "/etc/tectonic/prefix-key") (list "the drill target" "/etc/tectonic/drills-target") (list "the drill schedule" "/etc/tectonic/drills") }}
{{- if $v.etcd.tls.enabled }}
{{- $taken = append $taken (list "etcd.tls" (include "tectonic.etcdTlsDir" .)) }}
{{- end }}
{{- if $v.etcd.auth.user }}
{{- $taken = append $taken (list "etcd.auth" (include "tectonic.etcdAuthDir" .)) }}
{{- end }}
{{- range $i, $m := $v.extraSecretMounts }}
{{- $taken = append $taken (list (printf "extraSecretMounts[%d] (%s)" $i $m.name) (trimSuffix "/" $m.mountPath)) }}
{{- end }}
{{- toJson $taken }}
{{- end }}

{{/* Fails the render on a token setup that cannot work (topology-configmap.yaml calls
it): security.tokenSecret without topology.security (nothing would read the token); a
token directory that another mount of the pods shadows or is shadowed by; with
topology.security.tokens or token_file, an enabled component with no token of its own
(security.tokenSecret, token_file inside extraSecretMounts, or TECTONIC_TOKEN in its
extraEnv): its calls would be refused as UNAUTHENTICATED, or it would not start. */}}
{{- define "tectonic.checkTokens" -}}
{{- $v := .Values }}
{{- $sec := default dict $v.topology.security }}
{{- $ts := dig "tokenSecret" dict (default dict $v.security) }}
{{- $file := include "tectonic.tokenFile" . }}
{{- if and $ts.name (not $sec) }}
{{- fail (printf "security.tokenSecret.name (%s): the processes read their token through topology.security.token_file, and the topology has no security section, so security is off and the token would go unused. Add topology.security (its tokens, tls: controlplane/SECURITY.md), or unset security.tokenSecret.name" $ts.name) }}
{{- end }}
{{- if and $ts.name $file }}
{{- $dir := dir $file }}
{{- if or (eq $dir "/") (eq $dir ".") (not (hasPrefix "/" $file)) }}
{{- fail (printf "topology.security.token_file (%s): with security.tokenSecret it must be an absolute path in a directory of its own, e.g. %s" $file (include "tectonic.defaultTokenFile" .)) }}
{{- end }}
{{- range $i, $m := $v.extraSecretMounts }}
{{- if eq $m.name "own-token" }}
{{- fail (printf "extraSecretMounts[%d].name: own-token is the volume of security.tokenSecret; name this one otherwise" $i) }}
{{- end }}
{{- end }}
{{- range include "tectonic.takenMounts" . | fromJsonArray }}
{{- $what := index . 0 }}
{{- $path := index . 1 }}
{{- if or (eq $dir $path) (hasPrefix (printf "%s/" $path) $dir) (hasPrefix (printf "%s/" $dir) $path) }}
{{- fail (printf "topology.security.token_file (%s): security.tokenSecret mounts its Secret on %s, which collides with %s at %s; point token_file into a directory of its own (default %s), and drop an extraSecretMounts entry that mounted the token before" $file $dir $what $path (include "tectonic.defaultTokenFile" $)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if or $sec.tokens $sec.token_file }}
{{- $inMounts := false }}
{{- range $v.extraSecretMounts }}
{{- if and $sec.token_file (hasPrefix (printf "%s/" (trimSuffix "/" .mountPath)) $sec.token_file) }}
{{- $inMounts = true }}
{{- end }}
{{- end }}
{{- $components := list }}
{{- if $v.controlPlane.enabled }}
{{- $components = append $components (list "controlPlane" $v.controlPlane.extraEnv) }}
{{- end }}
{{- if $v.regions }}
{{- $components = append $components (list "agent" $v.agent.extraEnv) }}
{{- if $v.gateway.enabled }}
{{- $components = append $components (list "gateway" $v.gateway.extraEnv) }}
{{- end }}
{{- if $v.picker.enabled }}
{{- $components = append $components (list "picker" $v.picker.extraEnv) }}
{{- end }}
{{- end }}
{{- if $v.tests.enabled }}
{{- $components = append $components (list "tests" $v.tests.extraEnv) }}
{{- end }}
{{- range $components }}
{{- $field := index . 0 }}
{{- $env := index . 1 }}
{{- $fromEnv := false }}
{{- range $env }}
{{- if eq .name "TECTONIC_TOKEN" }}
{{- $fromEnv = true }}
{{- end }}
{{- end }}
{{- $fromSecret := and $ts.name (get (default dict $ts.keys) $field) }}
{{- if not (or $fromSecret $inMounts $fromEnv) }}
{{- $why := ternary "topology.security.tokens: the control planes and agents check bearer tokens" (printf "topology.security.token_file (%s): every process reads its token from this file" $sec.token_file) (not (empty $sec.tokens)) }}
{{- if $ts.name }}
{{- fail (printf "%s, and the %s pods have no token of their own: security.tokenSecret.keys.%s is empty; name their key in the Secret %s (or give %s.extraEnv a TECTONIC_TOKEN)" $why $field $field $ts.name $field) }}
{{- end }}
{{- fail (printf "%s, and the %s pods have no token of their own: set security.tokenSecret.name (a Secret with a token per role, docs/kubernetes.md \"Tokens from a Secret\"), or point topology.security.token_file into a Secret of extraSecretMounts, or give %s.extraEnv a TECTONIC_TOKEN" $why $field $field) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* ---- sealed replay payloads (payloadKeys, docs/residency.md) ------------------------- */}}
{{- define "tectonic.defaultPayloadKeysDir" -}}/etc/tectonic/payload-keys{{- end }}

{{/* Where the gateway, picker and agent pods mount this zone's data keys
(payloadKeys.secretName) and what their --payload-keys names; "" without the Secret.
The control plane, the drills and the helm test Pods never mount it: the leader ranks
and shares sealed payloads without a key. */}}
{{- define "tectonic.payloadKeysDir" -}}
{{- $pk := default dict .Values.payloadKeys }}
{{- if $pk.secretName }}
{{- default (include "tectonic.defaultPayloadKeysDir" .) $pk.mountPath | trimSuffix "/" }}
{{- end }}
{{- end }}

{{/* The flag, the volumeMount and the volume of the payload keys (nothing without
payloadKeys.secretName): the whole Secret, one file per key id and `active`. */}}
{{- define "tectonic.payloadKeysArg" -}}
{{- with include "tectonic.payloadKeysDir" . }}
- --payload-keys={{ . }}
{{- end }}
{{- end }}

{{- define "tectonic.payloadKeysVolumeMount" -}}
{{- with include "tectonic.payloadKeysDir" . }}
- name: payload-keys
  mountPath: {{ . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "tectonic.payloadKeysVolume" -}}
{{- if include "tectonic.payloadKeysDir" . }}
- name: payload-keys
  secret:
    secretName: {{ .Values.payloadKeys.secretName }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* Fails the render on a payload-key setup that cannot work (topology-configmap.yaml
calls it): topology.prefixes.sealed_payloads with no payloadKeys.secretName while this
release runs gateways or pickers (they refuse to start without --payload-keys; a
component whose extraArgs give --payload-keys or --no-prefix-tracking is left alone);
a mountPath that is not an absolute directory of its own, or that another mount of the
pods shadows or is shadowed by; an extraSecretMounts entry named payload-keys. */}}
{{- define "tectonic.checkPayloadKeys" -}}
{{- $v := .Values }}
{{- $pk := default dict $v.payloadKeys }}
{{- $prefixes := default dict $v.topology.prefixes }}
{{- if and $prefixes.sealed_payloads (not $pk.secretName) $v.regions }}
{{- $missing := list }}
{{- range $field := list "gateway" "picker" }}
{{- $c := get $v $field }}
{{- if $c.enabled }}
{{- $own := false }}
{{- range $c.extraArgs }}
{{- $arg := toString . }}
{{- if or (eq $arg "--no-prefix-tracking") (hasPrefix "--payload-keys" $arg) }}
{{- $own = true }}
{{- end }}
{{- end }}
{{- if not $own }}
{{- $missing = append $missing $field }}
{{- end }}
{{- end }}
{{- end }}
{{- with $missing }}
{{- fail (printf "topology.prefixes.sealed_payloads is on, and the %s pods have no payload keys: they seal replay payloads with their residency zone's data keys (--payload-keys) and refuse to start without them. Set payloadKeys.secretName to a Secret, created in this cluster, with this zone's keys (a file per key id holding `openssl rand -base64 32`, and a file `active` naming the one that seals; docs/residency.md), or turn sealed_payloads off" (join " and " .)) }}
{{- end }}
{{- end }}
{{- if $pk.secretName }}
{{- $dir := include "tectonic.payloadKeysDir" . }}
{{- if or (not (hasPrefix "/" $dir)) (eq $dir "") }}
{{- fail (printf "payloadKeys.mountPath (%s): an absolute path of a directory of its own, e.g. %s" $pk.mountPath (include "tectonic.defaultPayloadKeysDir" .)) }}
{{- end }}
{{- $taken := include "tectonic.takenMounts" . | fromJsonArray }}
{{- $ts := dig "tokenSecret" dict (default dict $v.security) }}
{{- $tokenFile := include "tectonic.tokenFile" . }}
{{- if and $ts.name $tokenFile }}
{{- $taken = append $taken (list "security.tokenSecret" (dir $tokenFile)) }}
{{- end }}
{{- range $i, $m := $v.extraSecretMounts }}
{{- if eq $m.name "payload-keys" }}
{{- fail (printf "extraSecretMounts[%d].name: payload-keys is the volume of payloadKeys.secretName; name this one otherwise" $i) }}
{{- end }}
{{- end }}
{{- range $taken }}
{{- $what := index . 0 }}
{{- $path := index . 1 }}
{{- if or (eq $dir $path) (hasPrefix (printf "%s/" $path) $dir) (hasPrefix (printf "%s/" $dir) $path) }}
{{- fail (printf "payloadKeys.mountPath (%s): the payload keys' Secret %s would be mounted there, which collides with %s at %s; give it a directory of its own (default %s)" $dir $pk.secretName $what $path (include "tectonic.defaultPayloadKeysDir" $)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Environment of every Tectonic container: its pod's name (replica ids) and Python
settings for a read-only root filesystem. */}}
{{- define "tectonic.env" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
- name: PYTHONUNBUFFERED
  value: "1"
- name: HOME
  value: /tmp
- name: MPLCONFIGDIR
  value: /tmp/matplotlib
{{- end }}

{{/* A checksum of the topology: pods restart when it changes (the processes read it at start). */}}
{{- define "tectonic.topologyChecksum" -}}
checksum/topology: {{ include (print .Template.BasePath "/topology-configmap.yaml") . | sha256sum }}
{{- end }}

{{/* checkov skips for an image pinned by tag, not digest (dict "image" img "field" "image").
Nothing when a digest is set: then the checks pass on their own. Reasons hold no "=",
which checkov's annotation parser splits on. */}}
{{- define "tectonic.imagePinSkips" -}}
{{- if not .image.digest -}}
checkov.io/skip-digest: CKV_K8S_43=Pinned to a release tag by default (no digest is known before you build or mirror the image); set {{ .field }}.digest to pull by digest
checkov.io/skip-pull-policy: CKV_K8S_15=IfNotPresent with a release tag - pulling Always costs a registry round trip at every pod start and fails starts while the registry is down (when a failover launches pods); {{ .field }}.digest makes the reference exact
{{- end }}
{{- end }}

{{/* A workload's annotations block from lines of "key: value" (empty: no block). */}}
{{- define "tectonic.annotations" -}}
{{- $lines := trim . -}}
{{- if $lines -}}
annotations:
  {{- $lines | nindent 2 }}
{{- end }}
{{- end }}

{{/* Labels of a monitoring object (monitoring.*): the chart's, with the extra labels (a
map) over them: (dict "root" $ "extra" .Values.monitoring.prometheusRule.labels) */}}
{{- define "tectonic.monitoringLabels" -}}
{{- toYaml (merge (deepCopy (default dict .extra)) (include "tectonic.labels" .root | fromYaml)) }}
{{- end }}
