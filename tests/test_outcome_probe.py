"""The outcome probe and the prefix report on planted signals (pure logic: the rollout fields it
reads are recorded by the engine, tested on LIBERO in test_rollout.py)."""

import json

import numpy as np
import pytest

from minivla_wmrl.evaluation.prefix_auroc import (auroc_by_prefix, prediction_at, prefix_report, prefix_table,
                                                  probe_episode, time_only)
from minivla_wmrl.rl.rollout import EpisodeSpec, Trajectory
from world_models.outcome_probe import OutcomeProbe, fit_outcome_probe, policy_signals

CAP, CHUNK = 120, 8


def rollout(rng, success: bool, planted: bool = True, reach: bool = False) -> Trajectory:
    """Successes end by step ~64 and their gripper closes from the third query on (when `planted`);
    failures run to the cap. The privileged state holds the object height, rising for successes; the
    proprioception (3 dims) holds the hand's approach, steady for successes when `reach`."""
    length = int(rng.integers(56, 72)) if success else CAP
    steps = np.arange(0, length, CHUNK)
    q = len(steps)
    actions = rng.normal(0, 0.3, (q, CHUNK, 7)).astype(np.float32)
    if planted:
        actions[2:, :, 6] += 1.0 if success else -1.0
    height = np.cumsum(rng.normal(0.01 if success and planted else 0.0, 0.005, q))
    return Trajectory(spec=EpisodeSpec("0", 0), instruction="close the drawer", success=success, length=length,
                      success_step=length if success else None, failure=None, frames=np.zeros((0,), np.uint8),
                      final_frame=None, token_ids=np.zeros((q, 7), np.int64),
                      log_probs=rng.normal(-1, 0.2, (q, 7)).astype(np.float32), query_steps=steps,
                      executed=np.full(q, CHUNK), actions=actions,
                      proprio=np.cumsum(rng.normal(0.02 if success and reach else 0.0, 0.01, (q, 3)), axis=0,
                                        dtype=np.float32),
                      privileged=np.stack([height, rng.normal(0, 1, q)], axis=1).astype(np.float32))


def rollouts(seed: int, n: int, planted: bool = True, reach: bool = False) -> list[Trajectory]:
    rng = np.random.default_rng(seed)
    return [rollout(rng, bool(k % 2), planted, reach) for k in range(n)]


def test_policy_signals_are_confidence_chunk_norm_change_and_gripper():
    rng = np.random.default_rng(0)
    log_probs, actions = rng.normal(size=(3, 7)), rng.normal(size=(3, 8, 7))
    features = policy_signals(np.array([0, 8, 16]), log_probs, actions)
    assert features.shape == (3, 5)
    assert np.allclose(features[:, 0], log_probs.mean(1)) and np.allclose(features[:, 1], log_probs.min(1))
    assert np.allclose(features[:, 2], np.linalg.norm(actions, axis=2).mean(1))
    assert features[0, 3] == 0 and np.isclose(features[2, 3], np.linalg.norm(actions[2].mean(0) - actions[1].mean(0)))
    assert np.allclose(features[:, 4], actions[:, :, 6].mean(1))
    with pytest.raises(ValueError, match="need as many"):
        policy_signals(np.array([0, 8]), log_probs, actions)


def test_the_prediction_at_a_cut_is_the_last_query_issued_before_it():
    assert prediction_at(np.array([0.1, 0.2, 0.9]), np.array([0, 8, 16]), 16) == 0.2
    assert prediction_at(np.array([0.1, 0.2, 0.9]), np.array([0, 8, 16]), 17) == 0.9
    assert np.isnan(prediction_at(np.array([0.1]), np.array([0]), 0))


def test_a_planted_signal_is_found_from_a_prefix_and_the_baselines_behave():
    report = prefix_report(rollouts(0, 60), rollouts(1, 40), [8, 32, 48, 96], time_scale=CAP)
    rows = {r["steps"]: r for r in report["rows"]}
    assert rows[8]["probe_running"] < 0.75  # one query in: nothing planted yet
    assert rows[32]["probe_running"] > 0.9 and rows[48]["probe_running"] > 0.9
    assert rows[48]["privileged_running"] > 0.8
    assert rows[32]["time_only_all"] == 0.5  # nobody ended: time alone ranks nothing
    assert rows[96]["running_successes"] == 0 and rows[96]["time_only_all"] == 1.0  # successes have ended


def test_without_a_signal_held_out_auroc_stays_near_chance():
    report = prefix_report(rollouts(2, 60, planted=False), rollouts(3, 40, planted=False), [48], time_scale=CAP)
    assert 0.25 < report["rows"][0]["probe_running"] < 0.75
    assert 0.25 < report["rows"][0]["proprio_running"] < 0.75


def test_the_proprioceptive_probe_reads_what_the_policy_signals_lack():
    report = prefix_report(rollouts(9, 60, planted=False, reach=True), rollouts(10, 40, planted=False, reach=True),
                           [48], time_scale=CAP)
    row = report["rows"][0]
    assert row["proprio_running"] > 0.85 and 0.25 < row["probe_running"] < 0.75
    episode = probe_episode(rollouts(9, 1)[0], "proprio")
    assert episode.features.shape[1] == 5 + 3  # the policy signals, then the proprioception


def test_episodes_without_proprioception_serve_the_other_probes_and_name_what_is_missing(tmp_path):
    import h5py

    from minivla_wmrl.data.replay import read_replay, write_replay

    write_replay(tmp_path / "old.hdf5", rollouts(11, 40), "collect")
    with h5py.File(tmp_path / "old.hdf5", "a") as f:  # as written before proprioception was recorded
        for item in f["episodes"].values():
            del item["proprio"]
    old = read_replay([tmp_path / "old.hdf5"])
    assert all(t.proprio.shape == (0,) for t in old)
    with pytest.raises(ValueError, match="no proprioception per query"):
        probe_episode(old[0], "proprio")
    report = prefix_report(old[:30], old[30:], [48], time_scale=CAP)
    assert "proprio_running" not in report["rows"][0] and report["rows"][0]["probe_running"] > 0.9
    assert "proprio" not in prefix_table(report) and "| 48 |" in prefix_table(report)


def test_time_only_is_the_success_rate_among_episodes_still_running():
    train = [probe_episode(t) for t in rollouts(4, 20)]
    assert time_only(train)(10) == pytest.approx((10 + 1) / (20 + 2))
    assert time_only(train)(100) == pytest.approx(1 / 12)  # only the 10 failures run past 100 steps
    rows = auroc_by_prefix(train, {"perfect": [np.full(len(e.query_steps), float(e.success)) for e in train]}, [16])
    assert rows[0]["perfect_running"] == 1.0 and rows[0]["perfect_all"] == 1.0


def test_the_probe_saves_and_loads_exactly(tmp_path):
    episodes = [probe_episode(t) for t in rollouts(5, 10)]
    probe = fit_outcome_probe(episodes, epochs=5)
    probe.save_pretrained(tmp_path / "probe")
    loaded = OutcomeProbe.from_pretrained(tmp_path / "probe")
    for a, b in zip(probe.predict(episodes), loaded.predict(episodes)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="the probe reads"):
        probe.predict([probe_episode(rollouts(6, 1)[0], "privileged")])


def test_the_replay_store_keeps_real_labelled_episodes_and_feeds_the_report(tmp_path, capsys):
    from minivla_wmrl.cli import main as cli
    from minivla_wmrl.data.replay import read_replay, write_replay

    episodes = rollouts(7, 60)
    cut = rollout(np.random.default_rng(8), False)
    cut.truncated = True  # its outcome is unknown: not real-labelled
    assert write_replay(tmp_path / "replay" / "a.hdf5", episodes[:30] + [cut], "collect") == 30
    write_replay(tmp_path / "replay" / "b.hdf5", episodes[30:], "grpo step 1")
    back = read_replay([tmp_path / "replay"])
    assert [t.success for t in back] == [t.success for t in episodes]
    for a, b in zip(back, episodes):
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.proprio, b.proprio)
        np.testing.assert_array_equal(probe_episode(a).features, probe_episode(b).features)
    assert cli(["probe-report", str(tmp_path / "replay"), "--steps", "32", "--time-scale", str(CAP),
                "--json", str(tmp_path / "report.json")]) == 0
    table = capsys.readouterr().out
    assert "| 32 |" in table and "proprio, running" in table and (tmp_path / "report.json").exists()
    assert cli(["probe-report", str(tmp_path / "replay" / "a.hdf5"), "--test", str(tmp_path / "replay" / "b.hdf5"),
                "--steps", "32", "--time-scale", str(CAP), "--json", str(tmp_path / "split.json")]) == 0
    split = json.loads((tmp_path / "split.json").read_text())
    assert (split["train"], split["test"]) == (30, 30)  # the named files, not a random share
    assert cli(["probe-report", str(tmp_path / "replay" / "a.hdf5"), "--test-fraction", "0.97"]) == 1
    assert "the report needs >= 4 to train and test episodes of both outcomes" in capsys.readouterr().err
    assert cli(["probe-report", str(tmp_path / "replay"), "--test-fraction", "0"]) == 1
    assert "expected a share of the episodes in (0, 1)" in capsys.readouterr().err
