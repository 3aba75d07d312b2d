import math

import pytest

from harness.run.cost import devices, job_seconds


@pytest.mark.parametrize("engine, knobs, expected", [
    ("vllm", {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, 4),
    ("sglang", {"tp_size": 4, "pp_size": 2, "replicas": 2}, 16),
    ("trtllm", {"tensor_parallel_size": 8}, 8),
    ("vllm", {"tp_size": 4}, 1),             # an SGLang name means nothing to vLLM
    ("vllm", {}, 1),
])
def test_devices_are_replicas_times_tensor_times_pipeline_parallel_in_each_engines_names(engine, knobs, expected):
    assert devices(engine, knobs) == expected


def test_explicit_replicas_win_over_the_knob_and_nonsense_counts_as_one():
    assert devices("vllm", {"tensor_parallel_size": 2, "replicas": 4}, replicas=3) == 6
    assert devices("vllm", {"tensor_parallel_size": "two"}) == 1


def test_job_seconds_is_startup_plus_backlog_over_rate():
    assert job_seconds(30.0, 1000, 10.0) == pytest.approx(130.0)
    assert job_seconds(None, 1000, 10.0) == pytest.approx(100.0)
    assert math.isinf(job_seconds(5.0, 1000, 0.0)) and math.isinf(job_seconds(5.0, 1000, None))
