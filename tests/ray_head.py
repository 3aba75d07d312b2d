"""One Ray head for the whole test session: ``ray start --head`` on the loopback address, joined by address.

Tests that use it are marked ``engine`` and share the ``xdist_group("ray")``, so one pytest worker runs
them all against this one head (a head costs ~10 s and ~1 GiB). It runs as its own process group with
its own temp dir (so no other ``ray.init`` on this host finds it), token auth, as Ray 2.60 heads have
by default, and a clean environment (no PYTHONPATH, another working directory: code reaches workers
through ``runtime_env``, as on a real cluster); it is killed at the end of the session, or with pytest itself (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

RAY = Path(sys.executable).with_name("ray")


@dataclass(frozen=True)
class RayHead:
    address: str      # 127.0.0.1:<port> (Ray maps a loopback address to this node's IP)
    token_path: str   # the head's auth token, which a joining driver needs
    num_cpus: int

    @property
    def auth_env(self) -> dict[str, str]:
        """What a driver needs in its environment to join this head (its token)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token_path}

    @property
    def driver_env(self) -> dict[str, str]:
        """A driver process's whole environment: this one's without PYTHONPATH (code reaches Ray's workers
        through ``runtime_env``, never a shared path), plus the token."""
        return {**clean_env(), **self.auth_env}


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH, and with no usage report (no network at run time)."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(num_cpus: int = 4):
    """A generator: yields a running :class:`RayHead`, then stops it and checks nothing was left behind."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="trh", dir="/tmp")   # short: Ray's socket paths live under it
    token = Path(temp) / "token"
    token.write_text(secrets.token_hex(32))
    head_log = Path(temp) / "head.log"
    with open(head_log, "w") as log:
        head = subprocess.Popen(
            [str(RAY), "start", "--head", "--block", f"--port={port}", f"--num-cpus={num_cpus}", "--num-gpus=0",
             f"--temp-dir={temp}", "--include-dashboard=false", "--disable-usage-stats",
             f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=temp,
            env={**clean_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)},
            preexec_fn=_die_with_parent)
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in head_log.read_text():
        assert head.poll() is None and time.monotonic() < deadline, head_log.read_text()[-3000:]
        time.sleep(0.5)
    try:
        yield RayHead(f"127.0.0.1:{port}", str(token), num_cpus)
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:   # it drains for up to 30 s first
            pass
        _kill_group(head.pid)
    assert not _group_alive(head.pid), "the Ray head left processes behind"


def _die_with_parent() -> None:
    """SIGTERM to the head when pytest itself is killed (no teardown runs then); it stops its processes."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    time.sleep(1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(os.getpgid(int(p.name)) == pgid for p in Path("/proc").iterdir() if p.name.isdigit()
               and _state(p) not in ("Z", None))


def _state(proc: Path) -> str | None:
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
