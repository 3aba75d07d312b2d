"""engines.decoding: a request's own sampling and constraint, checked and read the same for every adapter."""

import pytest

from engines.base import Request
from engines.decoding import check_constraint, check_sampling, decoding_of
from harness.workloads.base import fingerprint


def test_benchmark_request_is_greedy_and_exact_length():
    d = decoding_of(Request("a", [1, 2], 8))
    assert (d.max_tokens, d.ignore_eos, d.temperature, d.stop, d.constraint_kind) == (8, True, 0.0, (), None)


def test_own_sampling_or_a_constraint_stops_at_eos():
    sampled = decoding_of(Request("a", [1], 8, sampling={"temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n"]}))
    assert (sampled.ignore_eos, sampled.temperature, sampled.top_p, sampled.seed, sampled.stop) == (
        False, 0.7, 0.9, 3, ("\n",))
    constrained = decoding_of(Request("b", [1], 8, constraint={"kind": "choice", "value": ["yes", "no"]}))
    assert (constrained.ignore_eos, constrained.constraint_kind, constrained.constraint_value) == (
        False, "choice", ["yes", "no"])


def test_request_round_trips_through_dict():
    r = Request("a", [1], 4, sampling={"seed": 1}, constraint={"kind": "regex", "value": "[a-z]+"})
    assert Request.from_dict(r.to_dict()) == r


def test_sampling_checks_name_the_fault():
    assert check_sampling({"stop": "END", "temperature": 1}) == {"stop": ["END"], "temperature": 1}
    for bad, words in [({"top_k": 3}, "unknown sampling key"), ({"temperature": 3}, "temperature"),
                       ({"top_p": 0}, "top_p"), ({"seed": 1.5}, "seed"), ({"stop": ["a"] * 5}, "stop")]:
        with pytest.raises(ValueError, match=words):
            check_sampling(bad)


def test_constraint_checks_name_the_fault():
    assert check_constraint({"kind": "json_object", "value": {"x": 1}}) == {"kind": "json_object", "value": None}
    for bad, words in [({"kind": "grammar"}, "kind must be"), ({"kind": "json", "value": "x"}, "schema"),
                       ({"kind": "regex", "value": "("}, "does not compile"), ({"kind": "choice", "value": []}, "list")]:
        with pytest.raises(ValueError, match=words):
            check_constraint(bad)


def test_fingerprint_sees_constraint_but_keeps_benchmark_hashes():
    plain = [Request("a", [1, 2], 4)]
    constrained = [Request("a", [1, 2], 4, constraint={"kind": "choice", "value": ["x"]})]
    assert fingerprint(plain) != fingerprint(constrained)
    assert fingerprint(plain) == fingerprint([Request("a", [1, 2], 4)])


def test_vllm_sampling_keywords_for_benchmark_sampled_and_constrained_requests():
    from engines.vllm import sampling_kwargs

    assert sampling_kwargs(Request("a", [1], 8)) == {"max_tokens": 8, "ignore_eos": True, "temperature": 0.0,
                                                     "detokenize": False}
    sampled = sampling_kwargs(Request("b", [1], 8, sampling={"temperature": 0.7, "seed": 2, "stop": ["\n"]},
                                      constraint={"kind": "json_object", "value": None}))
    assert sampled == {"max_tokens": 8, "ignore_eos": False, "temperature": 0.7, "detokenize": True, "seed": 2,
                       "stop": ["\n"], "structured_outputs": {"json_object": True}}
    choice = sampling_kwargs(Request("c", [1], 8, constraint={"kind": "choice", "value": ["x", "y"]}))
    assert choice["structured_outputs"] == {"choice": ["x", "y"]} and choice["ignore_eos"] is False
