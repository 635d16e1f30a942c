"""The server's counters and latency histograms, written in Prometheus' text format for GET /metrics."""
from __future__ import annotations

import bisect
import collections
import threading
import time

# Upper bounds of the latency buckets, seconds.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Histogram:
    def __init__(self, bounds):
        self.bounds, self.counts, self.sum, self.n = tuple(bounds), [0] * len(bounds), 0.0, 0

    def observe(self, v: float) -> None:
        i = bisect.bisect_left(self.bounds, v)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += v
        self.n += 1

    def lines(self, name: str) -> list[str]:
        out, c = [], 0
        for b, k in zip(self.bounds, self.counts):
            c += k
            out.append(f'{name}_bucket{{le="{b}"}} {c}')
        out += [f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {self.sum:.6f}", f"{name}_count {self.n}"]
        return out


class Metrics:
    """Thread-safe: the HTTP side records, a scrape reads."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests = collections.Counter()   # by outcome: ok, error, cancelled, rejected
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.drafted_tokens = self.accepted_tokens = 0  # speculative decoding (--lookup)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self._recent: collections.deque = collections.deque()  # (time, generated tokens) of the last 10 s

    def request(self, outcome: str, prompt_tokens: int = 0, generated: int = 0, drafted: int = 0,
                accepted: int = 0) -> None:
        with self._lock:
            self.requests[outcome] += 1
            self.prompt_tokens += prompt_tokens
            self.generated_tokens += generated
            self.drafted_tokens += drafted
            self.accepted_tokens += accepted

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def tokens(self, n: int, gap: float | None) -> None:
        """n tokens arrived for one sequence, `gap` seconds after its previous ones (None: its first)."""
        now = time.monotonic()
        with self._lock:
            if gap is not None:
                self.itl.observe(gap)
            self._recent.append((now, n))
            while self._recent and self._recent[0][0] < now - 10.0:
                self._recent.popleft()

    def text(self, running: int, waiting: int, blocks_used: int, blocks: int) -> str:
        with self._lock:
            now = time.monotonic()
            recent = sum(n for t, n in self._recent if t >= now - 10.0)
            lines = ["# TYPE minfer_requests_running gauge", f"minfer_requests_running {running}",
                     "# TYPE minfer_requests_waiting gauge", f"minfer_requests_waiting {waiting}",
                     "# TYPE minfer_requests_total counter"]
            for outcome in ("ok", "error", "cancelled", "rejected"):
                lines.append(f'minfer_requests_total{{outcome="{outcome}"}} {self.requests[outcome]}')
            lines += ["# TYPE minfer_prompt_tokens_total counter", f"minfer_prompt_tokens_total {self.prompt_tokens}",
                      "# TYPE minfer_generated_tokens_total counter",
                      f"minfer_generated_tokens_total {self.generated_tokens}",
                      "# TYPE minfer_drafted_tokens_total counter", f"minfer_drafted_tokens_total {self.drafted_tokens}",
                      "# TYPE minfer_accepted_tokens_total counter",
                      f"minfer_accepted_tokens_total {self.accepted_tokens}",
                      "# HELP minfer_generated_tokens_per_second generated tokens over the last 10 s",
                      "# TYPE minfer_generated_tokens_per_second gauge",
                      f"minfer_generated_tokens_per_second {recent / 10.0:.2f}",
                      "# TYPE minfer_kv_blocks_used gauge", f"minfer_kv_blocks_used {blocks_used}",
                      "# TYPE minfer_kv_blocks gauge", f"minfer_kv_blocks {blocks}",
                      "# TYPE minfer_time_to_first_token_seconds histogram",
                      *self.ttft.lines("minfer_time_to_first_token_seconds"),
                      "# TYPE minfer_inter_token_latency_seconds histogram",
                      *self.itl.lines("minfer_inter_token_latency_seconds")]
        return "\n".join(lines) + "\n"
