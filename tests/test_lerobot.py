"""The LeRobot dataset format: a LeRobot copy of LIBERO demos trains exactly like the hdf5 original."""

from __future__ import annotations

import json

import numpy as np
import pytest

from minivla_wmrl.data.dataset import DemoDataset, iter_hdf5_demos, read_episodes
from minivla_wmrl.data.lerobot import LeRobotDataset, write_lerobot
from minivla_wmrl.data.trajectories import LabelledTrajectory, demo_trajectories, save_trajectories
from minivla_wmrl.policy.normalization import ActionStatistics

CAMERAS = dict(image_key="agentview_rgb", wrist_key="eye_in_hand_rgb")


def _items(paths, convention: str) -> list[dict]:
    episodes = read_episodes(paths, 8, **CAMERAS)
    statistics = ActionStatistics.from_actions(np.concatenate([e.actions for e in episodes]), len(episodes))
    dataset = DemoDataset(episodes, statistics, image_size=64, image_convention=convention, **CAMERAS)
    return [dataset[i] for i in range(0, len(dataset), 7)]


@pytest.fixture(scope="module", params=["v3.0", "v2.1"])
def lerobot_copy(request, demos, tmp_path_factory):
    out = tmp_path_factory.mktemp("lerobot") / "libero"
    write_lerobot(out, iter_hdf5_demos([demos]), fps=20, version=request.param)
    return out


@pytest.mark.simulator
def test_a_lerobot_copy_yields_what_the_hdf5_original_yields(demos, lerobot_copy):
    info = json.loads((lerobot_copy / "meta" / "info.json").read_text())
    assert info["codebase_version"] in ("v3.0", "v2.1") and info["total_episodes"] == 3
    assert {"action", "observation.state", "observation.images.image", "observation.images.wrist_image"} <= set(
        info["features"])
    original, copy = read_episodes([demos], 8, **CAMERAS), read_episodes([lerobot_copy], 8, **CAMERAS)
    instructions = [e.instruction for e in original]
    assert [e.instruction for e in copy] == instructions == ["close the top drawer of the cabinet"] * 3
    for a, b in zip(original, copy):
        np.testing.assert_array_equal(a.actions, b.actions)  # vq and sft see the same actions
        np.testing.assert_array_equal(a.frames, b.frames)
    for convention in ("minivla", "openvla"):  # the same pixels, the same way up, for either policy convention
        for a, b in zip(_items([demos], convention), _items([lerobot_copy], convention)):
            np.testing.assert_array_equal(a["image"], b["image"])
            np.testing.assert_array_equal(a["chunk"], b["chunk"])
            assert a["instruction"] == b["instruction"]
    for a, b in zip(demo_trajectories([str(demos)], 32), demo_trajectories([str(lerobot_copy)], 32)):  # wm
        np.testing.assert_array_equal(a.frames, b.frames)
    stored = LeRobotDataset(lerobot_copy).read("episode_0", "observation.images.image", [0])[0]
    import h5py

    with h5py.File(demos) as f:  # stored as the published LIBERO sets: rotated 180° from the raw frame
        np.testing.assert_array_equal(stored, f["data/demo_0/obs/agentview_rgb"][0][::-1, ::-1])


@pytest.mark.simulator
@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_video_cameras_decode_each_frame_at_its_timestamp(demos, tmp_path, version):
    write_lerobot(tmp_path / "video", iter_hdf5_demos([demos]), fps=20, version=version, video=True)
    original, copy = read_episodes([demos], 8, **CAMERAS), read_episodes([tmp_path / "video"], 8, **CAMERAS)
    for a, b in zip(original, copy):
        np.testing.assert_array_equal(a.actions, b.actions)
    episode, video = original[2], copy[2]
    picks = episode.frames[[0, 5, len(episode.frames) // 2, -1]]
    exact = episode.read_frames("agentview_rgb", picks)[:, ::-1, ::-1]
    decoded = video.read_frames("agentview_rgb", picks)
    errors = np.abs(exact.astype(int) - decoded.astype(int)).mean(axis=(1, 2, 3))
    assert errors.max() < 4, errors  # AV1 at LeRobot's settings is lossy, but close
    assert decoded.shape == exact.shape


def test_exported_rollouts_keep_their_real_labels(tmp_path):
    from minivla_wmrl.cli import main as cli

    rng = np.random.default_rng(0)
    frames = lambda n: rng.integers(0, 255, (n, 16, 16, 3), dtype=np.uint8)  # noqa: E731
    trajectories = [LabelledTrajectory(frames(4), "open the drawer", True, "rollout", "0"),
                    LabelledTrajectory(frames(3), "close the drawer", False, "rollout", "1")]
    save_trajectories(tmp_path / "rollouts.hdf5", trajectories)
    assert cli(["export", str(tmp_path / "rollouts.hdf5"), "--out", str(tmp_path / "export")]) in (0, None)
    dataset = LeRobotDataset(tmp_path / "export")
    assert dataset.episodes == [0, 1] and dataset.task_of == {0: "open the drawer", 1: "close the drawer"}
    for i, t in enumerate(trajectories):
        np.testing.assert_array_equal(dataset.read(f"episode_{i}", "observation.images.image", range(len(t.frames))),
                                      t.frames)
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "export" / "data" / "chunk-000" / "file-000.parquet").to_pydict()
    assert table["next.success"] == [False, False, False, True, False, False, False]
    assert table["next.done"] == [False, False, False, True, False, False, True]


def test_bad_lerobot_datasets_are_named(tmp_path):
    write_lerobot(tmp_path / "ok", [{"task": "t", "frames": {"action": np.zeros((9, 7), np.float32),
                                                              "observation.images.image": np.zeros((9, 8, 8, 3),
                                                                                                   np.uint8)}}], fps=10)
    with pytest.raises(ValueError, match="no camera feature for 'eye_in_hand_rgb'; its cameras are "
                                         r"\['observation.images.image'\]"):
        read_episodes([tmp_path / "ok"], 8, image_key="agentview_rgb", wrist_key="eye_in_hand_rgb")
    with pytest.raises(ValueError, match="episode_0 has 0 actions after no-op filtering"):
        read_episodes([tmp_path / "ok"], 8)  # all-zero actions are no-ops
    info = json.loads((tmp_path / "ok" / "meta" / "info.json").read_text())
    (tmp_path / "ok" / "meta" / "info.json").write_text(json.dumps(info | {"codebase_version": "v1.6"}))
    with pytest.raises(ValueError, match="codebase_version 'v1.6' is not supported"):
        read_episodes([tmp_path / "ok"])
    (tmp_path / "ok" / "meta" / "info.json").write_text("{")
    with pytest.raises(ValueError, match="ok/meta/info.json is not valid JSON"):
        read_episodes([tmp_path / "ok"])
    with pytest.raises(ValueError, match="meta/info.json has no action feature"):
        write_lerobot(tmp_path / "no_actions", [{"task": "t", "frames": {"x": np.zeros((9, 2), np.float32)}}], fps=10)
        read_episodes([tmp_path / "no_actions"], 8, image_key=None)
    with pytest.raises(ValueError, match="cannot be written; expected v2.1 or v3.0"):
        write_lerobot(tmp_path / "new", [], fps=10, version="v2.0")
    with pytest.raises(ValueError, match="no episodes to write"):
        write_lerobot(tmp_path / "empty", [], fps=10)
    assert not (tmp_path / "empty").exists()


def _two_episodes(version: str, out, cameras=("observation.images.image",)):
    rng = np.random.default_rng(0)
    episodes = [{"task": task, "frames": {"action": rng.normal(size=(n, 7)).astype(np.float32),
                                          **{c: rng.integers(0, 255, (n, 8, 8, 3), np.uint8) for c in cameras}}}
                for task, n in (("open the drawer", 9), ("close the drawer", 6))]
    return write_lerobot(out, episodes, fps=10, version=version)


def test_tasks_are_written_as_lerobot_keeps_them_and_read_either_way(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = _two_episodes("v3.0", tmp_path / "ours")
    table = pq.read_table(root / "meta" / "tasks.parquet")  # LeRobot: the task string is the pandas index
    assert table.column_names == ["task_index", "__index_level_0__"]
    assert json.loads(table.schema.metadata[b"pandas"])["index_columns"] == ["__index_level_0__"]
    assert LeRobotDataset(root).task_of == {0: "open the drawer", 1: "close the drawer"}
    pq.write_table(pa.table({"task_index": [0, 1], "task": ["open the drawer", "close the drawer"]}),
                   root / "meta" / "tasks.parquet")  # the plain-column layout of older writers
    assert LeRobotDataset(root).task_of == {0: "open the drawer", 1: "close the drawer"}
    data = pq.read_schema(root / "data" / "chunk-000" / "file-000.parquet")  # types its embedded features declare
    assert str(data.field("action").type) == "fixed_size_list<element: float>[7]"
    assert str(data.field("observation.images.image").type) == "struct<bytes: binary, path: string>"


def test_lerobots_own_libero_wrist_camera_name_is_known(tmp_path):
    root = _two_episodes("v3.0", tmp_path / "image2", ("observation.images.image", "observation.images.image2"))
    assert LeRobotDataset(root).image_key("eye_in_hand_rgb") == "observation.images.image2"


@pytest.mark.parametrize("damage, message", [
    ("uneven_actions", r"holds lists of different lengths \(\[6, 7, 8\]\)"),
    ("rows_lost", "episode 0 has 7 frames in the data but length 9 in meta"),
    ("episode_line_lost", "meta lists episodes .* or the data holds episodes \\[1\\]"),
    ("total_frames", "info.json: total_frames is 99 but the data holds 15"),
    ("not_png", "episode 0 frame 0 of observation.images.image is not a readable image"),
    ("null_image", "episode 0 frame 0 of observation.images.image holds no image bytes"),
    ("action_absent", "meta/info.json declares 'action' but .* has no such column"),
    ("labelled_v3", "a v2.1 dataset labelled v3.0"),
    ("no_episode_meta", "meta/episodes/ holds no parquet files"),
])
def test_inconsistent_lerobot_data_is_named_before_training(tmp_path, damage, message):
    import pyarrow as pa
    import pyarrow.parquet as pq

    version = "v2.1" if damage in ("episode_line_lost", "labelled_v3") else "v3.0"
    root = _two_episodes(version, tmp_path / "set")
    data = sorted((root / "data").glob("chunk-*/*.parquet"))[0]
    table = pq.read_table(data)
    info = json.loads((root / "meta" / "info.json").read_text())
    if damage == "uneven_actions":
        lists = [list(r) for r in table.column("action").to_pylist()]
        lists[0], lists[1] = lists[0][:6], lists[1] + [0.0]
        pq.write_table(table.set_column(table.column_names.index("action"), "action", pa.array(lists)), data)
    elif damage == "rows_lost":
        pq.write_table(table.slice(2), data)  # frames 0-1 of episode 0 gone: frame_index no longer starts at 0
        table = pq.read_table(data)
        frames = pa.array([i for i in range(7)] + list(range(6)))
        pq.write_table(table.set_column(table.column_names.index("frame_index"), "frame_index", frames), data)
    elif damage == "episode_line_lost":
        lines = (root / "meta" / "episodes.jsonl").read_text().splitlines()
        (root / "meta" / "episodes.jsonl").write_text(lines[0] + "\n")
    elif damage == "total_frames":
        (root / "meta" / "info.json").write_text(json.dumps(info | {"total_frames": 99}))
    elif damage in ("not_png", "null_image"):
        images = table.column("observation.images.image").to_pylist()
        images[0] = {"bytes": b"not a png" if damage == "not_png" else None, "path": None}
        column = pa.array(images, table.schema.field("observation.images.image").type)
        pq.write_table(table.set_column(table.column_names.index("observation.images.image"),
                                        "observation.images.image", column), data)
    elif damage == "action_absent":
        pq.write_table(table.drop(["action"]), data)
    elif damage == "labelled_v3":
        (root / "meta" / "info.json").write_text(json.dumps(info | {"codebase_version": "v3.0"}))
    elif damage == "no_episode_meta":
        for path in (root / "meta" / "episodes").glob("*/*.parquet"):
            path.unlink()
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        episodes = read_episodes([root], 2, image_key="agentview_rgb")
        DemoDataset(episodes, ActionStatistics.from_actions(np.concatenate([e.actions for e in episodes]), 2),
                    image_size=8, image_key="agentview_rgb")[0]


def test_episodes_of_different_frame_shapes_are_refused_when_written(tmp_path):
    episodes = [{"task": "t", "frames": {"action": np.zeros((3, 7), np.float32),
                                         "observation.images.image": np.zeros((3, size, size, 3), np.uint8)}}
                for size in (8, 16)]
    with pytest.raises(ValueError, match="episode 1 differs from episode 0 in \\['observation.images.image'\\]"):
        write_lerobot(tmp_path / "mixed", episodes, fps=10)
    assert not (tmp_path / "mixed").exists()


@pytest.mark.simulator
def test_demos_command_writes_a_lerobot_dataset_that_trains(tmp_path):
    from minivla_wmrl.cli import main as cli

    out = tmp_path / "libero_lerobot"
    cli(["demos", "--suite", "libero_90", "--tasks", "0", "--num", "1", "--max-episodes", "1", "--format", "lerobot",
         "--lerobot-version", "v2.1", "--out", str(out)])
    info = json.loads((out / "meta" / "info.json").read_text())
    assert (info["codebase_version"], info["total_episodes"], info["fps"]) == ("v2.1", 1, 20)
    report = json.loads((out / "demos_report.json").read_text())
    assert report[0]["succeeded"] == 1 and report[0]["file"] == str(out)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the intermediate hdf5 files are gone
    (episode,) = read_episodes([out], 8, **CAMERAS)
    assert episode.instruction == "close the top drawer of the cabinet" and len(episode.actions) >= 8
