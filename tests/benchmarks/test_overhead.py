"""benchmarks/overhead.py can fail: its checks on what vLLM's engine received and on both sides' token ids."""

import json

import pytest

from benchmarks.overhead import check_greedy, check_same_tokens, greedy_generate, read_ran, record_engine_requests

GREEDY = {"id": "0", "sampling_type": "GREEDY", "temperature": 0.0}


def test_greedy_check_passes_on_greedy_requests_and_fails_otherwise():
    assert check_greedy([{"engine_requests": [GREEDY, GREEDY], "output_token_ids": []}], 2) == []
    hot = {"id": "1", "sampling_type": "RANDOM", "temperature": 1.0}
    [problem] = check_greedy([{"engine_requests": [GREEDY, hot], "output_token_ids": []}], 2)
    assert "1 of 2 requests" in problem and "not greedy" in problem
    assert "received 1 requests" in check_greedy([{"engine_requests": [GREEDY], "output_token_ids": []}], 2)[0]
    assert "no pass" in check_greedy([], 2)[0], "nothing recorded means the wrapper never ran: a failure"
    warmup_then_timed = [{"engine_requests": [GREEDY], "output_token_ids": []},
                         {"engine_requests": [GREEDY] * 3, "output_token_ids": []}]
    assert check_greedy(warmup_then_timed, 3) == [], "the count is the timed (last) pass's"
    hot_warmup = [{"engine_requests": [hot], "output_token_ids": []}, *warmup_then_timed[1:]]
    assert "1 of 4 requests" in check_greedy(hot_warmup, 3)[0], "a hot warm-up is caught too"


def test_token_check_compares_every_request_in_order():
    ours = {"a": [1, 2, 3], "b": [4, 5]}
    assert check_same_tokens(ours, [[1, 2, 3], [4, 5]], ["a", "b"]) == []
    [problem] = check_same_tokens(ours, [[1, 2, 3], [4, 6]], ["a", "b"])
    assert "1 of 2 requests have different token ids, e.g. b from token 1" in problem
    [swapped] = check_same_tokens(ours, [[4, 5], [1, 2, 3]], ["a", "b"])
    assert "2 of 2" in swapped, "outputs are matched by position in the request order"
    assert "saved no output" in check_same_tokens({"a": [1, 2, 3]}, [[1, 2, 3], [4, 5]], ["a", "b"])[0]
    assert "returned 1 outputs" in check_same_tokens(ours, [[1, 2, 3]], ["a", "b"])[0]


class FakeEngine:
    def __init__(self):
        self.added = []

    def add_request(self, request_id, prompt, params, **kwargs):
        self.added.append(params)


class FakeLLM:
    """vLLM's ``LLM.generate`` shape: every prompt's params go to ``llm_engine.add_request``."""

    def __init__(self):
        self.llm_engine = FakeEngine()

    def generate(self, prompts, sampling_params=None, **kwargs):
        many = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        for i, (prompt, params) in enumerate(zip(prompts, many)):
            self.llm_engine.add_request(str(i), prompt, params)
        return []


@pytest.mark.engine   # imports vLLM (its real SamplingParams), though it starts no engine
@pytest.mark.xdist_group("vllm_adapter")   # the pytest worker that imports vLLM for tests/engines/test_vllm.py
def test_the_greedy_patch_is_seen_by_the_engine_and_its_absence_is_caught():
    sampling = pytest.importorskip("vllm.sampling_params")
    bench_params = [sampling.SamplingParams(n=1, temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=8)
                    for _ in range(3)]   # what vllm bench throughput builds

    unpatched, seen = FakeLLM(), []
    record_engine_requests(unpatched, seen)
    unpatched.generate(["p"] * 3, bench_params)
    assert "3 of 3 requests" in check_greedy([{"engine_requests": seen}], 3)[0]

    patched, seen = FakeLLM(), []
    greedy_generate(patched)
    record_engine_requests(patched, seen)
    patched.generate(["p"] * 3, bench_params)
    assert check_greedy([{"engine_requests": seen}], 3) == []
    assert all(p.temperature == 0.0 and p.max_tokens == 8 and p.ignore_eos for p in patched.llm_engine.added)


def test_recorded_passes_read_back(tmp_path):
    path = tmp_path / "round1.ran.jsonl"
    assert read_ran(path) == []
    path.write_text(json.dumps({"engine_requests": [GREEDY], "output_token_ids": [[1]]}) + "\n")
    assert read_ran(path)[0]["output_token_ids"] == [[1]]


def run_main(monkeypatch, tmp_path, ours, theirs, argv=()):
    """``overhead.main`` with both sides scripted (per-round rates), the checks passing; its exit status."""
    import sys
    from types import SimpleNamespace

    import benchmarks.overhead as overhead
    import harness.run.spec as spec_module

    spec = SimpleNamespace(repeats=3, results_dir=None, labels={}, workload=SimpleNamespace(name="unique", requests=[]),
                           ordering={"name": "as_given"}, warmup_requests=0, knobs={}, env={})
    monkeypatch.setattr(spec_module, "build_spec", lambda cfg: spec)
    ours_left, theirs_left = list(ours), list(theirs)
    monkeypatch.setattr(overhead, "run_troughput", lambda s, i: (ours_left.pop(0), 100, "", {}))
    monkeypatch.setattr(overhead, "run_vllm_bench", lambda s, r, d, name: (theirs_left.pop(0), 100, ""))
    monkeypatch.setattr(overhead, "read_ran", lambda path: [])
    monkeypatch.setattr(overhead, "check_greedy", lambda ran, n: [])
    monkeypatch.setattr(overhead, "check_same_tokens", lambda a, b, ids: [])
    monkeypatch.setattr(sys, "argv", ["overhead.py", "--rounds", str(len(ours)), "--results-dir", str(tmp_path),
                                      *argv])
    try:
        overhead.main()
    except SystemExit as ended:
        return ended.code or 0
    return 0


def test_a_clear_loss_against_vllm_bench_fails_the_benchmark(monkeypatch, tmp_path, capsys):
    code = run_main(monkeypatch, tmp_path, [800, 810, 790, 805], [1000, 1010, 995, 1005])   # troughput 20% slower
    assert code == 3
    assert "FAILED: troughput is a clear loser against vllm bench" in capsys.readouterr().out


@pytest.mark.parametrize("ours, theirs", [([1000, 1010, 995, 1005], [1001, 1009, 996, 1004]),   # equivalent
                                          ([700, 1400, 900, 1200], [1000, 1010, 995, 1005]),     # too close to call
                                          ([1200, 1210, 1190, 1205], [1000, 1010, 995, 1005])])  # troughput faster
def test_no_clear_loss_passes(monkeypatch, tmp_path, ours, theirs):
    assert run_main(monkeypatch, tmp_path, ours, theirs) == 0


def test_a_loss_under_the_minimum_effect_passes_and_the_effect_is_configurable(monkeypatch, tmp_path):
    ours, theirs = [990, 991, 989, 990], [1000, 1001, 999, 1000]   # 1% slower, very steady: real but small
    assert run_main(monkeypatch, tmp_path, ours, theirs) == 0
    assert run_main(monkeypatch, tmp_path, ours, theirs, ["--min-effect", "0.005"]) == 3


def test_a_failed_check_still_exits_1():
    from benchmarks.overhead import finish

    assert finish({"troughput": [800.0] * 3, "vllm": [1000.0] * 3}, failed_checks=1, failed_runs=0) == 1
    assert finish({"troughput": [], "vllm": []}, failed_checks=0, failed_runs=2) == 1
