"""The LeRobotDataset format (v2.1 and v3.0), read and written without the `lerobot` package.

`lerobot` pins torch < 2.11, which conflicts with ours, so the format is handled with the
libraries it is made of: pyarrow (parquet) and PyAV (mp4), the optional `lerobot` extra.
- v2.1: `meta/info.json`, `meta/tasks.jsonl`, `meta/episodes.jsonl`, `meta/episodes_stats.jsonl`,
  `data/chunk-XXX/episode_XXXXXX.parquet`, `videos/chunk-XXX/<key>/episode_XXXXXX.mp4`;
- v3.0: `meta/info.json`, `meta/tasks.parquet`, `meta/episodes/chunk-XXX/file-XXX.parquet`,
  `data/chunk-XXX/file-XXX.parquet` (many episodes per file), `videos/<key>/chunk-XXX/file-XXX.mp4`
  (episodes concatenated, found at `videos/<key>/from_timestamp`).
Frames are `image` features (PNG bytes inside the parquet, lossless) or `video` features (mp4).

The published LIBERO sets (physical-intelligence/libero, HuggingFaceVLA/libero, lerobot/libero*)
hold frames rotated 180° from LIBERO's raw OpenGL frames (OpenVLA's regeneration), actions in
LIBERO's convention (gripper -1 open, +1 close) and the instruction as the task; this module reads
and writes that convention, so a LeRobot copy trains exactly like the hdf5 original.
"""

from __future__ import annotations

import io
import json
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import numpy as np
from PIL import Image, UnidentifiedImageError

from minivla_wmrl.infra.outputs import replaced_directory

STORED_ORIENTATION = "rotated180"  # how LeRobot LIBERO frames relate to LIBERO's raw ("opengl") ones
VERSIONS = ("v2.0", "v2.1", "v3.0")
ACTION_KEYS = ("action", "actions")
# our hdf5 image keys → the names the published LeRobot LIBERO sets use for the same camera
IMAGE_KEYS = {"agentview_rgb": ("observation.images.image", "image"),
              "eye_in_hand_rgb": ("observation.images.wrist_image", "wrist_image", "observation.images.image2",
                                  "image2")}  # image2: LeRobot's own LIBERO sets and env
TIMESTAMP_TOLERANCE_S = 1e-4  # LeRobot's: a decoded frame farther than this from the asked time is an error
CHUNK_SIZE = 1000  # LeRobot's files (v3.0) or episodes (v2.1) per chunk directory


def _libraries():
    try:
        import av  # optional extra [lerobot], ~0.3 s with pyarrow: only LeRobot datasets need them
        import pyarrow
        import pyarrow.parquet
    except ImportError as error:
        raise ImportError(f"the LeRobot format needs pyarrow and av ({error}); install them with "
                          "pip install 'minivla-wmrl[lerobot]'") from None
    return pyarrow, pyarrow.parquet, av


def is_lerobot_dataset(path: Path) -> bool:
    return (Path(path) / "meta" / "info.json").is_file()


def _read_tasks(path: Path) -> dict[int, str]:
    """v3.0 `meta/tasks.parquet` → {task_index: task}. LeRobot keeps the task string as the pandas index
    of the table (stored as `__index_level_0__`, or under the index's name); older writers (and ours
    before) as a `task` column. Both are read."""
    _, pq, _ = _libraries()
    if not path.is_file():
        labelled_wrong = (path.parent / "tasks.jsonl").is_file()
        hint = " (meta/tasks.jsonl is there: a v2.1 dataset labelled v3.0?)" if labelled_wrong else ""
        raise FileNotFoundError(f"LeRobot dataset file {path} does not exist{hint}")
    table = pq.read_table(path)
    pandas = json.loads((table.schema.metadata or {}).get(b"pandas", b"{}"))
    index = [c for c in pandas.get("index_columns", []) if isinstance(c, str)]
    column = next((c for c in ("task", *index, "__index_level_0__") if c in table.column_names), None)
    if column is None or "task_index" not in table.column_names:
        raise ValueError(f"{path}: columns {table.column_names}; expected task_index and the task strings (a 'task' "
                         "column or the pandas index LeRobot writes)")
    return dict(zip(table.column("task_index").to_pylist(), table.column(column).to_pylist()))


def _write_tasks(path: Path, tasks: dict[str, int]) -> None:
    """`meta/tasks.parquet` as LeRobot writes it (pandas' `to_parquet` of a frame indexed by the task
    string): `task_index` and `__index_level_0__`, with the pandas metadata that makes the string the
    index again. Written with pyarrow (pandas is not a dependency); the metadata is pandas' own format."""
    pa, pq, _ = _libraries()
    column = lambda name, field, kind, numpy: {"name": name, "field_name": field, "pandas_type": kind,  # noqa: E731
                                               "numpy_type": numpy, "metadata": None}
    pandas = {"index_columns": ["__index_level_0__"],
              "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                                  "metadata": {"encoding": "UTF-8"}}],
              "columns": [column("task_index", "task_index", "int64", "int64"),
                          column(None, "__index_level_0__", "unicode", "object")],
              "attributes": {}, "creator": {"library": "pyarrow", "version": pa.__version__},
              "pandas_version": "2.2.3"}
    table = pa.table({"task_index": pa.array(list(tasks.values()), pa.int64()),
                      "__index_level_0__": pa.array(list(tasks), pa.string())})
    pq.write_table(table.replace_schema_metadata({b"pandas": json.dumps(pandas).encode()}), path)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"LeRobot dataset file {path} does not exist") from None
    except ValueError as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from None


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"LeRobot dataset file {path} does not exist")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class LeRobotDataset:
    """One LeRobot dataset directory: its episodes' actions and tasks in memory, frames read on demand."""

    def __init__(self, root: Path):
        _, pq, _ = _libraries()
        self.root = Path(root)
        self.info = _read_json(self.root / "meta" / "info.json")
        self.version = self.info.get("codebase_version")
        if self.version not in VERSIONS:
            raise ValueError(f"{self.root}/meta/info.json: codebase_version {self.version!r} is not supported; "
                             f"expected one of {VERSIONS}")
        self.features, self.fps = self.info.get("features", {}), self.info.get("fps")
        self.action_key = next((k for k in ACTION_KEYS if k in self.features), None)  # None: e.g. exported rollouts
        if self.version == "v3.0":
            self.tasks = _read_tasks(self.root / "meta" / "tasks.parquet")
            episode_files = sorted((self.root / "meta" / "episodes").glob("*/*.parquet"))
            if not episode_files:
                raise FileNotFoundError(f"{self.root}: meta/episodes/ holds no parquet files; a v3.0 dataset lists "
                                        "its episodes (lengths, video files) there")
            episode_meta = pq.read_table(episode_files).to_pylist()
        else:
            self.tasks = {t["task_index"]: t["task"] for t in _jsonl(self.root / "meta" / "tasks.jsonl")}
            episode_meta = _jsonl(self.root / "meta" / "episodes.jsonl")
        self.episode_meta = {m["episode_index"]: m for m in episode_meta}
        files = sorted((self.root / "data").glob("chunk-*/*.parquet"))
        if not files:
            raise FileNotFoundError(f"{self.root}/data holds no parquet files")
        if self.action_key is not None:
            missing = [f for f in files if self.action_key not in pq.read_schema(f).names]
            if missing:
                raise ValueError(f"{self.root}: meta/info.json declares '{self.action_key}' but {missing[0]} has no "
                                 f"such column")
        self.rows: dict[int, tuple[Path, np.ndarray]] = {}  # episode → (data file, its rows there in frame order)
        self.actions: dict[int, np.ndarray] = {}
        self.task_of: dict[int, str] = {}
        for file in files:
            table = pq.read_table(file, columns=["episode_index", "frame_index", "task_index"]
                                  + [self.action_key] * (self.action_key is not None))
            episodes, frames = (table.column(k).to_numpy() for k in ("episode_index", "frame_index"))
            actions = (_vectors(table.column(self.action_key), f"{file}: {self.action_key}") if self.action_key
                       else np.zeros((len(table), 0)))
            tasks = table.column("task_index").to_numpy()
            order = np.lexsort((frames, episodes))  # rows grouped by episode, each in frame order
            starts = np.flatnonzero(np.r_[True, np.diff(episodes[order]) != 0])
            for rows in np.split(order, starts[1:]):
                episode = episodes[rows[0]]
                if not np.array_equal(frames[rows], np.arange(len(rows))):
                    raise ValueError(f"{file}: episode {episode} frame_index is not 0..{len(rows) - 1}")
                self.rows[int(episode)] = (file, rows)
                self.actions[int(episode)] = actions[rows]
                if int(tasks[rows[0]]) not in self.tasks:
                    raise ValueError(f"{file}: episode {episode} has task_index {tasks[rows[0]]}, not in the tasks")
                self.task_of[int(episode)] = self.tasks[int(tasks[rows[0]])]
        self._check_against_metadata()

    def _check_against_metadata(self) -> None:
        """The data holds exactly the episodes and frames the metadata says (rows lost from a parquet
        file, or a meta line lost, once trained on silently)."""
        listed, held = set(self.episode_meta), set(self.rows)
        if listed != held:
            raise ValueError(f"{self.root}: meta lists episodes {sorted(listed - held)[:5]} that the data lacks, or "
                             f"the data holds episodes {sorted(held - listed)[:5]} the meta does not list; "
                             f"expected the same {len(listed)} episodes in both")
        for episode, meta in self.episode_meta.items():
            if meta.get("length") is not None and meta["length"] != len(self.rows[episode][1]):
                raise ValueError(f"{self.root}: episode {episode} has {len(self.rows[episode][1])} frames in the data "
                                 f"but length {meta['length']} in meta")
        frames = sum(len(rows) for _, rows in self.rows.values())
        for key, actual in (("total_episodes", len(held)), ("total_frames", frames)):
            if self.info.get(key) is not None and self.info[key] != actual:
                raise ValueError(f"{self.root}/meta/info.json: {key} is {self.info[key]} but the data holds {actual}")

    @property
    def episodes(self) -> list[int]:
        return sorted(self.rows)

    def image_key(self, key: str) -> str:
        """A feature name of this dataset for `key` (ours, e.g. agentview_rgb, or one of its own)."""
        for name in (key, *IMAGE_KEYS.get(key, ())):
            if self.features.get(name, {}).get("dtype") in ("image", "video"):
                return name
        cameras = sorted(k for k, v in self.features.items() if v.get("dtype") in ("image", "video"))
        raise ValueError(f"{self.root}: no camera feature for {key!r}; its cameras are {cameras}")

    def read(self, demo: str, key: str, indices) -> np.ndarray:
        """Frames `indices` of episode `demo` ("episode_N") from camera `key`: uint8 (n, H, W, 3), as stored."""
        episode, name = int(demo.removeprefix("episode_")), self.image_key(key)
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if self.features[name]["dtype"] == "image":
            file, rows = self.rows[episode]
            blobs = _column(file, name).take(rows[indices]).to_pylist()
            return np.stack([_png(blob, f"{file}: episode {episode} frame {i} of {name}")
                             for i, blob in zip(indices, blobs)])
        video, start = self._video(episode, name)
        return decode_frames(video, start + indices / self.fps)

    def _video(self, episode: int, key: str) -> tuple[Path, float]:
        meta = self.episode_meta[episode]
        if self.version == "v3.0":
            chunk, file = meta[f"videos/{key}/chunk_index"], meta[f"videos/{key}/file_index"]
            path = self.info["video_path"].format(video_key=key, chunk_index=chunk, file_index=file)
            return self.root / path, float(meta[f"videos/{key}/from_timestamp"])
        path = self.info["video_path"].format(episode_chunk=episode // self.info.get("chunks_size", CHUNK_SIZE),
                                              video_key=key, episode_index=episode)
        return self.root / path, 0.0


def _vectors(column, where: str) -> np.ndarray:
    """A parquet column of fixed-length number lists (list or fixed_size_list) → (rows, length) float64."""
    flat = column.combine_chunks()
    values = flat.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
    lengths = flat.value_lengths().to_numpy(zero_copy_only=False) if hasattr(flat, "value_lengths") else None
    if len(flat) and (values.size % len(flat) or (lengths is not None and len(set(lengths.tolist())) > 1)):
        found = sorted(set(lengths.tolist())) if lengths is not None else "uneven"
        raise ValueError(f"{where} holds lists of different lengths ({found}); expected one fixed-length vector "
                         "per frame")
    return values.reshape(len(flat), -1) if len(flat) else np.zeros((0, 0))


@lru_cache(maxsize=8)
def _column(file: Path, name: str):
    """One image column of one data file (PNG bytes, memory-mapped); kept while samples come from it."""
    _, pq, _ = _libraries()
    return pq.read_table(file, columns=[name], memory_map=True).column(name)


def _png(blob, where: str) -> np.ndarray:
    data = blob.get("bytes") if isinstance(blob, dict) else blob
    if not data:
        raise ValueError(f"{where} holds no image bytes (null)")
    try:
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{where} is not a readable image ({error})") from None


def decode_frames(path: Path, timestamps: np.ndarray) -> np.ndarray:
    """The frames of `path` at `timestamps` (seconds), each within TIMESTAMP_TOLERANCE_S, as LeRobot finds them."""
    _, _, av = _libraries()
    if not Path(path).is_file():
        raise FileNotFoundError(f"LeRobot video {path} does not exist")
    frames = []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for target in timestamps:
            container.seek(int(target / stream.time_base), stream=stream, backward=True, any_frame=False)
            best = None
            for frame in container.decode(stream):
                if best is None or abs(frame.time - target) < abs(best.time - target):
                    best = frame
                if frame.time >= target:
                    break
            if best is None or abs(best.time - target) > TIMESTAMP_TOLERANCE_S:
                raise ValueError(f"{path}: no frame at {target:.4f} s (nearest "
                                 f"{'none' if best is None else f'{best.time:.4f} s'})")
            frames.append(best.to_ndarray(format="rgb24"))
    return np.stack(frames)


# -- writing ---------------------------------------------------------------------------------------

def _feature(array: np.ndarray, video: bool, fps: int) -> dict:
    if array.ndim == 4:
        feature = {"dtype": "video" if video else "image", "shape": list(array.shape[1:]),
                   "names": ["height", "width", "channels"]}
        if video:
            feature["info"] = {"video.height": array.shape[1], "video.width": array.shape[2], "video.codec": "av1",
                               "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": fps,
                               "video.channels": 3, "has_audio": False}
        return feature
    return {"dtype": str(array.dtype), "shape": list(array.shape[1:]) or [1], "names": None}


def _hf_feature(feature: dict) -> dict:
    """The `datasets` feature the parquet schema metadata carries (v2.1 readers decode images by it)."""
    if feature["dtype"] == "image":
        return {"_type": "Image"}
    value = {"dtype": feature["dtype"], "_type": "Value"}
    return value if feature["shape"] == [1] else {"_type": "Sequence", "feature": value, "length": feature["shape"][0]}


def _stats(array: np.ndarray) -> dict:
    if array.ndim == 4:  # LeRobot's image statistics: per channel, in [0, 1], shaped (3, 1, 1)
        pixels = array.reshape(-1, 3).astype(np.float64) / 255.0
        per_channel = lambda v: v[:, None, None].tolist()  # noqa: E731
        return {"min": per_channel(pixels.min(0)), "max": per_channel(pixels.max(0)),
                "mean": per_channel(pixels.mean(0)), "std": per_channel(pixels.std(0)), "count": [len(array)]}
    values = array.reshape(len(array), -1).astype(np.float64)
    return {"min": values.min(0).tolist(), "max": values.max(0).tolist(), "mean": values.mean(0).tolist(),
            "std": values.std(0).tolist(), "count": [len(array)]}


def _encode_video(path: Path, frames: np.ndarray, fps: int) -> None:
    """AV1 (libsvtav1), yuv420p, a key frame every 2 frames: LeRobot's defaults."""
    _, _, av = _libraries()
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libsvtav1", rate=fps, options={"crf": "30", "g": "2", "preset": "12"})
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for image in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")))
        container.mux(stream.encode())


def write_lerobot(out: Path, episodes: Iterable[dict], fps: int, version: str = "v3.0", video: bool = False,
                  robot_type: str = "panda", command: str = "export", overwrite: bool = False) -> Path:
    """Write episodes as a LeRobot dataset (atomically), `command`'s output (`outputs`: an existing
    directory of other origin is refused unless `overwrite`). Each episode: {"task": str, "frames":
    {feature: (T, ...) array}}; 4-d uint8 arrays are cameras (PNG in the parquet, or mp4 with `video`)."""
    pa, _, _ = _libraries()
    if version not in ("v2.1", "v3.0"):
        raise ValueError(f"LeRobot version {version!r} cannot be written; expected v2.1 or v3.0")
    with replaced_directory(Path(out), command, overwrite) as root:
        tasks: dict[str, int] = {}
        features, tables, episode_rows, total = None, [], [], 0
        for index, episode in enumerate(episodes):
            columns = episode["frames"]
            length = len(next(iter(columns.values())))
            declared = {k: _feature(np.asarray(v), video, fps) for k, v in columns.items()}
            if features is None:
                features = declared
            elif declared != features:  # info.json declares one shape per feature: every episode must have it
                changed = sorted(k for k in set(features) | set(declared) if features.get(k) != declared.get(k))
                raise ValueError(f"write_lerobot {out}: episode {index} differs from episode 0 in {changed} "
                                 f"({[declared.get(k, {}).get('shape') for k in changed]} vs "
                                 f"{[features.get(k, {}).get('shape') for k in changed]}); a dataset declares one "
                                 "shape per feature")
            task_index = tasks.setdefault(episode["task"], len(tasks))
            data = {k: _column_array(np.asarray(v)) for k, v in columns.items() if not (v.ndim == 4 and video)}
            data |= {"timestamp": pa.array(np.arange(length, dtype=np.float32) / fps),
                     "frame_index": pa.array(np.arange(length)), "episode_index": pa.array(np.full(length, index)),
                     "index": pa.array(np.arange(total, total + length)),
                     "task_index": pa.array(np.full(length, task_index))}
            tables.append(pa.table(data))
            meta = {"episode_index": index, "tasks": [episode["task"]], "length": length,
                    "stats": {k: _stats(np.asarray(v)) for k, v in columns.items()}}
            for key, frames in columns.items():
                if frames.ndim == 4 and video:
                    meta |= _write_episode_video(root, version, key, index, frames, fps)
            meta |= {"dataset_from_index": total, "dataset_to_index": total + length}
            episode_rows.append(meta)
            total += length
        if features is None:
            raise ValueError(f"write_lerobot {out}: no episodes to write")
        features |= {k: {"dtype": d, "shape": [1], "names": None} for k, d in
                     (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                      ("index", "int64"), ("task_index", "int64"))}
        schema_meta = {b"huggingface": json.dumps({"info": {"features": {
            k: _hf_feature(f) for k, f in features.items() if f["dtype"] != "video"}}}).encode()}
        _write_tables(root, version, tables, episode_rows, tasks, schema_meta)
        info = {"codebase_version": version, "robot_type": robot_type, "total_episodes": len(episode_rows),
                "total_frames": total, "total_tasks": len(tasks), "chunks_size": CHUNK_SIZE, "fps": fps,
                "splits": {"train": f"0:{len(episode_rows)}"}, "features": features}
        if version == "v3.0":
            info |= {"data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
                     "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
                     "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
                     if video else None}
        else:
            cameras = [k for k, f in features.items() if f["dtype"] == "video"]
            info |= {"total_videos": len(cameras) * len(episode_rows), "total_chunks": 1 + (len(episode_rows) - 1)
                     // CHUNK_SIZE, "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
                     "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
                     if video else None}
        (root / "meta" / "info.json").write_text(json.dumps(info, indent=2))
    return Path(out)



def _column_array(values: np.ndarray):
    """A feature's parquet column with the types its embedded `datasets` features declare (readers that
    trust the embedded features, as lerobot 0.3's v2.1 path does, need them to match): images as
    struct<bytes: binary, path: string>, vectors as fixed-size lists, scalars as themselves."""
    pa, _, _ = _libraries()
    if values.ndim == 4:
        struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        return pa.array([{"bytes": _png_bytes(f), "path": None} for f in values], struct)
    if values.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
    return pa.array(list(values)) if values.ndim > 2 else pa.array(values)


def _png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG")
    return buffer.getvalue()


def _write_episode_video(root: Path, version: str, key: str, index: int, frames: np.ndarray, fps: int) -> dict:
    """v2.1: one mp4 per episode; v3.0: one mp4 per episode too (file_index = episode), which the
    layout allows (episodes are located by file and from_timestamp)."""
    chunk, number = divmod(index, CHUNK_SIZE)
    if version == "v3.0":
        _encode_video(root / f"videos/{key}/chunk-{chunk:03d}/file-{number:03d}.mp4", frames, fps)
        return {f"videos/{key}/chunk_index": chunk, f"videos/{key}/file_index": number,
                f"videos/{key}/from_timestamp": 0.0, f"videos/{key}/to_timestamp": len(frames) / fps}
    _encode_video(root / f"videos/chunk-{chunk:03d}/{key}/episode_{index:06d}.mp4", frames, fps)
    return {}


def _write_tables(root: Path, version: str, tables: list, episode_rows: list[dict], tasks: dict[str, int],
                  schema_meta: dict) -> None:
    pa, pq, _ = _libraries()
    (root / "meta").mkdir(parents=True, exist_ok=True)
    with_meta = lambda table: table.replace_schema_metadata({**(table.schema.metadata or {}), **schema_meta})  # noqa: E731
    if version == "v3.0":
        (root / "data" / "chunk-000").mkdir(parents=True)
        pq.write_table(with_meta(pa.concat_tables(tables)), root / "data" / "chunk-000" / "file-000.parquet")
        _write_tasks(root / "meta" / "tasks.parquet", tasks)
        flat = [{k: v for k, v in row.items() if k != "stats"} | {"data/chunk_index": 0, "data/file_index": 0}
                | {f"stats/{feature}/{name}": value for feature, stats in row["stats"].items()
                   for name, value in stats.items()} for row in episode_rows]
        (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(flat), root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    else:
        for row, table in zip(episode_rows, tables):
            chunk = row["episode_index"] // CHUNK_SIZE
            path = root / "data" / f"chunk-{chunk:03d}" / f"episode_{row['episode_index']:06d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(with_meta(table), path)
        lines = lambda rows: "".join(json.dumps(r) + "\n" for r in rows)  # noqa: E731
        (root / "meta" / "tasks.jsonl").write_text(lines({"task_index": i, "task": t} for t, i in tasks.items()))
        (root / "meta" / "episodes.jsonl").write_text(lines(
            {k: row[k] for k in ("episode_index", "tasks", "length")} for row in episode_rows))
        (root / "meta" / "episodes_stats.jsonl").write_text(lines(
            {"episode_index": row["episode_index"], "stats": row["stats"]} for row in episode_rows))
    (root / "meta" / "stats.json").write_text(json.dumps(_aggregate([row["stats"] for row in episode_rows]), indent=2))


def _aggregate(per_episode: list[dict]) -> dict:
    """Dataset statistics from per-episode ones (count-weighted mean and pooled variance, as LeRobot's)."""
    out = {}
    for key in per_episode[0]:
        counts = np.array([s[key]["count"][0] for s in per_episode], dtype=np.float64)
        means = np.array([s[key]["mean"] for s in per_episode])
        variances = np.array([s[key]["std"] for s in per_episode]) ** 2
        weights = (counts / counts.sum()).reshape(-1, *[1] * (means.ndim - 1))
        mean = (weights * means).sum(0)
        std = np.sqrt((weights * (variances + (means - mean) ** 2)).sum(0))
        out[key] = {"min": np.min([s[key]["min"] for s in per_episode], 0).tolist(),
                    "max": np.max([s[key]["max"] for s in per_episode], 0).tolist(),
                    "mean": mean.tolist(), "std": std.tolist(), "count": [int(counts.sum())]}
    return out
