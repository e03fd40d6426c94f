"""A benchmark's baseline must do the work it is compared with, checked before a ratio is reported.

A baseline that silently does less (renders noise, skips a camera, decodes other tokens) runs
faster and turns the ratio into nonsense; `bench policy` compares tokens, `bench env` and
`bench rollout` the frames the policy would see at every chunk boundary.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

# two cameras of a LIBERO scene differ by ~80 grey levels per pixel; a render that ignores its camera by < 1
MIN_CAMERA_DIFFERENCE = 10.0


class DifferentWork(RuntimeError):
    """The two ways a benchmark compares did not produce the same output: it reports no ratio."""


def check_same_frames(what: str, baseline: Sequence[np.ndarray], ours: Sequence[np.ndarray]) -> int:
    """Raise `DifferentWork` unless both ways gave the same frames, pixel for pixel; returns their number."""
    if len(baseline) != len(ours):
        raise DifferentWork(f"{what}: the baseline gave {len(baseline)} frames at chunk boundaries, ours "
                            f"{len(ours)}; the benchmark would compare different work, so it reports no ratio")
    for i, (theirs, mine) in enumerate(zip(baseline, ours)):
        if theirs.shape != mine.shape or not np.array_equal(theirs, mine):
            difference = (f"shapes {theirs.shape} and {mine.shape}" if theirs.shape != mine.shape else
                          f"mean |difference| {np.abs(theirs.astype(int) - mine).mean():.2f} grey levels")
            raise DifferentWork(f"{what}: frame {i} of the baseline differs from ours ({difference}); the benchmark "
                                "would compare different work, so it reports no ratio")
    return len(ours)


def check_cameras_differ(what: str, first: Sequence[np.ndarray], second: Sequence[np.ndarray]) -> None:
    """Raise `DifferentWork` when two cameras gave (nearly) the same picture at some frame: one of
    them did not render its own view."""
    for i, (a, b) in enumerate(zip(first, second)):
        difference = np.abs(a.astype(int) - b).mean()
        if difference < MIN_CAMERA_DIFFERENCE:
            raise DifferentWork(f"{what}: the two cameras' frames {i} differ by only {difference:.2f} grey levels "
                                f"(expected >= {MIN_CAMERA_DIFFERENCE}): one did not render its own view")
