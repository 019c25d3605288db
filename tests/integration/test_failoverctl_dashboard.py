"""``failoverctl dashboard`` against a real replica whose HTTP API asks for tokens.

The command runs as a user runs it (a subprocess, the token in ``$TECTONIC_TOKEN``) and
a real HTTP client plays the browser, sending no token: the dashboard page, the status
and the event stream come back through it, while the same requests straight to the
replica are refused (401). A token the replica refuses, and a non-loopback --listen,
stop the command with the exit code and a message that says what to do.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import aiohttp
import pytest

from controlplane.cli.client import EXIT_BAD_INPUT, EXIT_UNAUTHENTICATED
from tests.integration.test_http_api_auth import SECURITY, TOKENS, _topology, replica

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(120)]
FAILOVERCTL = str(Path(sys.executable).with_name("failoverctl"))


async def failoverctl(*args: str, token: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "TECTONIC_TOKEN": token, "NO_COLOR": "1"}
    env.pop("TECTONIC_CONTEXT", None)
    return await asyncio.create_subprocess_exec(
        FAILOVERCTL,
        "--server",
        "127.0.0.1:1",  # unused: the dashboard speaks HTTP only
        "dashboard",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_the_dashboard_is_read_through_failoverctl_with_its_token(etcd: object) -> None:
    async with replica(_topology(etcd, SECURITY)) as rep:
        api = f"http://127.0.0.1:{rep.http_port}"
        proc = await failoverctl(
            "--url", api, "--listen", "127.0.0.1:0", "--json", token=TOKENS["viewer"]
        )
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            started = json.loads(line)
            assert started["forwarding_to"] == api
            local = started["dashboard"].rstrip("/")
            timeout = aiohttp.ClientTimeout(total=10)
            async with aiohttp.ClientSession(timeout=timeout) as browser:
                for base, want in ((api, 401), (local, 200)):
                    async with browser.get(base + "/") as r:
                        assert r.status == want, base
                        if want == 200:
                            assert "<html" in (await r.text()).lower()
                    async with browser.get(base + "/v1/status") as r:
                        assert r.status == want, base
                        if want == 200:
                            assert "regions" in await r.json()
                # The event stream (an EventSource sends no header): open, streaming.
                async with browser.get(local + "/v1/events?replay=1") as r:
                    assert r.status == 200
                    assert r.content_type == "text/event-stream"
                    first = await asyncio.wait_for(r.content.readline(), 10)
                    assert first.strip(), first
                # Only the API's reads are forwarded.
                async with browser.post(local + "/v1/status") as r:
                    assert r.status == 404
                async with browser.get(local + "/etc/passwd") as r:
                    assert r.status == 404
        finally:
            proc.terminate()
            await proc.wait()

        # A token the replica does not know: exit 5, saying where a token comes from.
        bad = await failoverctl("--url", api, "--listen", "127.0.0.1:0", token="nope")
        _, stderr = await asyncio.wait_for(bad.communicate(), 30)
        assert bad.returncode == EXIT_UNAUTHENTICATED
        assert "refused the token (401)" in stderr.decode() and "--token" in stderr.decode()

    # Never beyond this machine: the token is added to whatever reaches it.
    wide = await failoverctl("--listen", "0.0.0.0:8090", "--json", token=TOKENS["viewer"])
    _, stderr = await asyncio.wait_for(wide.communicate(), 30)
    assert wide.returncode == EXIT_BAD_INPUT
    assert json.loads(stderr)["error"]["message"].startswith("--listen '0.0.0.0:8090': only")
