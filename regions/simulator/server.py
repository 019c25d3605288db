"""The simulator's HTTP surface: vLLM's OpenAI-compatible API plus ``/_sim/fault``.

With a speculative config (vLLM's ``--speculative-config`` JSON) the simulator exports
vLLM's ``vllm:spec_decode_*`` counters and decodes faster: each decode step yields the
draft's accepted tokens plus the bonus token in about the time of one token, with the
first ``ceil(num_speculative_tokens / 2)`` draft tokens accepted. What speculative
decoding costs under load (verification takes batch slots from other sequences) is
not modelled. Without one the ``spec_decode`` metrics are absent, as in vLLM, so an
observer can tell which variant serves.

Requests are read in request_body.py, streams written in streaming.py, errors and
``http_requests_total`` handled by middleware.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field, replace

from aiohttp import web

from regions.http_expect import expect_handler
from regions.simulator.admin import AdminApi
from regions.simulator.engine import Engine, EngineConfig, GenRequest, Token, generated
from regions.simulator.faults import FaultSpec, FaultState, Verdict
from regions.simulator.limits import check_max_tokens, output_budget
from regions.simulator.metrics import SpecDecodeStats
from regions.simulator.middleware import counting, errors, json_response
from regions.simulator.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    Json,
    TokenizeRequest,
    chat_choice,
    chat_delta,
    check_generation_prompt,
    completion_choice,
    models_body,
    new_id,
    now,
    usage,
)
from regions.simulator.request_body import (
    completion_prompt,
    natural_length,
    parse_body,
    render_messages,
)
from regions.simulator.streaming import count_drafts, stream_events

CRASH_EXIT_CODE = 70  # EX_SOFTWARE
log = logging.getLogger("tectonic.simulator")
VERSION = "0.32.0+sim"


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
        app = web.Application(middlewares=[counting(self.engine.stats), errors])
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
        return json_response({"version": VERSION})

    async def models(self, request: web.Request) -> web.Response:
        c = self.config.engine
        return json_response(models_body(c.model, c.max_model_len, self.created))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = await parse_body(request, CompletionRequest)
        self._check_model(req.model)
        context = self.config.engine.max_model_len
        check_max_tokens(req.max_tokens, context)
        prompt = completion_prompt(req, self.engine.tokenizer)
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
            "id": new_id("cmpl", request.headers.get("X-Request-Id")),
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
        return json_response(body)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        req = await parse_body(request, ChatRequest)
        check_generation_prompt(req)
        self._check_model(req.model)
        context = self.config.engine.max_model_len
        if req.max_completion_tokens is not None:
            check_max_tokens(req.max_completion_tokens, context, "max_completion_tokens")
        else:
            check_max_tokens(req.max_tokens, context)
        text = render_messages(
            req.messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
        )
        prompt = self.engine.tokenizer.encode(text)
        limit = req.max_completion_tokens or req.max_tokens
        natural = natural_length(req)
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
            "id": new_id("chatcmpl", request.headers.get("X-Request-Id")),
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
        return json_response(body)

    async def _collect(self, gen: GenRequest) -> list[Token]:
        return [t async for t in self._generate(gen)]

    def _generate(self, gen: GenRequest) -> AsyncGenerator[Token]:
        spec = self.engine.stats.spec_decode
        stream = self.engine.generate(gen)
        return stream if spec is None else count_drafts(stream, spec)

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
        def usage_chunk(tokens: list[Token]) -> Json:
            u = usage(len(gen.prompt_ids), n * generated(tokens), self._cached(tokens))
            return {**head, "choices": [], "usage": u}

        return await stream_events(
            request,
            lambda: self._generate(gen),
            first=first,
            chunk=chunk,
            usage_chunk=usage_chunk if include_usage else None,
            error_due=self._stream_error_due,
        )

    def _stream_error_due(self, sent: int) -> bool:
        limit = self.faults.spec.stream_error_after
        return limit is not None and sent >= limit

    async def tokenize(self, request: web.Request) -> web.Response:
        req = await parse_body(request, TokenizeRequest)
        if req.messages is not None:  # vLLM's chat variant of the request validates this
            check_generation_prompt(req)
        self._check_model(req.model)
        tok = self.engine.tokenizer
        if (req.prompt is None) == (req.messages is None):
            raise ApiError(
                "Either 'prompt' or 'messages' must be provided, not both.", "BadRequestError", 400
            )
        if req.messages is not None:
            text = render_messages(
                req.messages,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
            )
            ids = tok.encode(text)
        else:
            ids = tok.encode(req.prompt or "", add_special_tokens=req.add_special_tokens)
        strs = [tok.token_str(i) for i in ids] if req.return_token_strs else None
        return json_response(
            {
                "count": len(ids),
                "max_model_len": self.config.engine.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        req = await parse_body(request, DetokenizeRequest)
        self._check_model(req.model)
        # vLLM renders special tokens (a BOS shows as its text), it does not skip them.
        text = self.engine.tokenizer.decode(req.tokens, skip_special_tokens=False)
        return json_response({"prompt": text})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=self.engine.metrics_text(),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Version": "0.0.4"},
        )

    # -- fault injection -----------------------------------------------------
    async def get_fault(self, request: web.Request) -> web.Response:
        return json_response(self.faults.spec.model_dump())

    async def set_fault(self, request: web.Request) -> web.Response:
        spec = await parse_body(request, FaultSpec)
        if spec.crash:
            log.error("fault injected: crash; exiting now")
            # Let the answer go out first, then die without any clean-up.
            asyncio.get_running_loop().call_later(0.05, os._exit, CRASH_EXIT_CODE)
            return json_response(spec.model_dump())
        self.faults.set(spec)
        log.warning("fault injected: %s", spec.model_dump_json())
        return json_response(spec.model_dump())

    async def clear_fault(self, request: web.Request) -> web.Response:
        self.faults.clear()
        log.info("faults cleared")
        return json_response(self.faults.spec.model_dump())


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
