import optuna
import pytest

from harness.core.errors import TroughputError
from harness.tune.space import NOTCH, SearchSpace

SPACE = {
    "params": {
        "engine.canonical.chunked_prefill": {"type": "categorical", "choices": [True, False]},
        "engine.canonical.max_seqs": {"type": "int", "low": 4, "high": 512, "log": True, "memory": True},
        "engine.canonical.max_tokens_per_step": {"type": "int", "low": 64, "high": 8192, "log": True, "memory": True},
    },
    "constraints": [
        {"param": "engine.canonical.max_tokens_per_step", "at_least": "engine.canonical.max_seqs"},
        {"param": "engine.canonical.max_tokens_per_step", "at_least": "model.max_model_len",
         "unless": "engine.canonical.chunked_prefill"},
    ],
}
BASE = {"model": {"max_model_len": 1024}}


def proposals(space, n=60, seed=0):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    return [space.suggest(study.ask(), BASE) for _ in range(n)]


def test_invalid_combinations_are_never_proposed():
    space = SearchSpace(SPACE)
    for values in proposals(space):
        seqs, budget = values["engine.canonical.max_seqs"], values["engine.canonical.max_tokens_per_step"]
        assert budget >= seqs
        if not values["engine.canonical.chunked_prefill"]:
            assert budget >= 1024
        assert space.check(values, BASE) is None


def test_check_names_the_broken_rule():
    space = SearchSpace(SPACE)
    broken = {"engine.canonical.max_seqs": 256, "engine.canonical.max_tokens_per_step": 128,
              "engine.canonical.chunked_prefill": True}
    assert "max_tokens_per_step=128 < engine.canonical.max_seqs=256" in space.check(broken, BASE)


def test_a_memory_failure_caps_later_proposals_one_notch_below():
    space = SearchSpace(SPACE)
    space.learn_memory_edge({"engine.canonical.max_seqs": 100, "engine.canonical.max_tokens_per_step": 4000})
    for values in proposals(space):
        assert values["engine.canonical.max_seqs"] <= 100 * NOTCH
        assert values["engine.canonical.max_tokens_per_step"] <= 4000 * NOTCH
    space.learn_memory_edge({"engine.canonical.max_seqs": 200})
    assert space.memory_caps["engine.canonical.max_seqs"] == 100, "the smallest failing value wins"


def test_clip_moves_hand_written_seeds_into_the_space():
    space = SearchSpace(SPACE)
    clipped = space.clip({"engine.canonical.max_seqs": 4096, "engine.canonical.max_tokens_per_step": 16,
                          "engine.canonical.chunked_prefill": True}, BASE)
    assert clipped == {"engine.canonical.max_seqs": 512, "engine.canonical.max_tokens_per_step": 512,
                       "engine.canonical.chunked_prefill": True}


def test_grid_values_cover_the_range():
    space = SearchSpace(SPACE)
    assert space.params[1].grid(4) == [4, 20, 102, 512]
    assert space.params[0].grid() == [True, False]


@pytest.mark.parametrize("bad, message", [
    ({"params": {}}, "no params"),
    ({"params": {"a": {"type": "int", "low": 5, "high": 1}}}, "low <= high"),
    ({"params": {"a": {"type": "bool"}}}, "type must be one of"),
    ({"params": {"a": {"type": "categorical"}}}, "needs choices"),
    ({"params": {"a": {"type": "int", "low": 1, "high": 2}}, "constraints": [{"param": "b", "at_least": "a"}]},
     "not a param"),
    ({"params": {"a": {"type": "int", "low": 1, "high": 2}, "b": {"type": "int", "low": 1, "high": 2}},
      "constraints": [{"param": "a", "at_least": "b"}]}, "must come before"),
])
def test_bad_spaces_fail_clearly(bad, message):
    with pytest.raises(TroughputError, match=message):
        SearchSpace(bad)
