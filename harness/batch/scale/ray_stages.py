"""The stages of ``batch.scale=ray``'s Ray Data pipeline; they run on the cluster's workers.

``ShardSource`` (read: the input streamed once, one row per uncommitted shard) → ``convert``
(tasks: chat template, tokenization, images; each record an ``Item``) → ``EngineStage`` (an
actor pool: one of troughput's engine adapters per actor, started once, fed the next shard while
the current one generates) →
``commit`` (tasks: OpenAI output lines, the shard committed in ``batch.output_dir`` as on one
node; a row of its ``meta.json`` and its engine steps for the driver's progress and the job's
step trace). Rows carry pickled Python objects
(``Item``, ``Request``, the engine's result) in binary columns, keyed by the ``shard`` column:
Ray Data does not keep order, and a block may hold several shards.
"""

from __future__ import annotations

import functools
import itertools
import os
import pickle
import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.batch.job.convert import convert_shard
from harness.batch.job.images import image_resolver, local_images, stored
from harness.batch.job.plan import Plan
from harness.batch.job.shards import Index, Shard, iter_shards
from harness.batch.job.state import JobState
from harness.ordering.policies import apply_ordering
from harness.workloads.records import Options


def shard_source(path: str, fmt: str, size: int, todo: list[int]) -> Any:
    """A Ray ``Datasource`` streaming the shards ``todo`` of ``path`` (one read task: the file is read once)."""
    import pyarrow as pa
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class ShardSource(Datasource):
        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                           data_context: Any = None) -> list[ReadTask]:
            def read():   # on the driver's node (label_selector): its local images are read here, with the records
                for shard in iter_shards(Path(path), fmt, size, set(todo).__contains__):
                    images = local_images(shard.records, Path(path).parent)
                    yield pa.table({"shard": [shard.index], "records": [pickle.dumps(shard.records)],
                                    "local_images": [pickle.dumps(images)]})

            meta = BlockMetadata(num_rows=len(todo), size_bytes=None, exec_stats=None, input_files=[path])
            return [ReadTask(read, meta)]

    return ShardSource()


@functools.lru_cache(maxsize=4)
def plan_of(plan_json: str) -> Plan:
    return Plan.from_json(plan_json)


@functools.lru_cache(maxsize=4)
def tokenizer_of(local_dir: str) -> Any:
    from harness.core.tokens import TextTokenizer

    return TextTokenizer(Path(local_dir))


def convert(batch: dict[str, np.ndarray], plan_json: str, duplicates: dict[int, int]) -> dict[str, np.ndarray]:
    """Each shard's records as ``Item``s, its requests in the job's order, and the bytes of their images (local ones
    as the read stage read them on the driver's node; ``data:`` and fetched ones stored on this node first)."""
    plan = plan_of(plan_json)
    store = Path(tempfile.gettempdir()) / "troughput-images"   # this node's: the output folder is the driver's
    items_col, requests_col, images_col = [], [], []
    for shard, records, read in zip(batch["shard"], batch["records"], batch["local_images"]):
        # local images come read with the records (from the driver's node), never looked up on this node
        options = Options(plan.default_max_tokens, plan.sampling, image_resolver(
            plan.model.get("image_token"), store, Path(plan.input).parent, plan.allow_remote_images,
            pickle.loads(read)))
        items = convert_shard(Shard(int(shard), pickle.loads(records)), plan.format, tokenizer_of(
            plan.model["local_dir"]), options, Index(0, duplicates), Path(plan.input), plan.max_model_len,
            plan.served_models())
        requests = apply_ordering([i.request for i in items if i.request is not None], plan.ordering)
        images = {p: Path(p).read_bytes() for r in requests for p in r.images}
        items_col.append(pickle.dumps(items))
        requests_col.append(pickle.dumps(requests))
        images_col.append(pickle.dumps(images))
    return {"shard": batch["shard"], "items": _binary(items_col), "requests": _binary(requests_col),
            "images": _binary(images_col)}


class EngineStage:
    """One engine in a Ray Data actor: started once, fed across shards as the local worker feeds it.

    Ray Data runs up to ``feeding.most_held`` calls at once on the actor (threads:
    ``max_concurrent_calls_per_actor`` with ``enable_true_multi_threading``). Each call
    waits at the actor's gate until its engine takes another shard by the one-node rule
    (``harness.batch.job.feeding.takes_another``: below ``batch.in_flight`` shards always, beyond that while
    the engine's unfinished requests are fewer than ``feed_below(shard_size, capacity)``), so an engine is
    topped up by its unfinished requests, not by a shard count. Then the call hands its shard to
    the actor's one feeding loop (``engines.batch_worker.feed_until_closed`` on a thread of its
    own, over the engine's ``Feeder``) and waits for that shard alone.

    An engine that fails inside the living actor (its feeding loop raises: vLLM's engine-core process
    killed for memory, an engine error mid-shard) makes the actor exit (``ENGINE_FAILED``) before
    any call sees the error: Ray restarts the actor (a new engine) and reruns the calls it held, as
    when the actor's process dies; ``batch.ray.max_restarts`` bounds the restarts of each actor, so a
    shard that fails every engine ends the job (committed shards stay) instead of looping.
    """

    def __init__(self, job: dict[str, Any], feeding: dict[str, int] | None = None, exit_on_failure: bool = False,
                 stall_timeout_s: float | None = None, report_key: str | None = None):
        from engines.batch_worker import start_engine

        self.report_key = report_key  # where an actor that ends itself says why, for the driver (``say``)
        hung = hung_before(report_key)
        if hung:   # an error in ``__init__`` is not a crash: Ray does not restart the actor, Ray Data stops the job
            raise StartHung(f"not restarted: this engine actor's start hung before ({hung})")
        watchdog = _start_watchdog(stall_timeout_s, report_key)   # the engine starts in this (the actor's main) thread
        try:
            self.engine, start = start_engine(job)
        finally:
            watchdog.set()
        self.capacity = (start.get("extra") or {}).get("max_num_seqs")
        self.about = {"engine_pid": os.getpid(), "engine_node": _node_id(),
                      "startup_s": start.get("startup_s"), "code_dir": str(Path(__file__).resolve().parents[3]),
                      **({"fault_hook": start["extra"]["fault_hook"]} if (start.get("extra") or {}).get("fault_hook")
                         else {})}   # a test hook set (engines.faults): in each shard's meta, for the row
        self.commands: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.waiting: dict[str, tuple[threading.Event, dict[str, Any]]] = {}
        self.lock = threading.Lock()
        self.turn = threading.Condition(self.lock)  # a call waits here until the engine takes its shard
        self.feeding = {"in_flight": 1, "shard_size": 1, **(feeding or {})}
        self.in_engine = 0     # shards handed to the engine, not finished
        self.sent = 0          # requests handed to the feeding loop
        self.pending, self.fed = 0, -1  # the loop's last report: unfinished requests, requests fed (-1: never)
        self.failure: str | None = None
        self.exit_on_failure = exit_on_failure
        self.calls = itertools.count()
        threading.Thread(target=self._feed, name="troughput-feed", daemon=True).start()

    def _report(self, flow: dict[str, Any]) -> None:
        """The feeding loop's progress: its unfinished requests, which open the gate when few are left."""
        if "pending" in flow:
            with self.turn:
                self.pending, self.fed = int(flow["pending"]), int(flow["fed"])
                self.turn.notify_all()

    def _takes(self) -> bool:
        from harness.batch.job.feeding import takes_another

        return takes_another(self.in_engine, self.feeding["in_flight"], self.feeding["shard_size"], self.pending,
                             self.sent, self.fed, self.capacity)

    def _feed(self) -> None:
        from engines.batch_worker import feed_until_closed
        from engines.feeding import feeder_for

        feeder = None
        try:
            feeder = feeder_for(self.engine)
            feed_until_closed(self.engine, feeder, self.commands, self._finished, progress=self._report,
                              capacity=self.capacity)
        except BaseException as e:  # noqa: BLE001 - the actor exits: Ray restarts it and reruns its calls
            why = f"{type(e).__name__}: {e}"
            if self.exit_on_failure:
                # never returns; ``self.failure`` stays unset meanwhile, so no call sees the error while the
                # engine stops (vLLM's stop takes seconds; a call at the gate that saw it would raise, and Ray
                # Data, which does not retry Python errors, would end the job)
                _exit_for_restart(self.engine, why, self.report_key)
            self.failure = why
        finally:
            if feeder is not None:
                feeder.close()
            with self.lock:
                self.failure = self.failure or "the engine's feeding loop ended"
                for event, _ in self.waiting.values():
                    event.set()
                self.turn.notify_all()

    def _finished(self, key: str, result: dict[str, Any]) -> None:
        with self.lock:
            event, slot = self.waiting[key]
        slot["result"] = result
        event.set()

    def generate(self, shard: int, requests: list[Any]) -> dict[str, Any]:
        """Feed one shard to the engine once it takes it (the gate) and wait for its ``result.json`` contents (other
        shards may be in it)."""
        key, event, slot = f"{shard}/{next(self.calls)}", threading.Event(), {}
        with self.turn:
            while not self.failure and not self._takes():
                self.turn.wait(timeout=0.5)
            if self.failure:
                raise RuntimeError(f"the engine failed: {self.failure}")
            self.waiting[key] = (event, slot)
            self.in_engine += 1
            self.sent += len(requests)
        self.commands.put({"shard": key, "requests": requests})
        event.wait()
        with self.turn:
            del self.waiting[key]
            self.in_engine -= 1
            self.turn.notify_all()
        if "result" not in slot:
            raise RuntimeError(f"the engine failed: {self.failure}")
        return slot["result"]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from engines.worker import peak_rss_bytes

        results = []
        for shard, requests, images in zip(batch["shard"], batch["requests"], batch["images"]):
            requests = _local_images(pickle.loads(requests), pickle.loads(images))
            started = time.time()
            result = self.generate(int(shard), requests)
            result["extra"] = {**self.about, "started_at": started, "peak_rss_bytes": peak_rss_bytes()}
            results.append(pickle.dumps(result))
        return {"shard": batch["shard"], "items": batch["items"], "result": _binary(results)}


ENGINE_FAILED = 70  # the actor's exit code when its engine failed inside it (EX_SOFTWARE)
ENGINE_HUNG = 71    # ... when its engine was still starting after batch.stall_timeout_s


REPORTS = "troughput-actor-exit"  # Ray's internal key-value store: ``<REPORTS>:<report_key>:<pid>`` -> why
HUNG = "troughput-start-hung"     # ... ``<HUNG>:<report_key>:<actor id>`` -> why: that actor's engine start hung


class StartHung(RuntimeError):
    """A restarted engine actor whose previous process's engine start hung (``hung_before``)."""


def _kv_put(name: str, value: str) -> None:
    try:
        from ray.experimental.internal_kv import _internal_kv_initialized, _internal_kv_put

        if _internal_kv_initialized():
            _internal_kv_put(name, value.encode(), overwrite=True)
    except Exception:  # noqa: BLE001, S110 - the reason is also in the actor's log
        pass


def _actor_id() -> str | None:
    """This Ray actor's id (kept across its restarts); ``None`` outside an actor."""
    try:
        import ray

        return ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001
        return None


def say(key: str | None, why: str) -> None:
    """Leave ``why`` where the driver finds it after Ray gave up (Ray's message for a dead actor has no reason)."""
    if key:
        _kv_put(f"{REPORTS}:{key}:{os.getpid()}", why)


def hung_before(key: str | None) -> str | None:
    """Why this actor's previous process ended, where its engine start hung (``_start_watchdog`` recorded it under
    the actor's id, which a restart keeps); ``None`` for a first start, or outside Ray."""
    actor = _actor_id() if key else None
    if actor is None:
        return None
    try:
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

        value = _internal_kv_get(f"{HUNG}:{key}:{actor}") if _internal_kv_initialized() else None
    except Exception:  # noqa: BLE001 - no store: the actor starts as a first one
        return None
    return value.decode() if value else None


def said(key: str) -> list[str]:
    """What the actors of one pipeline (``key``) said as they ended themselves, removed from the store (driver)."""
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get, _internal_kv_list

    reasons = []
    for name in _internal_kv_list(f"{REPORTS}:{key}:"):
        value = _internal_kv_get(name)
        if value:
            reasons.append(value.decode())
        _internal_kv_del(name)
    return reasons


def forget(key: str) -> None:
    """Remove what the actors of one pipeline (``key``) left in Ray's store (driver, once the pipeline is over: a
    separately started head keeps its store for every later job)."""
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_list

    for prefix in (REPORTS, HUNG):
        for name in _internal_kv_list(f"{prefix}:{key}:"):
            _internal_kv_del(name)


def _start_watchdog(limit: float | None, key: str | None = None) -> threading.Event:
    """An engine start that takes more than ``limit`` seconds (``batch.stall_timeout_s``) looks hung, as on one node:
    the actor exits with ``ENGINE_HUNG``. Ray restarts an actor whose process exits in ``__init__`` (a crash, not
    an error of its creation task) up to ``batch.ray.max_restarts`` times, and a restart would hang again: so the
    watchdog first records the hang under the actor's id (``HUNG``, in Ray's internal store, keyed by the pipeline),
    and the restarted actor reads it (``hung_before``) and raises in its ``__init__`` before starting an engine: an
    error Ray does not restart, and Ray Data ends the job at an actor that dies starting. So a hung start costs one
    ``limit``, the job stops, its committed shards stay, and the driver names the reason
    (``harness.batch.scale.ray_job.explain``). Set the returned event when the start is over."""
    import sys

    done = threading.Event()
    actor = _actor_id() if key else None   # in the actor's main thread

    def watch() -> None:
        if not done.wait(limit):
            why = (f"the engine was still starting after {limit:g} s: it looks hung, so troughput ended its actor "
                   f"and does not restart it (batch.stall_timeout_s={limit:g})")
            print(f"troughput: {why}", file=sys.stderr, flush=True)
            if actor is not None:
                _kv_put(f"{HUNG}:{key}:{actor}", why)   # before the exit: the restart must find it
            say(key, why)
            os._exit(ENGINE_HUNG)

    if limit:
        threading.Thread(target=watch, name="troughput-start-watchdog", daemon=True).start()
    return done


def _exit_for_restart(engine: Any, why: str, key: str | None = None) -> None:
    """End this actor's process, so that Ray restarts it and reruns the calls it held: the engine is stopped first
    where it stops within 10 s (its child processes go with it), and the reason goes to the actor's log."""
    import sys

    print(f"troughput: the engine failed inside this actor ({why}); exiting so that Ray restarts the actor and "
          f"reruns its shards", file=sys.stderr, flush=True)
    say(key, f"its engine failed inside the actor ({why[:300]}); the actor exited so that Ray restarts it")
    stopper = threading.Thread(target=lambda: engine.started and engine.stop(), daemon=True)
    stopper.start()
    stopper.join(10)
    os._exit(ENGINE_FAILED)


def _node_id() -> str | None:
    """The Ray node this actor runs on; ``None`` outside a Ray worker (the stage built directly)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _local_images(requests: list[Any], images: dict[str, bytes]) -> list[Any]:
    """Requests whose image files are missing on this node (converted on another) get local copies."""
    from dataclasses import replace

    if not images or all(Path(p).is_file() for p in images):
        return requests
    store = Path(tempfile.gettempdir()) / "troughput-images"
    local = {path: path if Path(path).is_file() else str(stored(data, store, Path(path).suffix))
             for path, data in images.items()}
    return [replace(r, images=[local[p] for p in r.images]) if r.images else r for r in requests]


def commit(batch: dict[str, np.ndarray], plan_json: str, job: str) -> dict[str, np.ndarray]:
    """Commit each shard (``harness.batch.job.job.commit_shard``); a row per shard: its meta, or nothing if it
    was there."""
    import json

    from harness.batch.job.job import commit_shard

    plan = plan_of(plan_json)
    state, tok = JobState(plan.output_dir), tokenizer_of(plan.model["local_dir"])
    metas, steps = [], []
    for shard, items, result in zip(batch["shard"], batch["items"], batch["result"]):
        result = pickle.loads(result)
        meta = commit_shard(plan, state, tok, job, int(shard), pickle.loads(items), result, result.get("extra"))
        metas.append(json.dumps(meta or {"index": int(shard), "dropped": True}))
        steps.append(json.dumps(result.get("steps") if meta else None))  # the driver keeps the job's trace
    return {"meta": np.array(metas, dtype=object), "steps": np.array(steps, dtype=object)}


def _binary(values: list[bytes]) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column
