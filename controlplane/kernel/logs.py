"""How every Tectonic process logs: text for a terminal, or one JSON object per line for
a log pipeline (``--log-format json``, or ``$TECTONIC_LOG_FORMAT``), and the request id
each line of a request's handling carries.

The request id is the client's ``x-request-id`` (Envoy sets one on every request it
forwards), else one the gateway makes; the gateway passes it on to the model server
and back in its answer, the endpoint picker logs it, and a warm-first replay carries
the request's own. It lives in a context variable, so every log line written while a
request is handled names it without being handed it.

The JSON formatter is a few lines over the standard library's ``json``: a dependency
for it would bring nothing more.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO

REQUEST_ID: ContextVar[str] = ContextVar("tectonic_request_id", default="")
REQUEST_ID_HEADER = "x-request-id"
FORMATS = ("text", "json")
FORMAT_ENV = "TECTONIC_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s%(request_tag)s"
# What a client's id may be: printable, no spaces, bounded (it goes into every line).
_GOOD_ID = re.compile(r"^[!-~]{1,128}$")
# LogRecord's own attributes: anything else on a record came through ``extra=``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "request_tag"}


@dataclass(frozen=True)
class LogSettings:
    """What ``--log-level``, ``--log-format`` and ``--otlp-endpoint`` said (traces:
    ``controlplane/kernel/tracing.py``)."""

    level: str = "INFO"
    format: str = "text"
    otlp_endpoint: str = ""


def request_id(headers: Mapping[str, str]) -> str:
    """The request's id: its ``x-request-id`` when it is a sane one, else a new one."""
    given = headers.get(REQUEST_ID_HEADER, "")
    return given if _GOOD_ID.match(given) else uuid.uuid4().hex


class _RequestTag(logging.Filter):
    """Gives every record ``request_id`` (and the text format's `` [req ID]`` tag)."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = REQUEST_ID.get()
        record.request_id = rid
        record.request_tag = f" [req {rid}]" if rid else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the
    component, the request id when there is one, ``extra=`` fields, the traceback."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.component:
            out["component"] = self.component
        if rid := getattr(record, "request_id", ""):
            out["request_id"] = rid
        for k, v in record.__dict__.items():
            if k not in _STANDARD and k != "request_id" and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(
    level: str | int, fmt: str = "text", component: str = "", stream: IO[str] | None = None
) -> None:
    """The root logger of this process: ``level``, in ``fmt`` (text or json), on
    ``stream`` (stderr). Replaces whatever was configured before."""
    if fmt not in FORMATS:
        raise ValueError(f"--log-format is one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(_RequestTag())
    handler.setFormatter(
        JsonFormatter(component) if fmt == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)


def add_log_format_flag(p: argparse.ArgumentParser) -> None:
    default = os.environ.get(FORMAT_ENV, "text")
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default=default if default in FORMATS else "text",
        help=f"text for a terminal, json for a log pipeline: one object per line with "
        f"ts, level, logger, msg, component and the request id (default: ${FORMAT_ENV}, "
        "else text)",
    )
