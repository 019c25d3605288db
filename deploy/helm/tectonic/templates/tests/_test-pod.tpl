{{/* `helm test` Pods (templates/tests/): one check each, in the Tectonic image, with the
chart's pod and container security, the Secrets of extraSecretMounts (where
topology.security's files live), security.tokenSecret's key for tests (a viewer token by
default) and the topology's TLS files and token file for failoverctl; the check retries
for tests.waitSeconds before it fails.
(dict "root" $ "check" "controlplane"|"region" "suffix" "test-controlplane") */}}
{{- define "tectonic.testPod" -}}
{{- $root := .root }}
{{- $t := $root.Values.tests }}
{{- $security := default dict $root.Values.topology.security }}
{{- $tls := default dict $security.tls }}
{{- $units := list }}
{{- range include "tectonic.localUnits" $root | fromJsonArray }}
{{- $units = append $units .unit }}
{{- end }}
apiVersion: v1
kind: Pod
metadata:
  name: {{ include "tectonic.componentName" (dict "root" $root "suffix" .suffix) }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "tectonic.commonMeta" $root | nindent 4 }}
    {{- include "tectonic.selectorLabels" (dict "root" $root "component" "test") | nindent 4 }}
  annotations:
    helm.sh/hook: test
    # Kept after its run for `kubectl logs`; deleted when the next `helm test` starts.
    helm.sh/hook-delete-policy: before-hook-creation
    {{- include "tectonic.imagePinSkips" (dict "image" $root.Values.image "field" "image") | nindent 4 }}
    checkov.io/skip-liveness: CKV_K8S_8=A helm test Pod runs one check and exits - there is no long-running process to restart
    checkov.io/skip-readiness: CKV_K8S_9=A helm test Pod serves nothing and takes no traffic, so readiness means nothing
    {{- with omit (deepCopy (default dict $root.Values.podAnnotations)) "helm.sh/hook" "helm.sh/hook-delete-policy" "helm.sh/hook-weight" }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  restartPolicy: Never
  # The checks call the control plane, never the Kubernetes API.
  automountServiceAccountToken: false
  {{- include "tectonic.podCommon" $root | nindent 2 }}
  {{- with default $root.Values.priorityClassName $t.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $t.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $t.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .check }}
      image: {{ include "tectonic.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command: [python, -c]
      args:
        - |
          {{- include "tectonic.testScript" . | nindent 10 }}
      env:
        {{- include "tectonic.env" $root | nindent 8 }}
        - {name: CHECK, value: {{ .check }}}
        - {name: WAIT_S, value: {{ $t.waitSeconds | quote }}}
        # failoverctl's settings (controlplane/SECURITY.md): the control plane's gRPC
        # address, as this release's agents and data plane reach it ...
        - {name: TECTONIC_SERVER, value: {{ include "tectonic.controlPlaneAddresses" $root | quote }}}
        {{- if and $root.Values.controlPlane.enabled (eq .check "controlplane") }}
        # ... and this release's control-plane Service's HTTP API, which has no TLS or tokens.
        - {name: READYZ_URL, value: {{ printf "http://%s.%s.svc:8081/readyz" (include "tectonic.controlPlaneName" $root) $root.Release.Namespace | quote }}}
        {{- end }}
        - {name: UNITS, value: {{ join "," $units | quote }}}
        {{- with $tls.ca }}
        # topology.security.tls: the files of extraSecretMounts, as the other pods use them
        - {name: TECTONIC_CA, value: {{ . | quote }}}
        {{- end }}
        {{- with $tls.cert }}
        - {name: TECTONIC_CERT, value: {{ . | quote }}}
        {{- end }}
        {{- with $tls.key }}
        - {name: TECTONIC_KEY, value: {{ . | quote }}}
        {{- end }}
        {{- with include "tectonic.tokenFile" $root }}
        # topology.security.token_file (or security.tokenSecret's): read into TECTONIC_TOKEN
        # (unless tests.extraEnv gives it)
        - {name: TOKEN_FILE, value: {{ . | quote }}}
        {{- end }}
        {{- with $t.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      resources:
        {{- toYaml $t.resources | nindent 8 }}
      {{- include "tectonic.containerSecurity" $root | nindent 6 }}
      volumeMounts:
        - {name: tmp, mountPath: /tmp}
        {{- range $root.Values.extraSecretMounts }}
        - {name: {{ .name }}, mountPath: {{ .mountPath }}, readOnly: true}
        {{- end }}
        {{- with include "tectonic.tokenVolumeMount" (dict "root" $root "component" "tests") }}{{ . | trim | nindent 8 }}{{ end }}
  volumes:
    - name: tmp
      emptyDir: {sizeLimit: 64Mi}
    {{- range $root.Values.extraSecretMounts }}
    - name: {{ .name }}
      secret:
        secretName: {{ .secretName }}
        defaultMode: 0440
    {{- end }}
    {{- with include "tectonic.tokenVolume" (dict "root" $root "component" "tests") }}{{ . | trim | nindent 4 }}{{ end }}
{{- end }}

{{/* The check both test Pods run (python -c), by CHECK: "controlplane": the control
plane's /readyz answers 200 (READYZ_URL, when this release runs it) and its gRPC API
answers failoverctl status with a leader; "region": failoverctl status shows a region of
this release (UNITS) HEALTHY. Either retries every 5 s for WAIT_S seconds. */}}
{{- define "tectonic.testScript" -}}
import json, os, subprocess, sys, time, urllib.error, urllib.request

check, readyz = os.environ["CHECK"], os.environ.get("READYZ_URL", "")
units = [u for u in os.environ.get("UNITS", "").split(",") if u]
deadline = time.monotonic() + float(os.environ["WAIT_S"])
if os.environ.get("TOKEN_FILE") and not os.environ.get("TECTONIC_TOKEN"):
    with open(os.environ["TOKEN_FILE"]) as f:
        os.environ["TECTONIC_TOKEN"] = f.read().strip()


def http_ready():
    try:
        with urllib.request.urlopen(readyz, timeout=5) as r:
            return None if r.status == 200 else f"{readyz}: HTTP {r.status}"
    except urllib.error.HTTPError as e:
        return f"{readyz}: HTTP {e.code} {e.read().decode(errors='replace')[:300]}"
    except OSError as e:
        return f"{readyz}: {e}"


def status():
    cmd = ["failoverctl", "status", "--json"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, "failoverctl status: no answer in 60 s"
    if done.returncode != 0:
        out = (done.stderr or done.stdout).strip()[-500:]
        return None, f"failoverctl status: exit {done.returncode}: {out}"
    return json.loads(done.stdout), ""


def attempt():
    if readyz and (why := http_ready()):
        return why
    st, why = status()
    if st is None:
        return why
    if check == "controlplane":
        if not st.get("leader"):
            return "the control plane answers but has no leader yet"
        print(f"control plane answers: leader {st['leader']}, replica {st.get('responder')}")
        return None
    seen = {r["name"]: (r.get("state"), r.get("health")) for r in st.get("regions", [])}
    mine = {u: seen.get(u, ("absent", "absent")) for u in units}
    print("regions of this release:", ", ".join(f"{u} {s}/{h}" for u, (s, h) in mine.items()))
    if any(h == "HEALTHY" for _, h in mine.values()):
        return None
    return f"none of {', '.join(units)} is HEALTHY yet"


while (why := attempt()) is not None:
    if time.monotonic() > deadline:
        sys.exit(f"FAILED after {os.environ['WAIT_S']} s: {why}")
    print(f"waiting: {why}", flush=True)
    time.sleep(5)
print("OK")
{{- end }}
