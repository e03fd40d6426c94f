"""Atomic output directories never leave a half-written result."""

import pytest

from minivla_wmrl.infra.atomic import atomic_directory


def test_failed_write_keeps_the_previous_directory_and_leaves_no_temp(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "weights").write_text("v1")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_directory(target) as tmp:
            (tmp / "weights").write_text("half")
            raise RuntimeError("disk full")
    assert (target / "weights").read_text() == "v1"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_temporaries_of_killed_writers_are_removed_and_outputs_get_normal_permissions(tmp_path):
    import os
    import stat

    from minivla_wmrl.infra.atomic import atomic_file

    (tmp_path / ".ckpt.4999999.x1y2").mkdir()  # left by a process killed mid-checkpoint (no such pid)
    (tmp_path / ".ckpt.notapid.x").mkdir()  # not ours: kept
    (tmp_path / ".stats.json.4999999.z.tmp").write_text("half")
    with atomic_directory(tmp_path / "ckpt") as tmp:
        (tmp / "weights").write_text("v1")
    with atomic_file(tmp_path / "stats.json") as tmp:
        tmp.write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt.notapid.x", "ckpt", "stats.json"]
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((tmp_path / "ckpt").stat().st_mode) == 0o777 & ~mask  # not mkdtemp's 0700
    assert stat.S_IMODE((tmp_path / "stats.json").stat().st_mode) == 0o666 & ~mask  # not mkstemp's 0600


def test_a_full_disk_is_named(tmp_path):
    import errno

    with pytest.raises(OSError, match=f"no space left on device while writing {tmp_path / 'ckpt'}"):
        with atomic_directory(tmp_path / "ckpt"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []
