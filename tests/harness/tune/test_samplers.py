"""SobolStart: a quasi-random start (balanced, resumable, seed trials not counted), then the sampler it wraps."""

import math
from pathlib import Path

import optuna
import pytest

from harness.tune.samplers import SobolStart, from_unit

pytest.importorskip("scipy")
optuna.logging.set_verbosity(optuna.logging.ERROR)
QUARTERS = optuna.distributions.IntDistribution(0, 3)


class Fixed(optuna.samplers.RandomSampler):
    """Stands for TPE after the start: always proposes the same value."""

    def sample_independent(self, study, trial, param_name, param_distribution):
        return 3


def study_with(sampler, seeds: int = 0) -> optuna.Study:
    study = optuna.create_study(sampler=sampler)
    for i in range(seeds):
        study.enqueue_trial({"x": 0}, user_attrs={"seed": f"seed {i}"})
    return study


def asks(study: optuna.Study, n: int) -> list[int]:
    values = []
    for _ in range(n):
        trial = study.ask()
        values.append(trial.suggest_int("x", 0, 3))
        study.tell(trial, 1.0)
    return values


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_start_is_balanced_and_seed_trials_do_not_use_it_up(seed):
    study = study_with(SobolStart(Fixed(), n=4, seed=seed), seeds=2)
    values = asks(study, 2 + 4 + 2)
    assert values[:2] == [0, 0]                   # the enqueued seeds keep their params
    assert sorted(values[2:6]) == [0, 1, 2, 3]    # four Sobol points fill the four quarters, none twice
    assert values[6:] == [3, 3]                   # then the wrapped sampler


def test_a_resumed_study_continues_the_sequence():
    first = study_with(SobolStart(Fixed(), n=4, seed=5))
    asks(first, 2)
    resumed = optuna.create_study(sampler=SobolStart(Fixed(), n=4, seed=5), storage=None)
    for t in first.get_trials():
        resumed.add_trial(t)
    whole = study_with(SobolStart(Fixed(), n=4, seed=5))
    assert asks(resumed, 2) == asks(whole, 4)[2:]


def test_from_unit_covers_each_distribution_in_its_own_scale():
    log_int = optuna.distributions.IntDistribution(16, 1024, log=True)
    assert from_unit(0.0, log_int) == 16 and from_unit(0.999999, log_int) == 1024
    assert from_unit(0.5, log_int) == int(math.exp((math.log(16) + math.log(1025)) / 2))
    assert from_unit(0.5, optuna.distributions.FloatDistribution(0.8, 0.9)) == pytest.approx(0.85)
    assert from_unit(0.99, optuna.distributions.CategoricalDistribution([True, False])) is False
    assert from_unit(0.7, QUARTERS) == 2


def test_the_tuner_default_is_multivariate_tpe_after_four_random_trials_and_sobol_is_offered():
    from omegaconf import OmegaConf

    from harness.tune.study import make_sampler

    tune = {"sampler": "tpe", "seed": 0, "n_startup_trials": None, "startup": None}
    default = make_sampler(OmegaConf.create({"tune": tune}))
    assert isinstance(default, optuna.samplers.TPESampler) and default._n_startup_trials == 4
    assert default._multivariate
    shipped = OmegaConf.load(Path(__file__).resolve().parents[3] / "conf" / "tuning.yaml").tune
    assert shipped.multivariate is True and shipped.startup == "random" and shipped.n_startup_trials is None
    sobol = make_sampler(OmegaConf.create({"tune": {**tune, "startup": "sobol"}}))
    assert isinstance(sobol, SobolStart) and sobol._n == 4
    assert isinstance(sobol._then, optuna.samplers.TPESampler)
