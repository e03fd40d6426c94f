"""Interop with LeRobot's own package (lerobot 0.4.4, installed by `make setup` into .lerobot-site
beside the venv: its torch pin conflicts with ours): it reads what we write, we read what it writes.
Nothing is mocked."""

import sys
from pathlib import Path

import numpy as np
import pytest

from minivla_wmrl.data.dataset import read_episodes
from minivla_wmrl.data.lerobot import LeRobotDataset, write_lerobot

SITE = Path(__file__).resolve().parent.parent / ".lerobot-site"
TASKS = (("open the top drawer", 9), ("close the top drawer", 6))


@pytest.fixture(scope="module")
def lerobot():
    if not (SITE / "lerobot").is_dir():
        pytest.fail(f"{SITE} holds no lerobot package; run `make setup` (it installs lerobot 0.4.4 there)")
    sys.path.append(str(SITE))  # last: what the venv has (numpy, pyarrow, dateutil, ...) stays the venv's
    try:
        import lerobot.datasets.lerobot_dataset as module
        yield module
    finally:
        sys.path.remove(str(SITE))


def _episodes(seed: int = 0):
    rng = np.random.default_rng(seed)
    return [{"task": task, "frames": {"action": rng.normal(size=(n, 7)).astype(np.float32),
                                      "observation.images.image": rng.integers(0, 255, (n, 16, 16, 3), np.uint8)}}
            for task, n in TASKS]


def test_lerobot_reads_our_dataset_with_its_task_strings(lerobot, tmp_path):
    episodes = _episodes()
    root = write_lerobot(tmp_path / "ours", episodes, fps=10, version="v3.0")
    theirs = lerobot.LeRobotDataset("local/ours", root=root)
    assert (len(theirs), theirs.num_episodes, theirs.fps) == (15, 2, 10)
    for index, (episode, frame) in enumerate([(0, k) for k in range(9)] + [(1, k) for k in range(6)]):
        item = theirs[index]
        assert item["task"] == TASKS[episode][0]  # was the integer 0 before tasks were written LeRobot's way
        assert (int(item["episode_index"]), int(item["frame_index"])) == (episode, frame)
        np.testing.assert_allclose(item["action"].numpy(), episodes[episode]["frames"]["action"][frame], atol=1e-7)
        image = (item["observation.images.image"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        np.testing.assert_array_equal(image, episodes[episode]["frames"]["observation.images.image"][frame])


def test_datasets_loads_our_v21_parquet_by_its_embedded_features(lerobot, tmp_path):
    """lerobot 0.3's v2.1 path: `datasets` decodes by the features embedded in the parquet, which our
    column types once contradicted ("Could not infer dtype of dict")."""
    import datasets

    root = write_lerobot(tmp_path / "v21", _episodes(), fps=10, version="v2.1")
    loaded = datasets.load_dataset("parquet", data_files=str(root / "data" / "*" / "*.parquet"), split="train",
                                   cache_dir=str(tmp_path / "cache"))
    assert isinstance(loaded.features["observation.images.image"], datasets.Image)
    assert len(loaded) == 15 and len(loaded[0]["action"]) == 7
    assert loaded.with_format("numpy")[0]["observation.images.image"].shape == (16, 16, 3)


@pytest.mark.parametrize("video", [False, True])
def test_we_read_a_dataset_lerobot_wrote(lerobot, tmp_path, video):
    root = tmp_path / "theirs"
    kind = "video" if video else "image"
    features = {"action": {"dtype": "float32", "shape": (7,), "names": None},
                "observation.images.image": {"dtype": kind, "shape": (16, 16, 3),
                                             "names": ["height", "width", "channels"]}}
    theirs = lerobot.LeRobotDataset.create("local/theirs", fps=10, root=root, features=features, use_videos=video)
    episodes = _episodes(1)
    for k, episode in enumerate(episodes):  # flat frames, one grey level each: a lossy codec keeps them apart
        levels = 30 + 20 * np.arange(len(episode["frames"]["action"])) + 5 * k
        episode["frames"]["observation.images.image"] = np.broadcast_to(
            levels[:, None, None, None], (len(levels), 16, 16, 3)).astype(np.uint8)
    for episode in episodes:
        frames = episode["frames"]
        for t in range(len(frames["action"])):
            theirs.add_frame({"action": frames["action"][t], "observation.images.image": frames[
                "observation.images.image"][t], "task": episode["task"]})
        theirs.save_episode()
    theirs.finalize()
    ours = LeRobotDataset(root)
    assert ours.task_of == {0: TASKS[0][0], 1: TASKS[1][0]}
    for k, episode in enumerate(episodes):
        np.testing.assert_array_equal(ours.actions[k], episode["frames"]["action"])
        frames = ours.read(f"episode_{k}", "agentview_rgb", range(len(episode["frames"]["action"])))
        expected = episode["frames"]["observation.images.image"]
        if video:  # lossy codec: each frame found at its timestamp (neighbours differ by 20 grey levels)
            assert frames.shape == expected.shape and np.abs(frames.astype(int) - expected).max() < 8
        else:
            np.testing.assert_array_equal(frames, expected)
    instructions = [e.instruction for e in read_episodes([root], 2, image_key="agentview_rgb")]
    assert instructions == [TASKS[0][0], TASKS[1][0]]
