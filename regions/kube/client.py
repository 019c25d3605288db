"""An ``ApiClient`` for the Kubernetes API: in a pod from its service account, else from
a kubeconfig.

    api = await new_api_client()                       # in-cluster, $KUBECONFIG, ~/.kube/config
    api = await new_api_client("/etc/tectonic/kubeconfig", context="eu-west")
    conn = KubeConnection(kubeconfig=None)             # made on first use, in the loop
    api = await conn.api(); ...; await conn.close()

Where the credentials come from, in order: the kubeconfig named (it must exist); the
pod's service account when ``KUBERNETES_SERVICE_HOST`` is set (the kubelet sets it in
every pod) and its token is mounted; the files in ``$KUBECONFIG``; ``~/.kube/config``.
None of them: :class:`KubeConfigError` names each place that was looked at.

``on_call`` sees every request the client makes (method, path, query, status), for a
drill's journal: :class:`ApiCall`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException, load_incluster_config, load_kube_config

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"


class KubeConfigError(RuntimeError):
    """No usable Kubernetes credentials, or a kubeconfig that does not load."""


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One request to the API server as the client made it. ``status`` is None when no
    answer came (connection refused, timeout)."""

    method: str
    path: str
    query: str = ""
    status: int | None = None

    def describe(self) -> str:
        target = f"{self.path}?{self.query}" if self.query else self.path
        return (
            f"{self.method} {target} -> {self.status if self.status is not None else 'no answer'}"
        )


OnCall = Callable[[ApiCall], None]


class RecordingApiClient(ApiClient):
    """An ``ApiClient`` that tells ``on_call`` of every request it makes (all typed API
    methods go through :meth:`request`)."""

    def __init__(self, configuration: Configuration, on_call: OnCall) -> None:
        super().__init__(configuration=configuration)
        self._on_call = on_call

    async def request(  # the stub's is untyped: any signature fits
        self,
        method: str,
        url: str,
        query_params: Any = None,
        headers: dict[str, Any] | None = None,
        post_params: Any = None,
        body: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        query = urlencode(list(query_params)) if query_params else ""
        call = ApiCall(method=method, path=urlsplit(url).path, query=query)
        try:
            response = await super().request(
                method,
                url,
                query_params=query_params,
                headers=headers,
                post_params=post_params,
                body=body,
                _preload_content=_preload_content,
                _request_timeout=_request_timeout,
            )
        except ApiException as e:
            self._tell(ApiCall(call.method, call.path, call.query, e.status))
            raise
        except BaseException:
            self._tell(call)
            raise
        self._tell(ApiCall(call.method, call.path, call.query, int(response.status)))
        return response

    def _tell(self, call: ApiCall) -> None:
        self._on_call(call)


async def new_api_client(
    kubeconfig: str | Path | None = None,
    *,
    context: str | None = None,
    on_call: OnCall | None = None,
) -> ApiClient:
    """An ``ApiClient`` from ``kubeconfig`` (a path), else the pod's service account,
    else ``$KUBECONFIG`` / ``~/.kube/config``; see the module docstring. Call it in the
    running loop (the client's HTTP session belongs to it); close the client after."""
    configuration = await _configuration(kubeconfig, context)
    if on_call is not None:
        return RecordingApiClient(configuration, on_call)
    return ApiClient(configuration=configuration)


async def _configuration(kubeconfig: str | Path | None, context: str | None) -> Configuration:
    source = _credentials(kubeconfig)
    if source is None:
        return _from_service_account()
    return await _from_kubeconfig(source, context)


def _credentials(kubeconfig: str | Path | None) -> Path | None:
    """The kubeconfig to load, or None for the pod's service account."""
    if kubeconfig is not None:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            raise KubeConfigError(f"kubeconfig {path} does not exist (or is not a file)")
        return path
    if _in_a_pod():
        return None
    for path in _default_kubeconfigs():
        if path.is_file():
            return path
    raise KubeConfigError(_nothing_found())


def _in_a_pod() -> bool:
    return bool(os.environ.get(SERVICE_HOST_ENV)) and (SERVICE_ACCOUNT_DIR / "token").is_file()


def _default_kubeconfigs() -> list[Path]:
    """``$KUBECONFIG`` (a ``:``-separated list) when set, else ``~/.kube/config``."""
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return [Path(p).expanduser() for p in listed]
    return [Path.home() / ".kube" / "config"]


def _nothing_found() -> str:
    host = os.environ.get(SERVICE_HOST_ENV)
    pod = (
        f"{SERVICE_HOST_ENV} is {host!r} but {SERVICE_ACCOUNT_DIR / 'token'} is missing "
        "(automountServiceAccountToken: false?)"
        if host
        else f"not in a pod ({SERVICE_HOST_ENV} unset)"
    )
    tried = ", ".join(str(p) for p in _default_kubeconfigs())
    return (
        f"no Kubernetes credentials: no kubeconfig given (--kubeconfig), {pod}, "
        f"and no kubeconfig at {tried}"
    )


async def _from_kubeconfig(path: Path, context: str | None) -> Configuration:
    configuration = Configuration()
    try:
        await load_kube_config(
            config_file=str(path),
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except (ConfigException, OSError, ValueError) as e:
        where = f" (context {context!r})" if context else ""
        raise KubeConfigError(f"kubeconfig {path}{where} does not load: {e}") from e
    return configuration


def _from_service_account() -> Configuration:
    configuration = Configuration()
    try:
        load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except ConfigException as e:
        raise KubeConfigError(f"the pod's service account does not load: {e}") from e
    return configuration


class KubeConnection:
    """One ``ApiClient`` shared by the adapters of a process, made on first use (it
    needs the running loop; the adapters are built before it runs). ``client``: use
    this one instead (tests); it is closed by whoever made it."""

    def __init__(
        self,
        kubeconfig: str | Path | None = None,
        *,
        context: str | None = None,
        on_call: OnCall | None = None,
        client: ApiClient | None = None,
    ) -> None:
        self.kubeconfig, self.context, self._on_call = kubeconfig, context, on_call
        self._client = client
        self._own = client is None

    async def api(self) -> ApiClient:
        if self._client is None:
            self._client = await new_api_client(
                self.kubeconfig, context=self.context, on_call=self._on_call
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None and self._own:
            await self._client.close()
            self._client = None
