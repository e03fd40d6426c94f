"""The benchmarks' check that a baseline does the work it is compared with (pure logic)."""

import numpy as np
import pytest

from minivla_wmrl.bench.same_work import DifferentWork, check_cameras_differ, check_same_frames

RNG = np.random.default_rng(0)
FRAMES = [RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in range(3)]


def test_equal_frames_pass_and_are_counted():
    assert check_same_frames("x", FRAMES, [f.copy() for f in FRAMES]) == 3


def test_one_pixel_off_is_refused_with_the_frame_named():
    other = [f.copy() for f in FRAMES]
    other[2][4, 4, 0] ^= 1
    with pytest.raises(DifferentWork, match=r"x: frame 2 of the baseline differs from ours \(mean \|difference\| "
                                            r"0.01 grey levels\); .* reports no ratio"):
        check_same_frames("x", FRAMES, other)


def test_missing_frames_and_other_shapes_are_refused():
    with pytest.raises(DifferentWork, match="the baseline gave 3 frames at chunk boundaries, ours 2"):
        check_same_frames("x", FRAMES, FRAMES[:2])
    with pytest.raises(DifferentWork, match=r"frame 0 .*\(shapes \(8, 8, 3\) and \(4, 8, 3\)"):
        check_same_frames("x", FRAMES[:1], [FRAMES[0][:4]])


def test_two_cameras_giving_one_picture_are_refused():
    check_cameras_differ("x", FRAMES, FRAMES[1:] + [255 - FRAMES[2]])
    with pytest.raises(DifferentWork, match="the two cameras' frames 0 differ by only 0.00 grey levels"):
        check_cameras_differ("x", FRAMES, FRAMES)
