"""One rate definition for every engine: output tokens over the generation span, start-up apart."""

from harness.run.measure import measurement_columns


def _result(inside: float) -> dict:
    one = {"wall_s": 10.0, "startup_s": inside, "pass_s": 10.0 + inside, "requests": 5, "prompt_tokens": 50,
           "output_tokens": 1000, "cached_tokens": 0, "finished_s": [1.0, 2.0], "stats": {}}
    return {"start": {"startup_s": 3.0}, "passes": [one]}


def test_replica_start_up_inside_a_pass_is_start_up_and_the_job_wall_has_its_own_column() -> None:
    plain, ray = measurement_columns(_result(0.0)), measurement_columns(_result(20.0))
    assert plain["output_tok_s"] == ray["output_tok_s"] == 100.0, "the rate is over the generation span only"
    assert (plain["startup_s"], ray["startup_s"]) == (3.0, 23.0)
    assert (plain["job_wall_s"], ray["job_wall_s"]) == (13.0, 33.0)
    assert plain["wall_s"] == ray["wall_s"] == 10.0
