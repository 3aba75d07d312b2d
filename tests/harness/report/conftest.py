"""Synthetic results rows for report tests, written with the real writer into tmp_path."""

from __future__ import annotations

import itertools
import statistics
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from harness.run.results import prefixed, write_row

_COUNTER = itertools.count()
START = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)

WORKLOADS = {  # name -> (fingerprint, requests, input tokens, output tokens)
    "unique": ("fp-unique", 100, 12000, 4000),
    "prefix_heavy": ("fp-prefix", 64, 20000, 2048),
    "multimodal": ("fp-mm", 32, 3000, 1024),
}


def synthetic_row(engine: str = "vllm", workload: str = "unique", knobs: dict[str, Any] | None = None,
                  passes: tuple[float, ...] = (100.0, 110.0, 120.0), status: str = "ok", error: str = "",
                  model: str = "tiny", hardware: str = "cpu", day: int = 0, startup_s: float = 5.0,
                  compile_s: float | None = None, preemptions: int = 0, **extra: Any) -> dict[str, Any]:
    """A row shaped like the runner's: the median (low) pass speaks for the run, token counts are fixed."""
    n = next(_COUNTER)
    fingerprint, requests, inputs, outputs = WORKLOADS.get(workload, (f"fp-{workload}", 10, 1000, 100))
    when = START + timedelta(days=day, minutes=n)
    knobs = {"max_num_seqs": 8} if knobs is None else knobs
    row: dict[str, Any] = {
        "run_id": f"{when:%Y%m%dT%H%M%S}-{n:012x}", "timestamp": when.isoformat(), "status": status,
        "error": error, "failed_phase": None if status == "ok" else "generate", "engine": engine,
        "engine_version": "0.32.0", "model": model, "workload": workload, "workload_fingerprint": fingerprint,
        "ordering": "as_given", "hardware": hardware, "git_commit": "abc123", "env.cpu": "Test CPU",
        "env.gpu_count": 0, "command": f"troughput-run workload={workload} engine={engine} "
                                       + " ".join(f"engine.knobs.{k}={v}" for k, v in knobs.items()),
        "sweep_id": "sweep-1", **prefixed("knob", knobs), **extra,
    }
    if status == "ok":
        rate = statistics.median_low(passes)
        wall = outputs / rate
        row.update(output_tok_s=rate, output_tok_s_passes=list(passes), wall_s=wall, requests_done=requests,
                   input_tokens=inputs, output_tokens=outputs, total_tok_s=(inputs + outputs) / wall,
                   req_s=requests / wall, preemptions=preemptions, prefix_cache_hit_rate=0.5,
                   startup_s=startup_s, compile_s=compile_s)
    return row


@pytest.fixture
def results(tmp_path: Path):
    """``results(*rows)`` writes rows into ``tmp_path/results`` and returns that folder."""
    directory = tmp_path / "results"

    def write(*rows: dict[str, Any]) -> Path:
        for row in rows:
            write_row(directory, row)
        return directory

    return write


@pytest.fixture
def row():
    return synthetic_row


def comparison_rows() -> list[dict[str, Any]]:
    """Two engines x three workloads x two configs, three interleaved runs (rounds) each, one failed run."""
    rows = []
    for round_, drift in ((1, 1.0), (2, 0.98), (3, 1.03)):
        for workload, scale in (("unique", 1.0), ("prefix_heavy", 2.0), ("multimodal", 0.5)):
            for engine, factor in (("vllm", 1.0), ("sglang", 0.7)):
                for seqs, gain in ((8, 1.0), (64, 2.5)):
                    base = 100 * scale * factor * gain * drift
                    rows.append(synthetic_row(engine, workload, {"max_num_seqs": seqs},
                                              passes=(base * 0.97, base, base * 1.02), startup_s=4 + factor,
                                              compile_s=2.0 if engine == "vllm" else None, preemptions=seqs // 8,
                                              round=round_))
    rows.append(synthetic_row("vllm", "unique", {"max_num_seqs": 512}, status="oom",
                              error="CUDA out of memory while allocating the KV cache\nTried to allocate 2 GiB"))
    return rows


@pytest.fixture
def comparison():
    return comparison_rows()
