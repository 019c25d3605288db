"""The simulator's HTTP surface: vLLM's OpenAI-compatible API plus ``/_sim/fault``.

With a speculative config (vLLM's ``--speculative-config`` JSON) the simulator exports
vLLM's ``vllm:spec_decode_*`` counters and decodes faster: each decode step yields the
draft's accepted tokens plus the bonus token in about the time of one token, with the
first ``ceil(num_speculative_tokens / 2)`` draft tokens accepted. What speculative
decoding costs under load (verification takes batch slots from other sequences) is
not modelled. Without one the ``spec_decode`` metrics are absent, as in vLLM, so an
observer can tell which variant serves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware
from pydantic import BaseModel, ValidationError

from regions.http_expect import expect_handler
from regions.simulator.admin import AdminApi
from regions.simulator.engine import Engine, EngineConfig, GenRequest, Token, generated
from regions.simulator.faults import FaultSpec, FaultState, Verdict
from regions.simulator.limits import check_max_tokens, output_budget
from regions.simulator.metrics import EngineStats, SpecDecodeStats
from regions.simulator.protocol import (
    ApiError,
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    Json,
    TokenizeRequest,
    chat_choice,
    chat_delta,
    check_generation_prompt,
    completion_choice,
    dumps,
    error_body,
    models_body,
    new_id,
    now,
    usage,
)
from regions.simulator.tokenizer import render_chat

CRASH_EXIT_CODE = 70  # EX_SOFTWARE
log = logging.getLogger("tectonic.simulator")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)
VERSION = "0.32.0+sim"
# vLLM's instrumentator leaves its probe endpoints out of http_requests_total; /_sim/* is ours.
_UNCOUNTED = frozenset({"/metrics", "/health", "/load", "/ping", "/version", "/server_info"})
# Without a limit the simulated model ends a chat message by itself after this many words.
_NATURAL_WORDS = 16


@dataclass(frozen=True)
class SimConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    dev_mode: bool = True  # VLLM_SERVER_DEV_MODE: /sleep, /wake_up, /is_sleeping, ...
    prompt_tokens_details: bool = False  # --enable-prompt-tokens-details
    speculative_config: Mapping[str, object] | None = None  # --speculative-config


def spec_decode_stats(config: Mapping[str, object] | None) -> SpecDecodeStats | None:
    """The counters of a speculative config (None without one); raises ValueError when
    ``num_speculative_tokens`` (default 1) is not a positive integer."""
    if config is None:
        return None
    k = config.get("num_speculative_tokens", 1)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"num_speculative_tokens must be a positive integer, got {k!r}")
    return SpecDecodeStats(num_spec_tokens=k, accepted_per_draft=(k + 1) // 2)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return _json(e.body, status=e.code)
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed as e:
        resp = _json({"detail": "Method Not Allowed"}, status=405)
        resp.headers[hdrs.ALLOW] = ", ".join(sorted(e.allowed_methods))
        return resp


def _counting(stats: EngineStats) -> Middleware:
    """vLLM's ``http_requests_total{handler,method,status}``: one count per answer, the
    handler as its route template ("none" when no route matched), the status grouped."""

    def count(request: web.Request, status: int) -> None:
        resource = request.match_info.route.resource
        path = "none" if resource is None else resource.canonical
        if path in _UNCOUNTED or path.startswith("/_sim/"):
            return
        key = (path, request.method, f"{status // 100}xx")
        stats.http_requests[key] = stats.http_requests.get(key, 0) + 1

    @web.middleware
    async def counting(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            resp = await handler(request)
        except web.HTTPException as e:
            count(request, e.status)
            raise
        except Exception:
            count(request, 500)  # aiohttp answers an unhandled error with a 500
            raise
        count(request, resp.status)
        return resp

    return counting


def _json(body: object, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=dumps)


def _sse(payload: Json) -> bytes:
    return b"data: " + dumps(payload).encode() + b"\n\n"


def _stream_error_event() -> bytes:
    """vLLM's in-band error for an engine error mid-stream (its
    ``create_streaming_error_response``), spaced as its ``json.dumps`` writes it."""
    body = error_body("Internal server error (injected)", "InternalServerError", 500)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _render_messages(
    messages: Sequence[ChatMessage], *, add_generation_prompt: bool, continue_final_message: bool
) -> str:
    try:
        return render_chat(
            [(m.role, m.text()) for m in messages],
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )
    except ValueError as e:  # the template refuses the two flags together, as vLLM's does
        raise ApiError(str(e), "BadRequestError", 400) from e


def _natural_length(req: ChatRequest) -> int:
    """The tokens (one word each) the simulated model writes before it stops by itself: a
    continued message gets what it lacks of the usual length (at least one), so a reply
    cut and continued ends where the uncut one does."""
    begun = len(req.messages[-1].text().split()) if req.continue_final_message else 0
    return max(1, _NATURAL_WORDS - begun)


@dataclass(frozen=True)
class _Prompt:
    ids: list[int]
    text: str  # what the model continues; a token-id prompt's decoded text
    from_text: bool  # given as text (vLLM's context-length error counts it differently)


class Simulator:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        spec = spec_decode_stats(config.speculative_config)
        engine = config.engine
        if spec is not None:  # a step's tokens in about one token's time
            rate = engine.decode_tokens_per_s * spec.tokens_per_step
            engine = replace(engine, decode_tokens_per_s=rate)
        self.engine = Engine(engine)
        self.engine.stats.spec_decode = spec
        self.faults = FaultState(config.engine.seed)
        self.created = now()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_counting(self.engine.stats), _errors])
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/ping", self.health)
        r.add_get("/version", self.version)
        r.add_get("/v1/models", self.models)
        r.add_post("/v1/completions", self.completions, expect_handler=expect_handler)
        r.add_post("/v1/chat/completions", self.chat, expect_handler=expect_handler)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_get("/metrics", self.metrics)
        if self.config.dev_mode:
            AdminApi(self.engine).add_routes(r)
        r.add_get("/_sim/fault", self.get_fault)
        r.add_post("/_sim/fault", self.set_fault)
        r.add_delete("/_sim/fault", self.clear_fault)
        return app

    # -- helpers -------------------------------------------------------------
    async def _parse(self, request: web.Request, model: type[M]) -> M:
        try:
            data = await request.json()
            json.dumps(data, ensure_ascii=False).encode()  # no lone surrogates: our tokenizer
            return model.model_validate(data)  # cannot encode them (nor can vLLM's HF one)
        except UnicodeEncodeError as e:
            raise ApiError(
                f"Invalid JSON body: a string holds a lone UTF-16 surrogate ({e.reason})",
                "BadRequestError",
                400,
            ) from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(f"Invalid JSON body: {e}", "BadRequestError", 400) from e
        except RecursionError as e:
            raise ApiError("Invalid JSON body: nested too deeply", "BadRequestError", 400) from e
        except web.RequestPayloadError as e:  # e.g. a Content-Encoding the body does not have
            raise ApiError(f"Cannot read the body: {e}", "BadRequestError", 400) from e
        except ValidationError as e:
            raise ApiError(str(e), "BadRequestError", 400) from e

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.engine.model:
            raise ApiError(f"The model `{name}` does not exist.", "NotFoundError", 404, "model")

    async def _faults(self) -> float:
        verdict = self.faults.roll()
        if verdict is Verdict.UNAVAILABLE:
            raise ApiError("Service Unavailable (injected)", "ServiceUnavailableError", 503)
        if verdict is Verdict.ERROR:
            raise ApiError("Internal Server Error (injected)", "InternalServerError", 500)
        await self.faults.wait_unhung()
        return self.faults.spec.added_latency_s

    def _cached(self, tokens: list[Token]) -> int | None:
        if not self.config.prompt_tokens_details or not tokens:
            return None
        return tokens[0].cached_tokens

    # -- OpenAI-compatible API ----------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.faults.spec.health_down else 200)

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": VERSION})

    async def models(self, request: web.Request) -> web.Response:
        c = self.config.engine
        return _json(models_body(c.model, c.max_model_len, self.created))

    def _completion_prompt(self, req: CompletionRequest) -> _Prompt:
        p = req.prompt
        if isinstance(p, list) and p and isinstance(p[0], list | str):
            if len(p) != 1:
                raise ApiError(
                    "The simulator takes one prompt per request.", "BadRequestError", 400, "prompt"
                )
            p = p[0]
        tok = self.engine.tokenizer
        if isinstance(p, str):
            ids, text = tok.encode(p, add_special_tokens=req.add_special_tokens), p
        else:
            ids = [int(t) for t in p if isinstance(t, int)]
            text = tok.decode(ids)
        if not ids:
            raise ApiError("Prompt cannot be empty", "BadRequestError", 400, "prompt")
        return _Prompt(ids, text, from_text=isinstance(p, str))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = await self._parse(request, CompletionRequest)
        self._check_model(req.model)
        context = self.config.engine.max_model_len
        check_max_tokens(req.max_tokens, context)
        prompt = self._completion_prompt(req)
        requested = req.max_tokens if req.max_tokens is not None else 16
        max_tokens = output_budget(len(prompt.ids), requested, context, from_text=prompt.from_text)
        latency = await self._faults()
        gen = GenRequest(
            prompt_ids=tuple(prompt.ids),
            prompt_text=prompt.text,
            max_tokens=max_tokens,
            finish_reason="length",
            cache_salt=req.cache_salt,
            extra_prefill_s=latency,
        )
        head: Json = {
            "id": new_id("cmpl"),
            "object": "text_completion",
            "created": now(),
            "model": self.config.engine.model,
        }
        if req.stream:
            include = req.stream_options is not None and bool(req.stream_options.include_usage)

            def chunk(t: Token) -> list[Json]:
                return [
                    {
                        **head,
                        "choices": [
                            completion_choice(i, t.text, t.finish_reason) for i in range(req.n)
                        ],
                    }
                ]

            return await self._stream(request, gen, head, None, chunk, include, req.n)
        tokens = await self._collect(gen)
        text = "".join(t.text for t in tokens)
        finish = tokens[-1].finish_reason
        body = {
            **head,
            "choices": [completion_choice(i, text, finish) for i in range(req.n)],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(len(prompt.ids), req.n * generated(tokens), self._cached(tokens)),
            "kv_transfer_params": None,
        }
        return _json(body)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        req = await self._parse(request, ChatRequest)
        check_generation_prompt(req)
        self._check_model(req.model)
        context = self.config.engine.max_model_len
        if req.max_completion_tokens is not None:
            check_max_tokens(req.max_completion_tokens, context, "max_completion_tokens")
        else:
            check_max_tokens(req.max_tokens, context)
        text = _render_messages(
            req.messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
        )
        prompt = self.engine.tokenizer.encode(text)
        limit = req.max_completion_tokens or req.max_tokens
        natural = _natural_length(req)
        max_tokens = output_budget(len(prompt), limit or natural, context, from_text=True)
        # Without a limit the simulated model stops by itself, unless the context ends
        # first (vLLM's default max_tokens is what is left of the context).
        finish = "length" if limit or max_tokens < natural else "stop"
        latency = await self._faults()
        gen = GenRequest(
            prompt_ids=tuple(prompt),
            prompt_text=text,
            max_tokens=max_tokens,
            finish_reason=finish,
            cache_salt=req.cache_salt,
            extra_prefill_s=latency,
        )
        head: Json = {
            "id": new_id("chatcmpl"),
            "object": "chat.completion.chunk",
            "created": now(),
            "model": self.config.engine.model,
        }
        if req.stream:
            include = req.stream_options is not None and bool(req.stream_options.include_usage)
            first = {
                **head,
                "choices": [
                    chat_delta(i, {"role": "assistant", "content": ""}, None) for i in range(req.n)
                ],
            }

            def chunk(t: Token) -> list[Json]:
                return [
                    {
                        **head,
                        "choices": [
                            chat_delta(i, {"content": t.text}, t.finish_reason)
                            for i in range(req.n)
                        ],
                    }
                ]

            return await self._stream(request, gen, head, first, chunk, include, req.n)
        tokens = await self._collect(gen)
        out = "".join(t.text for t in tokens)
        finish = tokens[-1].finish_reason or finish
        body = {
            **head,
            "object": "chat.completion",
            "choices": [chat_choice(i, out, finish) for i in range(req.n)],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(len(prompt), req.n * generated(tokens), self._cached(tokens)),
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
        return _json(body)

    async def _collect(self, gen: GenRequest) -> list[Token]:
        return [t async for t in self._generate(gen)]

    def _generate(self, gen: GenRequest) -> AsyncGenerator[Token]:
        spec = self.engine.stats.spec_decode
        stream = self.engine.generate(gen)
        return stream if spec is None else _count_drafts(stream, spec)

    async def _stream(
        self,
        request: web.Request,
        gen: GenRequest,
        head: Json,
        first: Json | None,
        chunk: Callable[[Token], list[Json]],
        include_usage: bool,
        n: int,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        tokens: list[Token] = []
        sent = 0  # output tokens written
        failed = False
        stream: AsyncGenerator[Token] = self._generate(gen)
        try:
            async for t in stream:
                if t.token_id is not None and self._stream_error_due(sent):
                    await resp.write(_stream_error_event())
                    failed = True
                    break
                if first is not None and not tokens:
                    # vLLM sends the role chunk with the first engine output, i.e. after
                    # queueing and prefill: a client's first byte includes the prefill.
                    await resp.write(_sse(first))
                tokens.append(t)
                if t.token_id is not None:
                    sent += 1
                for payload in chunk(t):
                    await resp.write(_sse(payload))
            if include_usage and not failed:  # vLLM's usage chunk never follows an error
                u = usage(len(gen.prompt_ids), n * generated(tokens), self._cached(tokens))
                await resp.write(_sse({**head, "choices": [], "usage": u}))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:
            log.debug("client went away mid-stream")
        finally:
            await stream.aclose()
        return resp

    def _stream_error_due(self, sent: int) -> bool:
        limit = self.faults.spec.stream_error_after
        return limit is not None and sent >= limit

    async def tokenize(self, request: web.Request) -> web.Response:
        req = await self._parse(request, TokenizeRequest)
        if req.messages is not None:  # vLLM's chat variant of the request validates this
            check_generation_prompt(req)
        self._check_model(req.model)
        tok = self.engine.tokenizer
        if (req.prompt is None) == (req.messages is None):
            raise ApiError(
                "Either 'prompt' or 'messages' must be provided, not both.", "BadRequestError", 400
            )
        if req.messages is not None:
            text = _render_messages(
                req.messages,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
            )
            ids = tok.encode(text)
        else:
            ids = tok.encode(req.prompt or "", add_special_tokens=req.add_special_tokens)
        strs = [tok.token_str(i) for i in ids] if req.return_token_strs else None
        return _json(
            {
                "count": len(ids),
                "max_model_len": self.config.engine.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        req = await self._parse(request, DetokenizeRequest)
        self._check_model(req.model)
        # vLLM renders special tokens (a BOS shows as its text), it does not skip them.
        text = self.engine.tokenizer.decode(req.tokens, skip_special_tokens=False)
        return _json({"prompt": text})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=self.engine.metrics_text(),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Version": "0.0.4"},
        )

    # -- fault injection -----------------------------------------------------
    async def get_fault(self, request: web.Request) -> web.Response:
        return _json(self.faults.spec.model_dump())

    async def set_fault(self, request: web.Request) -> web.Response:
        spec = await self._parse(request, FaultSpec)
        if spec.crash:
            log.error("fault injected: crash; exiting now")
            # Let the answer go out first, then die without any clean-up.
            asyncio.get_running_loop().call_later(0.05, os._exit, CRASH_EXIT_CODE)
            return _json(spec.model_dump())
        self.faults.set(spec)
        log.warning("fault injected: %s", spec.model_dump_json())
        return _json(spec.model_dump())

    async def clear_fault(self, request: web.Request) -> web.Response:
        self.faults.clear()
        log.info("faults cleared")
        return _json(self.faults.spec.model_dump())


async def _count_drafts(
    stream: AsyncGenerator[Token], spec: SpecDecodeStats
) -> AsyncGenerator[Token]:
    """Pass the tokens on, counting every decode token into its draft (vLLM counts per
    step; the totals agree)."""
    n = 0
    try:
        async for t in stream:
            if t.token_id is not None:
                if n:  # the first token comes from prefill, not from a draft
                    spec.observe_decode_token(n - 1)
                n += 1
            yield t
    finally:
        await stream.aclose()  # the engine releases the sequence now, not at GC


async def serve(
    config: SimConfig,
    host: str,
    port: int,
    *,
    access_log: bool = False,
) -> tuple[web.AppRunner, Simulator, int]:
    """Start a simulator in the running loop; returns the runner, the app and the bound port."""
    sim = Simulator(config)
    runner = web.AppRunner(sim.app(), access_log=log if access_log else None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = int(runner.addresses[0][1]) if port == 0 else port
    return runner, sim, bound
