"""SGLang's Forward Pass Metrics (FPM) as the step trace: one message per scheduler iteration.

Read from the 0.5.23 wheel (``sglang/srt/observability/forward_pass_metrics.py``,
``srt/managers/scheduler_components/metrics_reporter.py``): with ``enable_forward_pass_metrics`` the
scheduler of each DP rank binds a ZMQ PUB socket at ``<forward_pass_metrics_ipc_name>.<dp_rank>`` and,
once a forward pass's CUDA events are complete (checked as later passes run), publishes
``(b"", 8-byte big-endian sequence number, msgpack ForwardPassMetrics)``;
that module's ``decode`` reads the payload. ``wall_time`` is the pass's span on the GPU in seconds (CUDA
events), ``scheduled_requests`` what the pass held, ``queued_requests`` the waiting queue; an idle
heartbeat is all zeros. Names as recorded in ``engines/snapshots/sglang-0.5.23.json``.
Worker side: standard library, and pyzmq (an SGLang dependency) once listening.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

from engines.statread import ANY, StatReader
from engines.steptrace import StepRecorder

FPM_MODULE = "sglang.srt.observability.forward_pass_metrics"
_WHERE = "ForwardPassMetrics"


def fpm_kwargs(knobs: dict[str, Any], folder: str) -> dict[str, Any]:
    """``ServerArgs`` that turn FPM on, publishing under ``folder``; knobs that set them win."""
    return {"enable_forward_pass_metrics": True, "forward_pass_metrics_ipc_name": f"ipc://{folder}/fpm",
            **{k: v for k, v in knobs.items() if k in ("enable_forward_pass_metrics", "forward_pass_metrics_ipc_name")}}


def endpoints(kwargs: dict[str, Any]) -> list[str]:
    """Where each DP rank's scheduler publishes (``<ipc name>.<dp_rank>``); none when FPM is off."""
    if not kwargs.get("enable_forward_pass_metrics") or not kwargs.get("forward_pass_metrics_ipc_name"):
        return []
    return [f"{kwargs['forward_pass_metrics_ipc_name']}.{rank}" for rank in range(int(kwargs.get("dp_size") or 1))]


def fpm_step(metrics: Any, reader: StatReader) -> dict[str, Any] | None:
    """One ``ForwardPassMetrics`` as ``StepRecorder.record`` keywords; ``None`` for an idle heartbeat or one
    missing a count (with a warning).

    ``dt`` is ``wall_time``; ``prefill_seqs``/``prefill``/``decode`` are the scheduled prefill requests, their
    new tokens and the decode requests; ``context`` the tokens the scheduled requests attend (decode KV, prefill
    prefix and new tokens, a shared prefix once per request); ``waiting`` the queued requests. FPM counts
    neither the KV pool's use (``kv_tokens`` -1) nor preemptions.
    """
    scheduled = reader.read(metrics, "scheduled_requests", kind=ANY, where=_WHERE)
    queued = reader.read(metrics, "queued_requests", kind=ANY, where=_WHERE)
    wall = reader.read(metrics, "wall_time", where=_WHERE)
    names = ("num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens", "num_decode_requests",
             "sum_decode_kv_tokens")
    counts = [reader.read(scheduled, n, where=f"{_WHERE}.scheduled_requests") for n in names]
    waiting = [reader.read(queued, n, where=f"{_WHERE}.queued_requests")
               for n in ("num_prefill_requests", "num_decode_requests")]
    if wall is None or any(c is None for c in counts):
        return None
    prefill_seqs, prefill, prefix, decode, decode_kv = (int(c) for c in counts)
    if prefill_seqs + decode == 0:
        return None   # the idle heartbeat
    return {"dt": float(wall), "running": prefill_seqs + decode, "decode": decode, "prefill": prefill,
            "prefill_seqs": prefill_seqs, "waiting": -1 if None in waiting else int(sum(waiting)),
            "context": decode_kv + prefix + prefill, "decode_context": decode_kv}


class FpmListener:
    """Subscribes to every endpoint on a daemon thread, keeping each message with the moment it arrived;
    ``drain`` (on the caller's thread) records them into ``steps``, each ending as it arrived.

    ``lost`` counts messages missing from each publisher's sequence (dropped past ZMQ's high-water mark).
    A message reaches the listener shortly after its pass; one still under way when ``drain`` runs is
    recorded by the next ``drain``.
    """

    def __init__(self, addresses: list[str], steps: StepRecorder, reader: StatReader,
                 decode: Callable[[bytes], Any]):
        import zmq

        self.steps, self.reader, self.decode = steps, reader, decode
        self.inbox: collections.deque[tuple[float, int, bytes, bytes]] = collections.deque()
        self.last: dict[int, int] = {}
        self.lost = 0
        self.arrived_at = float("-inf")
        self.lock = threading.Lock()
        self.context = zmq.Context()
        self.sockets = []
        for address in addresses:
            socket = self.context.socket(zmq.SUB)
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            socket.connect(address)
            self.sockets.append(socket)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._listen, name="sglang-fpm", daemon=True)
        self.thread.start()

    def _listen(self) -> None:
        import zmq

        poller = zmq.Poller()
        for socket in self.sockets:
            poller.register(socket, zmq.POLLIN)
        index = {socket: i for i, socket in enumerate(self.sockets)}
        while not self.stop_event.is_set():
            for socket, _ in poller.poll(100):
                while True:
                    try:
                        parts = socket.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(parts) == 3:
                        self.arrived_at = self.steps.clock()
                        self.inbox.append((self.arrived_at, index[socket], parts[1], parts[2]))

    def drain(self, quiet_s: float = 0.0, limit_s: float = 0.5) -> None:
        """Record what arrived, in arrival order; with ``quiet_s``, until none arrived for that long (at most
        ``limit_s``), so that the last passes' messages are in."""
        deadline = time.monotonic() + limit_s
        while True:
            with self.lock:
                while self.inbox:
                    self._record(*self.inbox.popleft())
            quiet = self.steps.clock() - self.arrived_at >= quiet_s
            if quiet_s <= 0 or time.monotonic() >= deadline or (quiet and not self.inbox):
                return
            time.sleep(quiet_s / 4)

    def _record(self, arrived: float, source: int, seq_bytes: bytes, payload: bytes) -> None:
        seq = int.from_bytes(seq_bytes, "big")
        if source in self.last and seq > self.last[source] + 1:
            self.lost += seq - self.last[source] - 1
        self.last[source] = seq
        try:
            metrics = self.decode(payload)
        except Exception as e:  # noqa: BLE001 - a stat never kills a run
            self.reader.warn(f"a forward pass metrics message did not decode ({type(e).__name__}: {e}); "
                             "its step is not recorded")
            return
        step = fpm_step(metrics, self.reader)
        if step is not None:
            self.steps.record(**step, end=arrived)

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=2)
        for socket in self.sockets:
            socket.close(linger=0)
        self.context.term()
