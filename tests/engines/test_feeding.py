"""``engines.feeding`` and the batch worker's feeding loop on a scripted engine (no real engine starts)."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engines.base import Completion, EngineStats, Request
from engines.batch_worker import feed_until_closed
from engines.feeding import AsyncFeeder, ShardOutput, generate_isolating


def _request(rid: str, tokens: int = 2) -> Request:
    return Request(rid, [1, 2], tokens)


async def _run(request: Request) -> Completion:
    """Rejects ``bad*`` (``ValueError``), fails on ``boom`` (an engine fault), else sleeps 10 ms per token."""
    if request.id.startswith("bad"):
        raise ValueError("prompt too long")
    if request.id == "boom":
        raise RuntimeError("engine died")
    await asyncio.sleep(0.01 * request.max_tokens)
    return Completion(request.id, 2, [7] * request.max_tokens)


def _collect(feeder: AsyncFeeder, shards: int, deadline_s: float = 20.0) -> list[ShardOutput]:
    outs: list[ShardOutput] = []
    deadline = time.monotonic() + deadline_s
    while len(outs) < shards and time.monotonic() < deadline:
        outs += feeder.collect(timeout=0.05)
    return outs


def test_async_feeder_returns_shards_as_they_finish_with_rejected_requests_as_errors() -> None:
    feeder = AsyncFeeder(_run)
    try:
        feeder.feed("slow", [_request("s1", 100), _request("bad-1")])
        feeder.feed("empty", [])
        feeder.feed("fast", [_request("f1", 1), _request("f2", 1)])
        outs = _collect(feeder, 3)
    finally:
        feeder.close()
    assert [o.shard for o in outs] == ["empty", "fast", "slow"], "in the order they finish, not as fed"
    by = {o.shard: o for o in outs}
    assert [c.id for c in by["slow"].completions] == ["s1"] and list(by["slow"].errors) == ["bad-1"]
    assert "rejected" in by["slow"].errors["bad-1"] and by["empty"].completions == [] and feeder.idle()


def test_an_engine_fault_in_the_async_feeder_is_raised_not_taken_for_a_request_error() -> None:
    feeder = AsyncFeeder(_run)
    try:
        feeder.feed("s", [_request("a"), _request("boom")])
        with pytest.raises(RuntimeError, match="engine died"):
            _collect(feeder, 1)
    finally:
        feeder.close()


class _Serial:
    """A blocking engine that rejects (``ValueError``) any batch holding a ``bad*`` request."""

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, requests: list[Request]) -> list[Completion]:
        self.calls += 1
        if any(r.id.startswith("bad") for r in requests):
            raise ValueError("bad input")
        return [Completion(r.id, 2, [7] * r.max_tokens) for r in requests]

    def simulated_seconds(self) -> None:
        return None

    def startup_in_last_generate(self) -> float:
        return 0.0


def test_a_rejected_request_is_narrowed_down_by_halving_and_the_rest_run() -> None:
    done, errors = {}, {}
    generate_isolating(_Serial(), [_request(i) for i in ("a", "b", "bad-c", "d", "e")], done, errors, {})
    assert sorted(done) == ["a", "b", "d", "e"] and list(errors) == ["bad-c"]


class _Engine:
    """What ``feed_until_closed`` asks of an engine besides its feeder."""

    name = "scripted"
    supports_constraints = supports_sampling = False
    records_steps = False   # no step trace (engines.steptrace): a shard's ``steps`` is None

    def stats(self) -> EngineStats:
        return EngineStats()


def test_the_feeding_loop_finishes_every_shard_once_and_screens_what_the_engine_lacks() -> None:
    commands: queue.Queue = queue.Queue()
    unsupported = Request("c1", [1], 2, constraint={"kind": "json_object", "value": None})
    for key, requests in (("0", [_request("a", 30), _request("bad-b")]), ("1", [unsupported]),
                          ("2", [_request("d", 1)])):
        commands.put({"shard": key, "requests": requests})
    commands.put(None)
    results: dict[str, dict] = {}
    feeder = AsyncFeeder(_run)
    try:
        feed_until_closed(_Engine(), feeder, commands, lambda key, result: results.setdefault(key, result),
                          progress=False)
    finally:
        feeder.close()
    assert sorted(results) == ["0", "1", "2"]
    ids = [c["id"] for r in results.values() for c in r["completions"]]
    errors = [e for r in results.values() for e in r["errors"]]
    assert sorted(ids) == ["a", "d"] and sorted(errors) == ["bad-b", "c1"], "every request once: done or an error"
    assert "cannot constrain" in results["1"]["errors"]["c1"] and results["1"]["measured"]["requests"] == 0
    assert results["0"]["measured"]["output_tokens"] == 30 and results["0"]["measured"]["span_s"] > 0


def test_an_engine_fault_ends_the_feeding_loop() -> None:
    commands: queue.Queue = queue.Queue()
    commands.put({"shard": "0", "requests": [_request("boom")]})  # no end of input: the loop must still end
    feeder = AsyncFeeder(_run)
    try:
        with pytest.raises(RuntimeError, match="engine died"):
            feed_until_closed(_Engine(), feeder, commands, lambda key, result: None, progress=False)
    finally:
        feeder.close()


def test_a_restart_waits_for_the_shards_fed_before_it_and_leaves_the_later_ones_queued() -> None:
    """An in-job tuning's restart: the loop returns the command once shard 0 (in flight) is done; shard 1,
    sent after the restart, stays queued for the next engine."""
    commands: queue.Queue = queue.Queue()
    restart = {"restart": {"job": {"engine": "x", "knobs": {"max_num_seqs": 4}, "model": {}}}}
    commands.put({"shard": "0", "requests": [_request("a", 30)]})   # 0.3 s: still generating at the restart
    commands.put(restart)
    commands.put({"shard": "1", "requests": [_request("b")]})
    commands.put(None)
    results: dict[str, dict] = {}
    feeder = AsyncFeeder(_run)
    try:
        got = feed_until_closed(_Engine(), feeder, commands, lambda key, result: results.setdefault(key, result),
                                progress=False)
        assert got == restart and list(results) == ["0"], "shard 0 finished before the restart was returned"
        assert commands.get_nowait() == {"shard": "1", "requests": [_request("b")]}, "later commands wait"
        again = feed_until_closed(_Engine(), feeder, commands, lambda key, result: results.setdefault(key, result),
                                  progress=False)
        assert again is None and list(results) == ["0"], "end of input after the restart: nothing else ran here"
    finally:
        feeder.close()


def test_a_park_waits_for_the_shards_fed_before_it_and_a_parked_worker_takes_only_a_restart() -> None:
    """A slot an in-job tuning's run does not use: the loop returns the park once shard 0 is done; parked,
    another park changes nothing, a restart ends the wait, end of input too, and a shard is an error."""
    from engines.batch_worker import _while_parked

    commands: queue.Queue = queue.Queue()
    commands.put({"shard": "0", "requests": [_request("a", 30)]})   # 0.3 s: still generating at the park
    commands.put({"park": True})
    results: dict[str, dict] = {}
    feeder = AsyncFeeder(_run)
    try:
        got = feed_until_closed(_Engine(), feeder, commands, lambda key, result: results.setdefault(key, result),
                                progress=False)
    finally:
        feeder.close()
    assert got == {"park": True} and list(results) == ["0"], "shard 0 finished before the park was returned"
    restart = {"restart": {"job": {"engine": "x", "knobs": {}, "model": {}}}}
    for command in ({"park": True}, restart):
        commands.put(command)
    assert _while_parked(commands) == restart
    commands.put(None)
    assert _while_parked(commands) is None
    commands.put({"shard": "1", "requests": [_request("b")]})
    with pytest.raises(RuntimeError, match="a parked worker takes no shard"):
        _while_parked(commands)


def _parked_worker(tmp_path: Path, engine: str) -> tuple[list[dict], int]:
    """A batch worker parked at job start for ``engine``: once it says ``preloaded``, restart it with the fake
    engine and close its input; its events (up to its start, 30 s at most) and exit code."""
    import threading

    from tests.conftest import ROOT

    (tmp_path / "job.json").write_text(json.dumps({"park": True, "engine": engine}))
    with open(tmp_path / "stderr.log", "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "engines.batch_worker", str(tmp_path)], cwd=ROOT, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore
    events: list[dict] = []
    deadline = time.monotonic() + 30
    try:
        while not events or events[-1]["event"] != "started":
            try:
                events.append(json.loads(lines.get(timeout=max(0.1, deadline - time.monotonic()))))
            except queue.Empty:
                proc.kill()
                pytest.fail(f"no 'started' within 30 s; events {events}; "
                            f"stderr {(tmp_path / 'stderr.log').read_text()[-2000:]}")
            if events[-1].get("phase") == "preloaded":
                restart = {"engine": "tests.fake_engine:FakeEngine", "knobs": {}, "model": {}}
                proc.stdin.write(json.dumps({"restart": {"job": restart}}) + "\n")  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
        return events, proc.wait(timeout=60)
    finally:
        proc.kill()


def test_a_parked_worker_imports_its_engine_while_it_waits_and_then_starts_it(tmp_path: Path) -> None:
    """A slot parked at job start (``job.json``: a park naming the engine) imports the engine's package
    (``Engine.preload``) before the first restart reaches it; the restart then starts the engine."""
    events, code = _parked_worker(tmp_path, "tests.fake_engine:FakeEngine")
    assert code == 0
    phases = [e.get("phase") for e in events if e["event"] == "phase"]
    assert phases == ["parked", "preloaded", "start"]
    [preloaded] = [e for e in events if e.get("phase") == "preloaded"]
    assert preloaded["modules"] == ["wave"], "the fake engine's preload module was imported in the parked worker"


def test_a_parked_worker_whose_engine_cannot_be_imported_says_so_and_still_takes_its_restart(tmp_path: Path) -> None:
    """A preload that fails (here: no such engine class) is said, with its reason, and is not the worker's end."""
    events, code = _parked_worker(tmp_path, "no_such_engine_module_here:Nothing")
    assert code == 0
    [preloaded] = [e for e in events if e.get("phase") == "preloaded"]
    assert preloaded["modules"] == [] and "no_such_engine_module_here" in preloaded["error"]
    assert events[-1]["event"] == "started", "the restart that followed started its engine"


def test_preload_imports_what_an_engine_names_and_leaves_a_missing_package_to_its_start() -> None:
    from engines.base import Engine

    class Missing(Engine):  # type: ignore[abstract]
        preload_modules = ("no_such_engine_package_here", "colorsys")

    class Present(Engine):  # type: ignore[abstract]
        preload_modules = ("colorsys",)

    sys.modules.pop("colorsys", None)
    Missing.preload()
    assert "colorsys" not in sys.modules, "the first missing module ends the preload, without an error"
    Present.preload()
    assert "colorsys" in sys.modules
