"""The job's progress bar: requests done of the total, output tokens/s and the ETA."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    """Requests finished (committed shards plus what workers report mid-shard), output tok/s, ETA."""

    def __init__(self, total: int, done: int, enabled: bool = True, label: str = "troughput-batch"):
        self.bar = tqdm(total=total, initial=done, desc=label, unit="req", disable=not enabled, file=sys.stderr,
                        dynamic_ncols=True, smoothing=0.1)
        self.committed = done
        self.partial: dict[int, int] = {}  # worker -> requests finished in its current shard
        self.output_tokens = 0
        self.t0 = time.monotonic()

    def engines_up(self) -> None:
        """Measure the rate from now on (engine start is not generation)."""
        self.t0 = time.monotonic()

    def worker_progress(self, worker: int, done: int) -> None:
        self.partial[worker] = done
        self._show()

    def shard_done(self, worker: int, requests: int, output_tokens: int) -> None:
        self.partial.pop(worker, None)
        self.committed += requests
        self.output_tokens += output_tokens
        self._show()

    def rate(self) -> float:
        elapsed = time.monotonic() - self.t0
        return self.output_tokens / elapsed if elapsed > 0 else 0.0

    def _show(self) -> None:
        self.bar.n = min(self.bar.total, self.committed + sum(self.partial.values()))
        self.bar.set_postfix_str(f"{self.rate():,.0f} out tok/s", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()
