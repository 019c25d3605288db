"""Every process's logging (controlplane/kernel/logs.py): text or one JSON object per
line, and the request id of the request being handled on each line."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from controlplane.kernel.logs import (
    REQUEST_ID,
    add_log_format_flag,
    configure_logging,
    request_id,
)


@pytest.fixture(autouse=True)
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_json_lines_carry_the_request_id_extras_and_the_traceback() -> None:
    buf = io.StringIO()
    configure_logging("info", "json", "gateway", stream=buf)
    log = logging.getLogger("tectonic.test")
    log.debug("not shown")
    log.info("outside a request")
    token = REQUEST_ID.set("req-42")
    try:
        log.warning("replica %s failed", "r1", extra={"region": "us-east"})
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("caught")
    finally:
        REQUEST_ID.reset(token)
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [x["msg"] for x in lines] == ["outside a request", "replica r1 failed", "caught"]
    assert "request_id" not in lines[0] and lines[0]["component"] == "gateway"
    assert lines[1]["request_id"] == "req-42" and lines[1]["region"] == "us-east"
    assert lines[1]["level"] == "WARNING" and lines[1]["logger"] == "tectonic.test"
    assert lines[1]["ts"].endswith("+00:00")
    assert "RuntimeError: boom" in lines[2]["exc"]


def test_text_lines_tag_the_request_and_each_task_keeps_its_own() -> None:
    buf = io.StringIO()
    configure_logging("INFO", "text", stream=buf)
    log = logging.getLogger("tectonic.test")

    async def handle(rid: str) -> None:
        REQUEST_ID.set(rid)  # as the gateway does, in the request's own task
        await asyncio.sleep(0)
        log.info("handled")

    async def both() -> None:
        await asyncio.gather(handle("a1"), handle("b2"))

    asyncio.run(both())
    log.info("after")
    lines = buf.getvalue().splitlines()
    assert sorted(line.split("handled [req ")[1] for line in lines[:2]) == ["a1]", "b2]"]
    assert lines[2].endswith("tectonic.test: after")


def test_a_clients_id_is_kept_when_sane_else_one_is_made() -> None:
    assert request_id({"x-request-id": "abc-123"}) == "abc-123"
    for bad in ("", "has space", "x" * 129, "tab\there"):
        made = request_id({"x-request-id": bad})
        assert made != bad and len(made) == 32 and int(made, 16) >= 0
    assert request_id({}) != request_id({})


def test_the_flag_and_its_environment_default(monkeypatch: pytest.MonkeyPatch) -> None:
    p = argparse.ArgumentParser()
    add_log_format_flag(p)
    assert p.parse_args([]).log_format == "text"
    assert p.parse_args(["--log-format", "json"]).log_format == "json"
    with pytest.raises(SystemExit):
        p.parse_args(["--log-format", "xml"])
    monkeypatch.setenv("TECTONIC_LOG_FORMAT", "json")
    p = argparse.ArgumentParser()
    add_log_format_flag(p)
    assert p.parse_args([]).log_format == "json"
    with pytest.raises(ValueError, match="text, json"):
        configure_logging("INFO", "xml")
