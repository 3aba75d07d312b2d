"""Every engine gets the same native knobs for every model and hardware config as recorded at main
(``tests/harness/knob_resolution.py`` wrote the fixture before per-engine knob blocks left the configs)."""

import json

import pytest

from tests.harness.knob_resolution import ENGINES, FIXTURE, resolve_all


def test_the_recording_covers_every_engine():
    assert {key.split("/")[0] for key in json.loads(FIXTURE.read_text())} == set(ENGINES)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_model_and_hardware_resolves_the_recorded_native_knobs(engine):
    recorded = {k: v for k, v in json.loads(FIXTURE.read_text()).items() if k.startswith(f"{engine}/")}
    now = json.loads(json.dumps(resolve_all((engine,)), sort_keys=True, default=repr))
    assert set(now) == set(recorded)
    changed = {key: (recorded[key], now[key]) for key in recorded if now[key] != recorded[key]}
    assert not changed, f"{len(changed)} combinations resolve differently, e.g. {next(iter(changed.items()))}"
