import pytest

from harness.core.errors import TroughputError
from harness.tune.objective import Objective

ROW = {"output_tok_s": 500.0, "total_tok_s": 2000.0, "startup_s": 30.0, "compile_s": 20.0,
       "preemptions": 10, "requests_done": 100}


def test_rates_are_maximised_and_job_time_minimised():
    assert Objective({}).directions == ["maximize"] and Objective({}).values(ROW) == [500.0]
    assert Objective({"objective": "total_tok_s"}).values(ROW) == [2000.0]
    job = Objective({"objective": "job_time", "backlog_tokens": 4_000_000})
    assert job.directions == ["minimize"]
    assert job.values(ROW) == [30.0 + 4_000_000 / 2000.0], "startup (compile included) + backlog / rate"


def test_multi_objective_adds_startup_which_includes_compile():
    objective = Objective({"multi_objective": True})
    assert objective.directions == ["maximize", "minimize"] and objective.values(ROW) == [500.0, 30.0]


def test_preemption_ceiling_is_a_named_constraint():
    assert Objective({}).constraint_values(ROW) == {}
    assert Objective({"max_preemption_rate": 0.05}).constraint_values(ROW) == {"preemption_rate": pytest.approx(0.05)}
    assert Objective({"max_preemption_rate": 0.2}).constraint_values(ROW)["preemption_rate"] < 0


def test_bad_objectives_fail_clearly():
    with pytest.raises(TroughputError, match="unknown objective"):
        Objective({"objective": "latency"})
    with pytest.raises(TroughputError, match="backlog_tokens"):
        Objective({"objective": "job_time", "backlog_tokens": -1})


def test_job_time_without_a_backlog_is_the_measured_job():
    row = {**ROW, "input_tokens": 6_000, "output_tokens": 2_000}
    assert Objective({"objective": "job_time"}).values(row) == [30.0 + 8_000 / 2000.0]
