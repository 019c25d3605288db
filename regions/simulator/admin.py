"""vLLM's dev-mode admin endpoints (``VLLM_SERVER_DEV_MODE=1``; vllm/entrypoints/serve/dev/).

- ``POST /sleep?level=1&mode=abort`` -> ``{"status": "sleeping", "level": 1}``; ``level``
  0-2, ``mode`` abort (default: running requests end with ``finish_reason: "abort"``),
  wait (answers once they have finished) or keep (they resume on wake-up).
- ``POST /wake_up[?tags=weights&tags=kv_cache]`` -> ``{"status": "awake", "tags": null}``,
  or ``"sleeping"`` while some tags still sleep.
- ``GET /is_sleeping`` -> ``{"is_sleeping": bool}``.
- ``POST /reset_prefix_cache[?reset_running_requests=true]`` -> ``{"success": bool}``;
  false while running requests hold blocks (callers retry).
- ``GET /server_info[?config_format=json]`` -> ``{"vllm_config": ..., "vllm_env": {},
  "system_env": {}}``: the simulator's own config where vLLM's ``VllmConfig`` has it
  (``model_config.max_model_len``, ``cache_config.block_size`` / ``num_gpu_blocks``,
  ``scheduler_config.max_num_seqs``: vLLM exports the scheduler's config nowhere
  else); ``config_format=text`` (the default) gives it as one ``key=value`` line.
"""

from __future__ import annotations

import logging
from typing import Literal, TypeVar

from aiohttp import web
from pydantic import BaseModel, Field, ValidationError

from regions.simulator.engine import Engine
from regions.simulator.protocol import ApiError, dumps
from regions.simulator.scheduler import PauseMode

log = logging.getLogger("tectonic.simulator")
Q = TypeVar("Q", bound=BaseModel)
_MAX_REPORTED_ERRORS = 10


class SleepQuery(BaseModel):
    level: int = Field(1, ge=0, le=2)
    mode: PauseMode = "abort"


class ResetQuery(BaseModel):
    reset_running_requests: bool = False
    reset_external: bool = False  # no connector-managed cache here: nothing more to reset


def query_error(e: ValidationError) -> ApiError:
    """FastAPI's 400 for an invalid query parameter, as vLLM words it."""
    errors = [
        {**err, "loc": ".".join(["query", *map(str, err["loc"])])}
        for err in e.errors(include_url=False)
    ]
    label = "error" if len(errors) == 1 else "errors"
    lines = "".join(f"  {err}\n" for err in errors[:_MAX_REPORTED_ERRORS])
    param = str(errors[0]["loc"]) if errors else None
    return ApiError(
        f"{len(errors)} validation {label}:\n{lines}".rstrip(), "Bad Request", 400, param
    )


def _query(request: web.Request, model: type[Q]) -> Q:
    try:
        return model.model_validate({k: request.query[k] for k in request.query})
    except ValidationError as e:
        raise query_error(e) from e


def _json(body: object) -> web.Response:
    return web.json_response(body, dumps=dumps)


class ServerInfoQuery(BaseModel):
    config_format: Literal["text", "json"] = "text"


def vllm_config(engine: Engine) -> dict[str, dict[str, object]]:
    """The simulator's config in the shape of vLLM's ``VllmConfig`` (its JSON form)."""
    c = engine.config
    return {
        "model_config": {
            "model": c.model,
            "served_model_name": c.model,
            "max_model_len": c.max_model_len,
            "seed": c.seed,
        },
        "cache_config": {
            "block_size": c.block_size,
            "num_gpu_blocks": c.num_blocks,
            "enable_prefix_caching": c.enable_prefix_caching,
        },
        "scheduler_config": {"max_num_seqs": c.max_num_seqs},
    }


class AdminApi:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/sleep", self.sleep)
        router.add_post("/wake_up", self.wake_up)
        router.add_get("/is_sleeping", self.is_sleeping)
        router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        router.add_get("/server_info", self.server_info)

    async def sleep(self, request: web.Request) -> web.Response:
        q = _query(request, SleepQuery)
        await self.engine.sleep(q.level, q.mode)
        log.info("engine asleep (level %d, mode %s)", q.level, q.mode)
        return _json({"status": "sleeping", "level": q.level})

    async def wake_up(self, request: web.Request) -> web.Response:
        tags = request.query.getall("tags", []) or None
        awake = self.engine.wake_up(tags)
        log.info("engine %s (tags %s)", "awake" if awake else "still partly asleep", tags)
        return _json({"status": "awake" if awake else "sleeping", "tags": tags})

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return _json({"is_sleeping": self.engine.sleeping})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        q = _query(request, ResetQuery)
        return _json({"success": self.engine.reset_prefix_cache(q.reset_running_requests)})

    async def server_info(self, request: web.Request) -> web.Response:
        q = _query(request, ServerInfoQuery)
        config = vllm_config(self.engine)
        text = ", ".join(f"{k}={v!r}" for part in config.values() for k, v in part.items())
        body = config if q.config_format == "json" else text
        return _json({"vllm_config": body, "vllm_env": {}, "system_env": {}})
