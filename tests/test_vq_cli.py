"""`minivla-wmrl vq` on a demonstration file recorded in the simulator, and bad demonstration files."""

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

from minivla_wmrl.data.dataset import keep_mask, read_episodes
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer
from minivla_wmrl.policy.normalization import read_statistics
from tests.test_action_tokenizer import expert_demo_file  # noqa: F401 - the shared fixture


@pytest.mark.simulator
def test_vq_command_trains_and_writes_tokenizer_and_statistics(expert_demo_file, tmp_path):  # noqa: F811
    done = subprocess.run([sys.executable, "-m", "minivla_wmrl.cli", "vq", "--data", str(expert_demo_file),
                           "--out", str(tmp_path), "--steps", "60", "--batch-size", "256", "--val-fraction", "0.2"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "held-out reconstruction L1" in done.stdout and "8 train, 2 held out" in done.stdout
    tokenizer = ActionTokenizer.from_pretrained(tmp_path / "action_tokenizer")
    stats = read_statistics(tmp_path / "dataset_statistics.json")["libero"]
    assert stats.num_trajectories == 8 and stats.mask.tolist() == [True] * 6 + [False]
    metrics = [json.loads(line) for line in (tmp_path / "vq_metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 60 and metrics[-1]["val_l1"] < metrics[0]["val_l1"]
    assert tokenizer.config.chunk_len == 8


def test_bad_demonstration_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.hdf5 does not exist"):
        read_episodes([tmp_path / "nothere.hdf5"], image_key=None)
    (tmp_path / "corrupt.hdf5").write_bytes(b"not an hdf5 file")
    with pytest.raises(ValueError, match="corrupt.hdf5 is not a readable hdf5 file"):
        read_episodes([tmp_path / "corrupt.hdf5"], image_key=None)
    with h5py.File(tmp_path / "nan.hdf5", "w") as f:
        f.create_dataset("data/demo_0/actions", data=np.ones((9, 7)))
        f.create_dataset("data/demo_1/actions", data=np.full((9, 7), np.nan))
    with pytest.raises(ValueError, match=r"nan.hdf5: data/demo_1/actions contains NaN"):
        read_episodes([tmp_path / "nan.hdf5"], image_key=None)
    with h5py.File(tmp_path / "noactions.hdf5", "w") as f:
        f.create_dataset("data/demo_0/states", data=np.zeros((5, 3)))
    with pytest.raises(ValueError, match=r"noactions.hdf5: data/demo_0 lacks 'actions'"):
        read_episodes([tmp_path / "noactions.hdf5"], image_key=None)
    done = subprocess.run([sys.executable, "-m", "minivla_wmrl.cli", "vq", "--data", str(tmp_path / "nan.hdf5"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 1 and "data/demo_1/actions contains NaN" in done.stderr


def test_demo_shorter_than_a_chunk_is_named(tmp_path):
    with h5py.File(tmp_path / "short.hdf5", "w") as f:
        f.create_dataset("data/demo_0/actions", data=np.ones((5, 7)))
    with pytest.raises(ValueError, match=r"short.hdf5: data/demo_0 has 5 actions .* fewer than one chunk \(8\)"):
        read_episodes([tmp_path / "short.hdf5"], image_key=None)


def test_noop_filtering_keeps_gripper_changes():
    actions = np.array([[0.1] * 6 + [-1], [0] * 6 + [-1], [0] * 6 + [1], [0] * 6 + [1], [0.2] * 6 + [1]], float)
    np.testing.assert_array_equal(keep_mask(actions), [True, False, True, False, True])
    # before anything is kept, a still arm is dropped whatever its gripper (the reference's rule)
    first_still = np.array([[0] * 6 + [1], [0] * 6 + [-1], [0.1] * 6 + [-1], [0] * 6 + [-1]], float)
    np.testing.assert_array_equal(keep_mask(first_still), [False, False, True, False])


def test_float_frames_and_damaged_frames_are_named(tmp_path):
    from minivla_wmrl.data.dataset import DemoDataset
    from minivla_wmrl.policy.normalization import ActionStatistics

    actions = np.random.default_rng(0).uniform(-1, 1, (16, 7))
    with h5py.File(tmp_path / "float.hdf5", "w") as f:  # once cast to near-black uint8 frames, and trained on
        f.create_dataset("data/demo_0/actions", data=actions)
        f.create_dataset("data/demo_0/obs/agentview_rgb", data=np.full((16, 8, 8, 3), 0.5, np.float32))
    with pytest.raises(ValueError, match=r"float.hdf5: data/demo_0/obs/agentview_rgb is float32 .* expected uint8"):
        read_episodes([tmp_path / "float.hdf5"])
    path = tmp_path / "damaged.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data/demo_0/actions", data=actions)
        frames = f.create_dataset("data/demo_0/obs/agentview_rgb", compression="gzip", chunks=(1, 8, 8, 3),
                                  data=np.random.default_rng(1).integers(0, 255, (16, 8, 8, 3), dtype=np.uint8))
        chunk = frames.id.get_chunk_info(3)
    data = bytearray(path.read_bytes())
    data[chunk.byte_offset:chunk.byte_offset + chunk.size] = b"\xab" * chunk.size  # bytes in the middle overwritten
    path.write_bytes(bytes(data))
    episodes = read_episodes([path])
    dataset = DemoDataset(episodes, ActionStatistics.from_actions(actions, num_trajectories=1), image_size=8)
    dataset[0]  # an intact frame reads
    with pytest.raises(ValueError, match=r"damaged.hdf5: data/demo_0/obs/agentview_rgb frames \[3\] cannot be read"):
        dataset[int(np.flatnonzero(episodes[0].frames == 3)[0])]
