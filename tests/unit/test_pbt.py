import numpy as np
import pytest

from dask_rl.algos import pbt
from dask_rl.config import ConfigError, from_dict


def test_truncation_selection_pairs_bottom_with_top():
    rng = np.random.default_rng(0)
    scores = {0: 10.0, 1: 50.0, 2: 30.0, 3: 5.0, 4: 40.0, 5: 45.0, 6: 1.0, 7: 20.0}
    exploits = pbt.truncation_selection(scores, 0.25, rng)
    assert {e.loser for e in exploits} == {6, 3}           # the two worst
    assert all(e.winner in (1, 5) for e in exploits)       # the two best
    assert pbt.truncation_selection({0: 1.0, 1: 2.0}, 0.25, rng) == [pbt.Exploit(0, 1)]


def test_explore_perturbs_or_resamples_within_the_range():
    rng = np.random.default_rng(1)
    space = {"learner.lr": (1e-4, 1e-2), "algo.ent_coef": (0.0, 0.1)}
    seen = set()
    for _ in range(200):
        new = pbt.explore({"learner.lr": 1e-3, "algo.ent_coef": 0.05}, space, rng,
                          resample_probability=0.25)
        assert 1e-4 <= new["learner.lr"] <= 1e-2 and 0 <= new["algo.ent_coef"] <= 0.1
        seen.add(round(new["learner.lr"], 10))
    assert {0.0008, 0.0012} <= seen        # x0.8 and x1.2
    assert len(seen) > 10                  # and resampled values
    no_resample = pbt.explore({"learner.lr": 1e-3}, {"learner.lr": (1e-4, 1e-2)}, rng,
                              resample_probability=0.0)
    assert no_resample["learner.lr"] in (pytest.approx(8e-4), pytest.approx(1.2e-3))


def test_sample_is_log_uniform_for_positive_ranges():
    rng = np.random.default_rng(2)
    lrs = [pbt.sample({"lr": (1e-4, 1e-2)}, rng)["lr"] for _ in range(2000)]
    assert 0.4 < np.mean(np.array(lrs) < 1e-3) < 0.6  # median at the geometric mean


def test_population_config_is_checked():
    with pytest.raises(ConfigError, match="population.hyperparameters.algo.clip: not a numeric"):
        from_dict({"population": {"hyperparameters": {"algo.clip": [1, 2]}}})
    with pytest.raises(ConfigError, match="only learner.lr and algo.. hyperparameters"):
        from_dict({"population": {"hyperparameters": {"learner.epochs": [1, 2]}}})
    with pytest.raises(ConfigError, match="expected \\[low, high\\]"):
        from_dict({"population": {"hyperparameters": {"learner.lr": [1e-3, 1e-4]}}})
    with pytest.raises(ConfigError, match="trains gradient learners"):
        from_dict({"algo": {"name": "es"}, "population": {}})
