"""Every engine gets the same native knobs for every model and hardware config as recorded at main
(``tests/harness/knob_resolution.py`` wrote the fixture before per-engine knob blocks left the configs)."""

import json

from tests.harness.knob_resolution import FIXTURE, resolve_all


def test_every_engine_model_and_hardware_resolves_the_recorded_native_knobs():
    recorded = json.loads(FIXTURE.read_text())
    now = json.loads(json.dumps(resolve_all(), sort_keys=True, default=repr))
    assert set(now) == set(recorded)
    changed = {key: (recorded[key], now[key]) for key in recorded if now[key] != recorded[key]}
    assert not changed, f"{len(changed)} combinations resolve differently, e.g. {next(iter(changed.items()))}"
