# Tectonic's image: the control plane, the region agent, the gateway, the endpoint picker
# and the drill service all run from it; the Helm chart (deploy/helm/tectonic) gives each
# pod its command. Build it from the repository root:
#
#   docker build -t tectonic:0.1.0 .
#
# The machines Tectonic is developed and tested on have no container daemon or registry,
# so this file is not built there: tests/integration/test_helm_chart_security.py checks
# it with hadolint and checkov instead (docs/kubernetes.md says what that leaves
# unchecked).
#
# For reproducible builds, pin both FROM lines by digest (python:3.11-slim-bookworm@sha256:...).

# ---- build: the wheel, and a virtual environment with it and its dependencies --------
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps the rest out of the context).
COPY pyproject.toml ./
COPY proto/ proto/
COPY controlplane/ controlplane/
COPY regions/ regions/
COPY chaos/ chaos/
COPY bench/ bench/
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir /wheels/*.whl

# ---- runtime: the virtual environment, the data files, a non-root user ----------------
FROM python:3.11-slim-bookworm AS runtime
# checkov:skip=CKV_DOCKER_2: Kubernetes ignores HEALTHCHECK; the chart gives every pod its own probes (/readyz, /health, gRPC health)
LABEL org.opencontainers.image.title="tectonic" \
      org.opencontainers.image.description="Multi-region failover control plane for LLM inference served by vLLM"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# Data the commands read that the wheel does not carry: the drill scenarios and schedule
# (python -m chaos --scenarios/--schedule) and the degradation ladder the topology names.
COPY chaos/scenarios/ /opt/tectonic/share/chaos/scenarios/
COPY chaos/schedule.yaml /opt/tectonic/share/chaos/schedule.yaml
COPY runbooks/degradation.yaml /opt/tectonic/share/runbooks/degradation.yaml
# A broken wheel (a package left out of pyproject's list) fails here, not in a pod.
RUN python -m controlplane --help >/dev/null \
    && python -m regions.agent --help >/dev/null \
    && python -m regions.gateway --help >/dev/null \
    && tectonic-epp --help >/dev/null \
    && python -m chaos --help >/dev/null \
    && groupadd --gid 10001 tectonic \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin tectonic
USER 10001:10001
WORKDIR /tmp
# The chart sets each pod's command; this one only says what the image holds.
CMD ["python", "-m", "controlplane", "--help"]
