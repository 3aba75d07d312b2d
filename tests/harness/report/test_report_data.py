import pytest

from harness.core.errors import TroughputError
from harness.report.data import Filters, group_configs, load_runs


def test_rows_with_the_same_knobs_are_one_config_whose_samples_are_its_runs(results, row):
    directory = results(row(passes=(100, 110, 120)), row(passes=(90, 130, 140)), row(passes=(150, 160, 170)),
                        row(knobs={"max_num_seqs": 64}, passes=(300, 310, 320)))
    configs = group_configs(load_runs(directory)).set_index("label")
    assert set(configs.index) == {"max_num_seqs=8", "max_num_seqs=64"}
    eight = configs.loc["max_num_seqs=8"]
    assert sorted(eight["passes"]) == [90, 100, 110, 120, 130, 140, 150, 160, 170] and eight["n_rows"] == 3
    assert eight["run_values"] == [110, 130, 160] and eight["sample_kind"] == "runs"
    geometric = (110 * 130 * 160) ** (1 / 3)
    assert eight["output_tok_s"] == pytest.approx(geometric), "the runs' median passes' geometric mean (the rule's)"
    assert eight["ci_low"] <= geometric <= eight["ci_high"] and eight["runs_x_passes"] == "3 × 3"
    assert eight["cv_runs"] == pytest.approx(25.166 / 133.33, rel=1e-3) and bool(eight["runs_disagree"])
    sixty_four = configs.loc["max_num_seqs=64"]
    assert sixty_four["sample_kind"] == "passes" and sixty_four["output_tok_s"] == 310, "one run: its passes"


def test_runs_within_ten_percent_are_not_flagged(results, row):
    directory = results(row(passes=(100,)), row(passes=(105,)), row(passes=(109,)))
    config = group_configs(load_runs(directory)).iloc[0]
    assert not config["runs_disagree"] and config["runs_x_passes"] == "3 × 1"


def test_a_single_row_config_reproduces_its_rows_numbers(results, row):
    measured = row(passes=(100, 150, 125))
    configs = group_configs(load_runs(results(measured)))
    config = configs.iloc[0]
    for column in ("output_tok_s", "total_tok_s", "req_s"):
        assert config[column] == pytest.approx(measured[column])


def test_failed_rows_join_their_config_but_carry_no_measurement(results, row):
    directory = results(row(), row(status="oom", error="out of memory"),
                        row(knobs={"max_num_seqs": 512}, status="crash", error="boom"))
    configs = group_configs(load_runs(directory)).set_index("label")
    assert configs.loc["max_num_seqs=8", "n_ok"] == 1 and configs.loc["max_num_seqs=8", "n_failed"] == 1
    assert configs.loc["max_num_seqs=512", "n_passes"] == 0
    assert configs.loc["max_num_seqs=512", "failed_statuses"] == ["crash"]


def test_filters_by_study_model_hardware_dates_and_run_ids(results, row):
    rows = [row(study="s1", day=0), row(study="s2", day=1), row(model="big", day=2), row(hardware="h100", day=3)]
    directory = results(*rows)
    assert len(load_runs(directory, Filters(study="s1"))) == 1
    assert list(load_runs(directory, Filters(model="big"))["run_id"]) == [rows[2]["run_id"]]
    assert list(load_runs(directory, Filters(hardware="h100"))["run_id"]) == [rows[3]["run_id"]]
    assert len(load_runs(directory, Filters(since="2026-03-02", until="2026-03-03"))) == 2, "until is inclusive"
    assert len(load_runs(directory, Filters(run_ids=(rows[0]["run_id"], rows[3]["run_id"])))) == 2
    with pytest.raises(TroughputError, match="match the filters"):
        load_runs(directory, Filters(study="nope"))


def test_an_empty_results_folder_is_a_clear_error(tmp_path):
    with pytest.raises(TroughputError, match="run troughput-run first"):
        load_runs(tmp_path)


def test_one_workload_name_with_two_fingerprints_is_two_cells(results, row):
    directory = results(row(), row(workload_fingerprint="fp-other"))
    configs = group_configs(load_runs(directory))
    assert sorted(configs["workload_label"]) == ["unique@fp-other", "unique@fp-uniqu"]


def test_predicted_rows_are_left_out_unless_asked_for(results, row):
    directory = results(row(), row("sim", predicted=True), row(predicted=False))
    assert list(load_runs(directory)["engine"]) == ["vllm", "vllm"]
    assert sorted(load_runs(directory, Filters(include_predicted=True))["engine"]) == ["sim", "vllm", "vllm"]
