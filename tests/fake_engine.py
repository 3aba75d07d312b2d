"""A scripted engine for runner tests: real worker process, no real model.

Knobs steer it: ``fail_in`` (start|generate) raises there, ``oom`` raises an
out-of-memory error, ``kill_self`` SIGKILLs the worker mid-generate,
``sleep_s`` sleeps in generate (for time limits), ``step_s`` sleeps per
batch of ``max_num_seqs`` requests (so throughput grows with it), and
``oom_above`` fails for memory when ``max_num_seqs`` exceeds it, and
``hold_mb`` holds that many MiB resident while generating, and ``fail_replica``
fails generate in that replica (1-based) of a data-parallel run, and ``sleep_cycle_s`` (a list) with
``cycle_file`` sleeps the next value of the list in each generate call, counting calls across
runs in that file (a scripted run-to-run spread). It echoes the prompt's last
token ``max_tokens`` times, so token counts are exact. ``token_s`` makes ``feeder()`` stream
(``engines.feeding.AsyncFeeder``): each request takes ``token_s`` per output token, at most
``max_num_seqs`` at once, like a continuous-batching engine fed while it runs: one loop steps every
running request a token each ``token_s`` and records each step in its step trace (``engines.steptrace``). ``dtype``:
``lossy`` changes every third output token (an output-changing knob, for the quality guard);
any other value leaves outputs as they are. ``hang_in: start`` hangs the start for good, in every replica or
only in replica ``hang_replica`` (1-based): a hung engine start, for the batch watchdog. ``start_file``: each
engine start adds one to the count in that file (before it hangs), so a test counts the starts across processes;
with ``fail_start_after`` N the starts after the Nth fail (the first ``fail_times`` of them, with ``fail_file``).
``fed_dir`` (with ``token_s``): each shard fed leaves a marker there (``<pid>-<n>.json``: the shard's key, its
request ids, this process's id and Ray node id, when), so a test sees which engine, on which node, held a shard.
``step_counter`` (with ``token_s``): the engine keeps its own count of steps since start, as vLLM does, starting
from that number, in ``stats().extra["engine_steps"]``; a count its step traces cannot give, so a test tells which
of the two a row holds. ``fail_after_steps``
(with ``token_s``): the engine fails (``RuntimeError``, every request it runs) after that many steps, mid-shard,
while its process lives; with ``fail_file`` only the first ``fail_times`` (default 1) engines do, counted across
processes in that file (an engine that fails once, then works after a restart). ``slow_after_steps`` (with
``token_s``): after that many steps since its start the engine's steps take ``slow_factor`` (default 100) times
as long (a config fast in its trial and slow in the main phase that goes on with its engines).
"""

from __future__ import annotations

import os
import signal
import time

from engines.base import Completion, Engine, EngineStats, KnobError, Request, StartInfo

KNOWN = {"fail_in", "oom", "kill_self", "sleep_s", "step_s", "oom_above", "hold_mb", "max_num_seqs",
         "fail_replica", "sleep_cycle_s", "cycle_file", "token_s", "dtype", "hang_in", "hang_replica",
         "fail_after_steps", "fail_file", "fail_times", "start_file", "fail_start_after", "fed_dir", "step_counter",
         "slow_after_steps", "slow_factor"}


class FakeEngine(Engine):
    name = "fake"
    step_trace_gap = "the scripted engine records steps only when it streams (knob token_s)"
    preload_modules = ("wave",)   # a module nothing else imports: a parked worker's preload is seen in sys.modules

    def validate(self) -> None:
        unknown = sorted(set(self.knobs) - KNOWN)
        if unknown:
            raise KnobError(f"unknown fake knob(s) {unknown}")

    def _hang(self, where: str) -> None:
        replica = os.environ.get("TROUGHPUT_REPLICA", "1/1").split("/")[0]
        if self.knobs.get("hang_in") == where and str(self.knobs.get("hang_replica", replica)) == replica:
            while True:
                time.sleep(3600)

    def start(self) -> StartInfo:
        if self.knobs.get("fail_in") == "start":
            raise RuntimeError("scripted failure in start")
        if self.knobs.get("start_file"):   # counted across processes, as fail_file is (engines.faults.claim)
            from engines.faults import claim

            claim(self.knobs["start_file"], 1 << 62)
            started = int(open(self.knobs["start_file"]).read().strip() or 0)
            if started > int(self.knobs.get("fail_start_after", 1 << 62)) and self._fails():
                raise RuntimeError(f"scripted failure in start {started}")
        self._hang("start")
        self.started = True
        self.generated = 0
        self.steps_counted = int(self.knobs.get("step_counter") or 0)   # its own count (knob step_counter)
        if "token_s" in self.knobs:   # it streams: a seat limit and a token a step, which the simulator replays
            self.records_steps, self.schedules_like = True, "vllm-v1"
        cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        return StartInfo(startup_s=0.01, engine_version="fake-1",
                         extra={"cores": cores, "replica": os.environ.get("TROUGHPUT_REPLICA", "1/1"),
                                "max_num_seqs": int(self.knobs.get("max_num_seqs", 8))})   # its seats

    def _cycle_sleep(self) -> float:
        cycle, path = self.knobs.get("sleep_cycle_s"), self.knobs.get("cycle_file")
        if not cycle or not path:
            return 0.0
        count = int(open(path).read() or 0) if os.path.exists(path) else 0
        with open(path, "w") as f:
            f.write(str(count + 1))
        return float(cycle[count % len(cycle)])

    def generate(self, requests: list[Request], on_finish=None) -> list[Completion]:
        self.require_started()
        seqs = int(self.knobs.get("max_num_seqs", 8))
        if self.knobs.get("oom") or seqs > self.knobs.get("oom_above", float("inf")):
            raise MemoryError("CUDA out of memory (scripted)")
        if self.knobs.get("kill_self"):
            os.kill(os.getpid(), signal.SIGKILL)
        replica = os.environ.get("TROUGHPUT_REPLICA", "1/1").split("/")[0]
        if self.knobs.get("fail_in") == "generate" or str(self.knobs.get("fail_replica")) == replica:
            raise RuntimeError("scripted failure in generate")
        held = bytearray(int(self.knobs.get("hold_mb", 0)) << 20)
        held[::4096] = b"x" * len(held[::4096])  # touch every page so it is resident
        time.sleep(float(self.knobs.get("sleep_s", 0)) + self._cycle_sleep())
        time.sleep(float(self.knobs.get("step_s", 0)) * -(-len(requests) // seqs))
        out = []
        for r in requests:
            out.append(Completion(r.id, len(r.prompt_token_ids), self._tokens(r), cached_tokens=0,
                                  finished_at=time.perf_counter()))
            self.generated += 1
            if on_finish:
                on_finish(1)
        return out

    def feeder(self):
        if "token_s" not in self.knobs:
            return super().feeder()
        import asyncio

        from engines.feeding import AsyncFeeder

        seats = asyncio.Semaphore(int(self.knobs.get("max_num_seqs", 8)))  # bound to the feeder's loop on first use
        running: dict[str, list] = {}   # request id -> [tokens left, its event]
        stepping: list[asyncio.Task] = []
        failure: list[BaseException] = []
        fail_after = self.knobs.get("fail_after_steps")
        fail_after = int(fail_after) if fail_after is not None and self._fails() else None
        taken = [0]
        queued = [0]   # requests waiting for a seat (the step trace's ``waiting``)

        async def steps() -> None:
            self.step_trace.begin()
            while running:
                slow = "slow_after_steps" in self.knobs and self.steps_counted >= int(self.knobs["slow_after_steps"])
                await asyncio.sleep(float(self.knobs["token_s"]) * (float(self.knobs.get("slow_factor", 100)) if slow
                                                                    else 1.0))
                taken[0] += 1
                if fail_after is not None and taken[0] > fail_after:   # the engine dies; its process lives
                    failure.append(RuntimeError(f"scripted engine failure after {fail_after} steps"))
                    for state in running.values():
                        state[1].set()
                    running.clear()
                    return
                n = len(running)
                self.steps_counted += 1
                for rid, state in list(running.items()):
                    state[0] -= 1
                    if state[0] <= 0:
                        state[1].set()
                        del running[rid]
                self.step_trace.record(running=n, decode=n, prefill=0, waiting=queued[0])

        async def one(r: Request) -> Completion:
            queued[0] += 1
            async with seats:
                queued[0] -= 1
                done = asyncio.Event()
                running[r.id] = [r.max_tokens, done]
                if not stepping or stepping[-1].done():
                    stepping.append(asyncio.ensure_future(steps()))
                await done.wait()
            if failure:
                raise failure[0]
            return Completion(r.id, len(r.prompt_token_ids), self._tokens(r), cached_tokens=0)

        feeder = AsyncFeeder(one)
        if self.knobs.get("fed_dir"):
            feed, fed = feeder.feed, iter(range(1 << 62))

            def marked(shard: str, requests: list[Request]) -> None:
                _mark_fed(self.knobs["fed_dir"], shard, requests, next(fed))
                feed(shard, requests)

            feeder.feed = marked
        return feeder

    def _fails(self) -> bool:
        """Whether this engine is one of the first ``fail_times`` to fail (all, without ``fail_file``): counted as
        real engines count ``TROUGHPUT_FAULT_FILE`` (``engines.faults``)."""
        from engines.faults import claim

        return claim(self.knobs.get("fail_file"), int(self.knobs.get("fail_times", 1)))

    def _tokens(self, r: Request) -> list[int]:
        """The prompt's last token ``max_tokens`` times; with ``dtype=lossy`` every third one is another."""
        last = r.prompt_token_ids[-1]
        lossy = self.knobs.get("dtype") == "lossy"
        return [last + 1 if lossy and i % 3 == 2 else last for i in range(r.max_tokens)]

    def stats(self) -> EngineStats:
        counted = {"engine_steps": getattr(self, "steps_counted", 0)} if "step_counter" in self.knobs else {}
        return EngineStats(preemptions=0, prefix_cache_queries=0, prefix_cache_hits=0, extra=counted)

    def stop(self) -> None:
        self.started = False


def _mark_fed(folder: str, shard: str, requests: list[Request], n: int) -> None:
    """A marker of one shard fed to this engine (knob ``fed_dir``), written whole (renamed into place)."""
    import json
    import sys
    from pathlib import Path

    node = None
    if "ray" in sys.modules:   # in a Ray actor: the node it runs on
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    path = Path(folder) / f"{os.getpid()}-{n}.json"
    path.with_suffix(".tmp").write_text(json.dumps({"shard": shard, "ids": [r.id for r in requests],
                                                    "pid": os.getpid(), "node": node, "at": time.time()}))
    os.replace(path.with_suffix(".tmp"), path)
