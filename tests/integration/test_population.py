"""Evolution strategies, population-based training and the pool API on real clusters."""

import json
import multiprocessing
import time

import pytest

import dask_rl
from dask_rl.cli import main
from dask_rl.data.metrics import read_metrics
from dask_rl.pool import Pool

pytestmark = pytest.mark.timeout(900)


@pytest.mark.slow
def test_es_solves_cartpole(local_client, pipelines, tmp_path, capsys):
    result = dask_rl.train(pipelines / "es_cartpole.yaml", client=local_client,
                           run_dir=tmp_path / "es")
    s = result.summary
    assert s["algorithm"] == "es" and s["solved"] and s["final_return"] >= 475, s
    records = read_metrics(tmp_path / "es" / "metrics.jsonl")
    confirmations = [r for r in records if r["kind"] == "eval" and r["purpose"] == "confirmation"]
    assert s["confirmation"] == {k: confirmations[-1][k] for k in s["confirmation"]}
    assert s["confirmation"]["episodes"] == 300 and s["stop_reason"] == "solved"
    gens = [r for r in records if r["kind"] == "generation"]
    assert len(gens) == s["generations"] > 1
    assert all(r["es/tasks"] == 6 for r in gens)  # 24 pairs / 4 per task
    # what it keeps plays as a user evaluates it (dask-rl evaluate), and holds on fresh episodes
    assert main(["evaluate", str(tmp_path / "es"), "--episodes", "100", "--seed", "777000"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["version"] == s["confirmation"]["version"] and again["algorithm"] == "es"
    assert again["mean_return"] >= 475, (again, s["confirmation"])


@pytest.mark.slow
def test_es_resumes_where_it_stopped(local_client, pipelines, tmp_path):
    run_dir = tmp_path / "es"
    first = dask_rl.train(pipelines / "es_cartpole.yaml", client=local_client, run_dir=run_dir,
                          overrides=["stop.env_steps=8000", "stop.solve_on_target=false"])
    assert first.summary["stop_reason"] == "env_steps"
    again = dask_rl.train(pipelines / "es_cartpole.yaml", client=local_client, run_dir=run_dir,
                          resume=True, overrides=["stop.env_steps=16000",
                                                  "stop.solve_on_target=false"])
    assert again.summary["generations"] > first.summary["generations"]
    resume = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "resume"]
    assert resume[-1]["env_steps"] >= first.summary["env_steps"] > 0


@pytest.mark.slow
def test_pbt_changes_hyperparameters_and_beats_the_initial_worst(local_client, pipelines,
                                                                 tmp_path):
    # a quarter of the shipped budget: 5 rounds of exploits instead of 8
    result = dask_rl.train(pipelines / "pbt_cartpole.yaml", client=local_client,
                           run_dir=tmp_path / "pbt", overrides=[
                               "stop.env_steps=45000", "population.ready_env_steps=9000"])
    s = result.summary
    assert s["algorithm"] == "pbt-ppo" and len(s["members"]) == 4
    exploits = [r for r in s["lineage"] if r["event"] == "exploit"]
    assert exploits, "no member ever exploited another"
    # hyperparameters changed over time (one exploit may leave them as they were: a perturbed
    # value clipped to its range's bound can land on the member's old value)
    start = {r["member"]: r["hparams"] for r in s["lineage"] if r["event"] == "start"}
    assert any(m["hparams"] != start[m["member"]] for m in s["members"]), s["members"]
    assert any(r["hparams"] != r["old_hparams"] for r in exploits)
    assert all(0 <= r["parent"] < 4 and r["parent"] != r["member"] for r in exploits)
    assert s["final_return"] > s["initial_worst_return"], s
    on_disk = json.loads((tmp_path / "pbt" / "summary.json").read_text())
    assert on_disk["lineage"] == s["lineage"]
    for m in range(4):
        assert (tmp_path / "pbt" / "members" / f"m{m}" / "checkpoints" / "latest").exists()


def _square(x):
    return x * x


def _add(a, b):
    return a + b


def _busy(seconds):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass
    return seconds


def test_pool_is_a_drop_in_for_multiprocessing(local_client):
    items = list(range(37))
    with multiprocessing.Pool(2) as mp:
        want_map = mp.map(_square, items)
        want_star = mp.starmap(_add, [(i, i) for i in items])
        want_apply = mp.apply(_add, (2, 3))
    with Pool(client=local_client) as pool:
        assert pool.map(_square, items) == want_map
        assert pool.map(_square, items, chunksize=5) == want_map
        assert pool.starmap(_add, [(i, i) for i in items]) == want_star
        assert pool.apply(_add, (2, 3)) == want_apply
        assert list(pool.imap(_square, items, chunksize=4)) == want_map
        assert sorted(pool.imap_unordered(_square, items)) == sorted(want_map)
        assert pool.map(lambda x: x + 1, [1, 2]) == [2, 3]  # what multiprocessing cannot pickle
        got = []
        res = pool.map_async(_square, items, callback=got.append)
        assert res.get(timeout=60) == want_map
        res.wait(5)
        assert res.ready() and res.successful()
        assert pool.map(_square, []) == []


def test_pool_with_its_own_cluster_and_an_initializer():
    with Pool(2, initializer=_busy, initargs=(0.01,)) as pool:
        assert pool.map(_square, range(10)) == [x * x for x in range(10)]
    with pytest.raises(ValueError, match="Pool not running"):
        pool.map(_square, [1])
