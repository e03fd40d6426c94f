"""Process set-up that must happen before the first OpenGL context (EGL/OSMesa) exists."""

from __future__ import annotations

import importlib.util
import os

# Set by env worker processes (VectorEnv, Ray actors), which never import torch: they skip triton
# (~80 MB resident per worker).
torch_free_process = False


def prepare_gl() -> None:
    """Choose the headless renderer and load triton's LLVM before Mesa's.

    With no GPU, Mesa renders through llvmpipe, which loads its own LLVM; a CUDA build of torch
    ships triton, whose bundled LLVM segfaults the process when it is imported after that (torch
    imports it lazily, e.g. from torch._dynamo). Importing triton first avoids the clash.
    Idempotent and cheap after the first call.
    """
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    if not torch_free_process and importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401  # optional (CUDA torch), ~0.1 s: loaded here only, before Mesa (see above)
