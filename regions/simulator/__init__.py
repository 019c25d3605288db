"""A vLLM-compatible simulator: vLLM's OpenAI-compatible HTTP API, metrics and dev-mode
admin endpoints, with a deterministic tokenizer, a greedy model over text (a cut
generation re-sent with its text so far goes on unchanged), vLLM-style prefix caching, a
simple latency model and fault injection (``/_sim/fault``). One small process per replica:
``python -m regions.simulator --port N --model tiny``.
"""

from regions.simulator.engine import Engine, EngineConfig
from regions.simulator.faults import FaultSpec
from regions.simulator.server import SimConfig, Simulator, serve

__all__ = ["Engine", "EngineConfig", "FaultSpec", "SimConfig", "Simulator", "serve"]
