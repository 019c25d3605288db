"""What the capacity probe and the agent read of a replica's serving configuration, and
the context-length refusal they tell from overload, against each backend (the
simulator and a REAL vLLM, see conftest.py): ``/v1/models``' ``max_model_len``,
``vllm:cache_config_info``, dev mode's ``/server_info`` (``max_num_seqs``: vLLM exports
it nowhere else), and a prompt over the context answered with a 400 that
``results.context_error`` recognises."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from chaos.capacity.replica_info import read_replica
from chaos.capacity.results import context_error
from regions.agent.engine_version import read_serving
from tests.contract.conftest import MAX_MODEL_LEN, Backend
from tests.contract.vllm_api_helpers import long_prompt

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_the_serving_configuration_is_read(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    info = await read_replica(http, server.url, None, timeout_s=60.0)
    assert info.model == server.model and info.engine_version
    assert info.max_model_len == MAX_MODEL_LEN
    assert info.serving.max_num_seqs is not None and info.serving.max_num_seqs > 0
    assert int(info.serving.cache["block_size"]) > 0
    assert int(info.serving.cache["num_gpu_blocks"]) > 0
    assert info.serving.cache["enable_prefix_caching"] == "True"
    # The agent reads the same fingerprint (the /server_info answer is cached now).
    assert await read_serving(http, server.url, 60.0) == (info.fingerprint, True)


async def test_a_prompt_over_the_context_is_a_context_error(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    prompt = await long_prompt(http, server, MAX_MODEL_LEN)
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 4,
        "stream": True,
    }
    async with http.post(server.url + "/v1/chat/completions", json=body) as r:
        assert context_error(r.status, await r.text())
