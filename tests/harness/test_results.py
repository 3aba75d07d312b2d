import json
import multiprocessing

import pytest

from harness.run.results import prefixed, new_run_id, read_results, read_rows, write_row


def _write_many(args):
    results_dir, worker = args
    for i in range(20):
        write_row(results_dir, {"run_id": new_run_id(), "worker": worker, "i": i})


def test_rows_round_trip_as_a_dataframe(tmp_path):
    write_row(tmp_path, {"run_id": "a", "status": "ok", **prefixed("knob", {"x": 1, "y": {"z": 2}})})
    write_row(tmp_path, {"run_id": "b", "status": "crash", "error": "boom"})
    frame = read_results(tmp_path)
    assert list(frame["run_id"]) == ["a", "b"]
    assert frame.loc[0, "knob.y.z"] == 2 and frame.loc[1, "error"] == "boom"
    assert set(frame["schema_version"]) == {1}


def test_a_row_is_never_rewritten(tmp_path):
    write_row(tmp_path, {"run_id": "same", "v": 1})
    with pytest.raises(FileExistsError):
        write_row(tmp_path, {"run_id": "same", "v": 2})
    assert read_rows(tmp_path) == [{"schema_version": 1, "run_id": "same", "v": 1}]
    assert not [p for p in (tmp_path / "runs").iterdir() if p.suffix != ".json"], "no temporary files left"


def test_concurrent_writers_lose_nothing(tmp_path):
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_write_many, [(tmp_path, w) for w in range(4)])
    rows = read_rows(tmp_path)
    assert len(rows) == 80 and len({r["run_id"] for r in rows}) == 80


def test_a_torn_file_is_skipped_not_fatal(tmp_path):
    write_row(tmp_path, {"run_id": "good"})
    (tmp_path / "runs" / "torn.json").write_text('{"run_id": "to')
    assert [r["run_id"] for r in read_rows(tmp_path)] == ["good"]
    json.loads((tmp_path / "runs" / "good.json").read_text())
