"""BOUNDS_Q99 action normalisation, gripper conventions and dataset_statistics.json."""

import json

import numpy as np
import pytest

from minivla_wmrl.policy.normalization import (
    ActionStatistics,
    gripper_to_env,
    gripper_to_training,
    read_statistics,
    write_statistics,
)

# MiniVLA's released libero_90 statistics (reference/minivla.md).
Q01 = np.array([-0.6321, -0.8732, -0.8973, -0.1232, -0.1564, -0.2807, 0])
Q99 = np.array([0.8518, 0.8464, 0.9375, 0.1875, 0.1779, 0.3493, 1])


def libero90_stats():
    zeros = np.zeros(7)
    return ActionStatistics(zeros, zeros, Q99, Q01, Q01, Q99, mask=np.array([True] * 6 + [False]),
                            num_transitions=10, num_trajectories=1)


def test_bounds_q99_maps_the_quantiles_to_minus_one_and_one_and_clips():
    stats = libero90_stats()
    action = np.stack([Q01, Q99, 2 * Q99 + 1])
    action[:, 6] = [1.0, 0.0, 1.0]
    normalized = stats.normalize(action)
    np.testing.assert_allclose(normalized[0, :6], -1, atol=1e-6)
    np.testing.assert_allclose(normalized[1, :6], 1, atol=1e-6)
    np.testing.assert_array_equal(normalized[2, :6], 1)  # clipped
    np.testing.assert_array_equal(normalized[:, 6], [1.0, 0.0, 1.0])  # the gripper is not normalised
    middle = (Q01 + Q99) / 2
    np.testing.assert_allclose(stats.unnormalize(stats.normalize(middle))[:6], middle[:6], atol=1e-6)


def test_gripper_conventions_round_trip():
    raw = np.array([-1.0, 1.0, -1.0])
    trained = gripper_to_training(raw)
    np.testing.assert_array_equal(trained, [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(gripper_to_env(trained), raw)
    np.testing.assert_array_equal(gripper_to_env([0.7, 0.2]), [-1.0, 1.0])


def test_statistics_file_round_trips_in_the_reference_format(tmp_path):
    actions = np.random.default_rng(0).normal(size=(500, 7))
    stats = ActionStatistics.from_actions(actions, num_trajectories=5, proprio=actions[:, :3])
    write_statistics(tmp_path / "dataset_statistics.json", {"libero_90": stats})
    raw = json.loads((tmp_path / "dataset_statistics.json").read_text())
    assert set(raw["libero_90"]["action"]) == {"mean", "std", "max", "min", "q01", "q99", "mask"}
    assert raw["libero_90"]["action"]["mask"] == [True] * 6 + [False]
    assert raw["libero_90"]["num_transitions"] == 500 and raw["libero_90"]["num_trajectories"] == 5
    loaded = read_statistics(tmp_path / "dataset_statistics.json")["libero_90"]
    np.testing.assert_allclose(loaded.q01, np.quantile(actions, 0.01, axis=0))
    np.testing.assert_allclose(loaded.normalize(actions), stats.normalize(actions))


def test_bad_statistics_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json does not exist"):
        read_statistics(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        read_statistics(tmp_path / "bad.json")
    (tmp_path / "partial.json").write_text(json.dumps({"libero_90": {"action": {"q01": [0] * 7}}}))
    with pytest.raises(ValueError, match=r"partial.json \['libero_90'\]: missing or malformed key 'mean'"):
        read_statistics(tmp_path / "partial.json")
    with pytest.raises(ValueError, match="last dimension 4; these statistics have 7"):
        libero90_stats().normalize(np.zeros(4))
    with pytest.raises(ValueError, match="finite, non-empty"):
        ActionStatistics.from_actions(np.full((3, 7), np.nan), num_trajectories=1)


def test_constant_dims_normalise_to_zero_and_a_missing_mask_normalises_every_dim(tmp_path):
    actions = np.random.default_rng(1).normal(size=(100, 7))
    actions[:, 2] = 0.3  # a dim the data never moves (min == max): the reference maps it to 0
    stats = ActionStatistics.from_actions(actions, num_trajectories=2)
    normalized = stats.normalize(actions)
    np.testing.assert_array_equal(normalized[:, 2], 0.0)
    assert np.abs(normalized[:, :2]).max() > 0.5
    entry = stats.to_json()
    del entry["action"]["mask"]
    (tmp_path / "no_mask.json").write_text(json.dumps({"d": entry}))
    loaded = read_statistics(tmp_path / "no_mask.json")["d"]
    assert loaded.mask.all()  # no mask: every dim normalised, the gripper too
    assert np.abs(loaded.normalize(actions)[:, 6]).max() <= 1 and not np.allclose(
        loaded.normalize(actions)[:, 6], actions[:, 6])
