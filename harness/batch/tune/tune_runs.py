"""The runs of an in-job tuning phase: which shards each takes, how many, and their record in the job folder.

``<output_dir>/tune/runs.jsonl`` holds one line per finished run (a trial, a main phase run), appended and fsynced
as it ends, so a job killed at any moment resumes with every finished run's measurement; a run that was cut short
has no line (its committed shards stay committed and count as output). ``<output_dir>/tune/study.db`` is the Optuna
study.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from engines.base import Request
from harness.batch.job.convert import Item, convert_shard
from harness.batch.job.plan import Plan
from harness.batch.job.shards import Index, iter_shards
from harness.core.errors import TroughputError
from harness.core.tokens import TextTokenizer
from harness.workloads.records import Options


@dataclass
class RunRecord:
    """One finished run of the job: its config, its shards and what it measured."""

    kind: str                      # trial | main
    label: str                     # "trial 3 (batch recipe)", "main", "main (engine defaults)"
    values: dict[str, Any]         # the config's params ({} = the engine defaults)
    shards: list[int]              # shards this run committed to the job's output
    requests: int = 0
    output_tokens: int = 0
    generation_s: float = 0.0      # engines up to last commit (engine start excluded)
    startup_s: float | None = None  # the engines' start (each run is one start, but a main phase on kept engines)
    wall_s: float = 0.0            # the run's whole time, start included
    status: str = "ok"             # ok | failed
    reason: str = ""
    trial: int | None = None       # the study's trial number (trials)
    full_engine_tok_s: float | None = None  # its config with the engines kept full, from its step trace
    full_engine_beyond: list[str] = field(default_factory=list)  # what of that replay lay past its own steps
    full_engine_note: str | None = None  # why it has no full-engine rate where it was asked for one (then: its rate)
    concurrency: float | None = None  # requests its engines run at once, where they say (``concurrency``)
    blocks: list[float] = field(default_factory=list)  # its fed-engine rate between commits (``tune_confirm``)
    engines_kept: bool = False     # it went on with the last run's engines, no start (the main phase, same config)
    pruned_at: int | None = None   # a trial the pruner stopped: its shards committed when it was (``tune_prune``)
    ahead_s: float = 0.0           # its workers were started that long before it (the first run's, ``start_ahead``)

    @property
    def fill(self) -> float | None:
        """Its requests ÷ what its engines run at once (under 2: one draining batch)."""
        return self.requests / self.concurrency if self.concurrency else None

    @property
    def rate(self) -> float | None:
        """Output tok/s over the run's generation time."""
        tokens = self.output_tokens
        return tokens / self.generation_s if self.status == "ok" and self.generation_s > 0 and tokens else None

    @property
    def value(self) -> float | None:
        """What the study is told: the full-engine rate where the run's steps give one, else its plain rate."""
        return self.full_engine_tok_s or self.rate

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "output_tok_s": self.rate, "fill": self.fill}


FIELDS = frozenset(f.name for f in fields(RunRecord))


class RunLog:
    """``<output_dir>/tune/runs.jsonl``: the finished runs, oldest first."""

    def __init__(self, root: Path):
        self.path = root / "runs.jsonl"

    def read(self) -> list[RunRecord]:
        if not self.path.exists():
            return []
        records = []
        for n, line in enumerate(self.path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill while written: that run is not finished
                continue
            records.append(RunRecord(**{k: v for k, v in data.items() if k in FIELDS}))  # derived or newer keys
        return records

    def append(self, record: RunRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record.to_dict()) + "\n")
            f.flush()
            os.fsync(f.fileno())


def sample_order(shards: int, seed: int) -> list[int]:
    """Every shard index in a seeded random order: the order the tuning phase takes shards in.

    Shards are consecutive runs of records, so a run sees a random sample of the file's
    records in blocks of ``shard_size``, drawn from the whole file, not its first lines.
    """
    order = list(range(shards))
    random.Random(seed).shuffle(order)
    return order


def run_order(seeds: list[tuple[str, dict[str, Any]]], trials: int, at_once: Callable[[dict[str, Any]], int],
              own: str) -> list[tuple[str, dict[str, Any]]]:
    """The seeds' order, as (name, params): the one named ``own`` (the engine defaults) first, trial 0 wherever it is
    listed; then the next ``trials - 1`` distinct seeds as listed (a seed whose params another listed before it
    has already is left out: it would not run; equal as Python compares them, where Optuna's own skip also treats
    floats within 1e-5 alike and checks trials already in the study, so such a near-duplicate may still take a
    place and be skipped), run from the fewest sequences at once (``at_once``) to the most, so
    that the likeliest winner of a throughput job runs last and the main phase goes on with its engines; then the
    seeds that do not fit in the trials, as listed."""
    first = [seed for seed in seeds if seed[0] == own][:1]
    others, seen = [], [params for _, params in first]
    for seed in seeds:
        if seed not in first and seed[1] not in seen:
            others.append(seed)
            seen.append(seed[1])
    n = trials - len(first)
    return first + sorted(others[:n], key=lambda seed: at_once(seed[1])) + others[n:]


def shards_per_run(tune: dict[str, Any], index: Index, shard_size: int) -> int:
    """How many shards a trial takes: the tuning budget (``max_share`` of the job's shards) split evenly over the
    trials plus one, so that each measures as many tokens as the budget allows and the engine defaults' trial, the
    confirmation's side too, may take two (the confirmation runs inside the main phase and takes none of the
    budget); ``shards_per_run`` sets it by hand. A trial must hold at least ``min_run_requests``
    requests (several engine batches, so that ramp-up and the drain at its end are a small part of its time); a
    job too small for that is refused before any engine starts.
    """
    shards = index.shards(shard_size)
    runs = int(tune["trials"])
    budget = int(float(tune["max_share"]) * shards)
    given = tune.get("shards_per_run")
    min_requests = int(tune["min_run_requests"])
    k = int(given) if given else budget // (runs + 1)
    if given and k * runs > budget:
        raise TroughputError(f"batch.tune.shards_per_run={k} × {runs} trials = {k * runs} shards, over "
                             f"batch.tune.max_share={tune['max_share']} of the job's {shards} shards ({budget})")
    if k < 1 or k * shard_size < min_requests:
        per_run = math.ceil(min_requests / shard_size)
        need = math.ceil(per_run * (runs + (0 if given else 1)) / float(tune["max_share"])) * shard_size
        raise TroughputError(
            f"the job is too small for {runs} trials: trials of at least {min_requests} requests "
            f"(batch.tune.min_run_requests) within batch.tune.max_share={tune['max_share']} of its {index.records:,} "
            f"records needs about {need:,} records (shard_size {shard_size}). Use fewer trials, a lower "
            f"batch.tune.min_run_requests, or tune separately (troughput-tune) and run the job with batch.engine_file=")
    return k


def concurrency(limits: list[dict[str, Any]], lengths: list[tuple[int, int]],
                per_engine_cap: int | None = None) -> float | None:
    """How many of a run's requests its engines run at once: per engine, its ``max_num_seqs`` or the requests its
    KV cache holds, whichever is fewer (and at most ``per_engine_cap``: an engine fed one shard at a time runs
    at most a shard); summed over the engines. ``None`` where an engine does not say its ``max_num_seqs``
    (vLLM's adapter and the simulator do) or the run has no requests.

    What a request holds: its prompt plus half its output on average while it runs, weighted by its output
    length (a long output holds its KV for longer, so the requests running at any moment are the long ones):
    ``Σ o × (p + o/2) ÷ Σ o`` over the run's (prompt, output) token counts ``lengths``.

    A run of fewer than about 2× that many requests runs as one batch that drains: every request starts at
    once and the engine empties as the short ones finish, so it measures the drain, below what the same config
    does fed without end (the main phase); its full-engine rate (``harness.batch.tune.tune_predict``) does not."""
    if not limits or not lengths or any(not (lim or {}).get("max_num_seqs") for lim in limits):
        return None
    outputs = sum(o for _, o in lengths)
    held = (sum(o * (p + o / 2) for p, o in lengths) / outputs if outputs
            else sum(p for p, _ in lengths) / len(lengths))
    cap = per_engine_cap or math.inf
    return float(sum(min(lim["max_num_seqs"], cap, lim["kv_cache_tokens"] / held if lim.get("kv_cache_tokens") and held
                         else math.inf) for lim in limits))


def sample_requests(plan: Plan, index: Index, shards: set[int]) -> list[Request]:
    """The requests of ``shards`` as the engines get them (the job's sampling)."""
    return [i.request for i in _items(plan, index, shards, Options(plan.default_max_tokens, plan.sampling))
            if i.request is not None]


def sample_summary(plan: Plan, index: Index, shards: set[int]) -> dict[str, Any]:
    """Requests and requested prompt and output tokens of ``shards`` (what the sizing heuristic sizes for)."""
    requests = [i.request for i in _items(plan, index, shards, Options(plan.default_max_tokens, plan.sampling))
                if i.request is not None]
    return {"requests": max(len(requests), 1), "input_tokens_requested": sum(len(r.prompt_token_ids) for r in requests),
            "output_tokens_requested": sum(r.max_tokens for r in requests)}


def _items(plan: Plan, index: Index, shards: set[int], options: Options) -> Iterator[Item]:
    tok = TextTokenizer(Path(plan.model["local_dir"]))
    for shard in iter_shards(Path(plan.input), plan.format, plan.shard_size, shards.__contains__):
        yield from convert_shard(shard, plan.format, tok, options, index, Path(plan.input), plan.max_model_len,
                                 plan.served_models())
