"""The demo's live view: what the on-call would watch while a drill runs.

Fed by the drill's own samples (chaos/drills/observe.py: the control plane's record in etcd
and the gateways' and vLLM servers' metrics), it prints the region table (state,
health, degradation steps, routing) whenever it changes, and a traffic line (requests
per second, error rate, first-token p99, prefix-cache hit rate) every few seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from chaos.drills.result import Sample


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


@dataclass
class LiveView:
    t0: float = field(default_factory=time.monotonic)
    traffic_every_s: float = 3.0
    timeline: list[tuple[float, str]] = field(default_factory=list)
    _last_table: str = ""
    _last_traffic: float = 0.0
    _last_t: float = 0.0

    def t(self) -> float:
        return time.monotonic() - self.t0

    def say(self, msg: str) -> None:
        self.timeline.append((round(self.t(), 2), msg))
        print(f"[t+{self.t():5.1f}s] == {msg}", flush=True)

    def table(self, s: Sample) -> str:
        lines = [f"leader={s.leader or '-'}"]
        lines.append(f"  {'region':<11} {'state':<13} {'health':<10} {'ladder':<26} routing")
        for name, r in s.regions.items():
            routing = " ".join(
                f"{k} {v:.0%}" for k, v in sorted(r.routing.items(), key=lambda kv: -kv[1]) if v
            )
            ladder = ",".join(step.split("-")[0] for step in r.ladder_steps) or "-"
            lines.append(f"  {name:<11} {r.state:<13} {r.health:<10} {ladder:<26} {routing}")
        return "\n".join(lines)

    def traffic(self, s: Sample, window_s: float) -> str:
        rate = s.requests / window_s if window_s > 0 else 0.0
        p99 = "-" if s.first_token_p99_s is None else f"{s.first_token_p99_s * 1000:.0f} ms"
        return (
            f"traffic: {rate:5.1f} req/s, errors {_pct(s.error_rate)}, first-token p99 {p99}, "
            f"prefix-cache hit rate {_pct(s.prefix_hit_rate)}"
        )

    def show(self, s: Sample) -> None:
        """Print the table when it changed, the traffic line with it or on its own."""
        window = s.t - self._last_t
        self._last_t = s.t
        table = self.table(s)
        now = time.monotonic()
        if table != self._last_table:
            print(f"[t+{self.t():5.1f}s] {table}", flush=True)
            print(f"  {self.traffic(s, window)}", flush=True)
            self._last_table = table
            self._last_traffic = now
        elif now - self._last_traffic >= self.traffic_every_s:
            print(f"[t+{self.t():5.1f}s] {self.traffic(s, window)}", flush=True)
            self._last_traffic = now
