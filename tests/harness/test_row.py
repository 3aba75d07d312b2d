"""The row schema: every column a run writes is named in ``harness.run.row``, and the workload is summarised once."""

from harness.run import row as schema
from harness.workloads.base import Workload
from tests.harness.test_runner import WORKLOAD, run

NAMED = {*schema.IDENTITY, *schema.STATUS, *schema.SETTINGS, *schema.MEASUREMENTS, *schema.SPEED_OF_LIGHT,
         "run_seconds", "log_path", "git_commit"}
LABELS = {"command", "hardware", "round", "sweep_id", "study", "trial"}


def unnamed(row: dict) -> list[str]:
    return sorted(c for c in row if c not in NAMED | LABELS and not c.startswith(schema.PREFIXES))


def test_every_column_of_an_ok_and_a_failed_row_is_named_in_the_schema(tmp_path):
    ok = run(tmp_path, repeats=2, labels={"round": 1})
    failed = run(tmp_path, knobs={"nonsense": 1})
    assert ok["status"] == "ok" and failed["status"] == "invalid"
    assert unnamed(ok) == [] and unnamed(failed) == []
    assert ok["round"] == 1 and set(schema.IDENTITY) <= set(ok) and set(schema.STATUS) <= set(failed)


def test_a_row_summarises_its_workload_once(tmp_path, monkeypatch):
    calls = []
    real = Workload.summary

    def counted(self):
        calls.append(self.name)
        return real(self)

    monkeypatch.setattr(Workload, "summary", counted)
    run(tmp_path)
    assert calls == [WORKLOAD.name]
