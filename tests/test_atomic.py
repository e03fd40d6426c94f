"""Atomic output directories never leave a half-written result."""

import pytest

from minivla_wmrl.atomic import atomic_directory


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
