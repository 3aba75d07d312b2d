"""The native knobs every engine receives for every model and hardware config, as recorded.

``python -m tests.harness.knob_resolution`` composes ``engine × model × hardware`` (Hydra's
compose API, as troughput-run does) and writes, per combination, the knobs the runner passes
to the adapter (``harness.run.spec.layered_knobs``) and the quality reference's knobs (its general
layers only), or the error a combination raises, to ``tests/harness/data/knob_resolution.json``.
``tests/harness/test_knob_resolution.py`` asserts the code still resolves exactly these: moving
per-engine defaults out of the model and hardware configs must not change what an engine gets.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data" / "knob_resolution.json"
ENGINES = ("vllm", "sglang", "trtllm", "hf", "sim", "ray")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


def resolve_all(engines: tuple[str, ...] = ENGINES) -> dict[str, Any]:
    """``"engine/model/hardware"`` -> ``{"knobs": ..., "reference_knobs": ...}`` or ``{"error": ...}``."""
    from hydra import compose, initialize_config_dir

    from harness.run.spec import layered_knobs

    out: dict[str, Any] = {}
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for engine in engines:
            for model in options("model"):
                for hardware in options("hardware"):
                    key = f"{engine}/{model}/{hardware}"
                    try:
                        cfg = compose("config", overrides=[f"engine={engine}", f"model={model}",
                                                           f"hardware={hardware}"])
                        out[key] = {"knobs": _summarised(layered_knobs(cfg)),
                                    "reference_knobs": _summarised(layered_knobs(cfg, general_only=True))}
                    except Exception as error:  # recorded: a combination must fail the same way
                        out[key] = {"error": f"{type(error).__name__}: {error}"}
    return out


def _summarised(knobs: dict[str, Any]) -> dict[str, Any]:
    """``knobs`` with the simulator's fitted calibration as its file's keys (refitting it is no knob change)."""
    if isinstance(knobs.get("calibration"), dict):
        knobs = {**knobs, "calibration": sorted(knobs["calibration"])}
    return knobs


def main() -> None:
    FIXTURE.write_text(json.dumps(resolve_all(), indent=1, sort_keys=True, default=repr) + "\n")
    print(f"wrote {FIXTURE.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
