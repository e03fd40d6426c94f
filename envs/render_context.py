"""The envs of one LIBERO scene in one process render through one OpenGL context.

A LIBERO scene's textures take ~555 MB once uploaded to its GL context (17 textures up to 4096²,
six faces for cube maps, RGBA with mipmaps), its meshes and 4096² shadow map ~190 MB more, and
the MuJoCo model keeps another 185 MB of texture pixels after the upload. robosuite gives every
sim a context of its own. Here envs of the same compiled scene share one context (one upload),
each keeping its own MjvScene, camera and options, so its frames are those a private context
renders; and the model's texture pixels, never read again, are given back to the OS.

Written against robosuite's `MjRenderContext` (the object its sims and sensors render through),
which has no way to share a context between sims.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import sys
import weakref
from contextlib import contextmanager
from typing import Callable

import mujoco
import numpy as np
from robosuite.utils.binding_utils import GLContext, MjRenderContext, MjRenderContextOffscreen


class SceneUpload:
    """A GL context holding one scene's uploaded textures, meshes and offscreen buffers (MuJoCo's
    MjrContext); freed when the last render context using it is gone."""

    def __init__(self, model: mujoco.MjModel, device_id: int):
        self.gl_ctx = GLContext(max_width=model.vis.global_.offwidth, max_height=model.vis.global_.offheight,
                                device_id=device_id)
        self.gl_ctx.make_current()
        self.con = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.con)

    def __del__(self):
        if getattr(self, "con", None) is None or sys.is_finalizing():
            return  # failed to build; or the interpreter is exiting, EGL maybe terminated (the OS frees all)
        self.gl_ctx.make_current()  # MjrContext.free deletes GL objects of whichever context is current
        self.con.free()
        self.gl_ctx.free()


_uploads: weakref.WeakValueDictionary[tuple[str, int], SceneUpload] = weakref.WeakValueDictionary()


def live_uploads() -> int:
    """How many scene uploads (GL contexts) this process holds."""
    return len(_uploads)


class SharedRenderContext(MjRenderContext):
    """robosuite's offscreen render context for one sim, rendering through its scene's shared upload.

    The per-sim state is set up as robosuite's own `__init__` does (which would also create a GL
    context and upload the scene, the cost avoided here).
    """

    def __init__(self, sim, device_id: int, scene: str):
        self.sim, self.offscreen, self.device_id = sim, True, device_id
        key = (scene, device_id)
        self.upload = _uploads.get(key)
        if self.upload is None:
            self.upload = _uploads[key] = SceneUpload(sim.model._model, device_id)
        self.gl_ctx, self.con = self.upload.gl_ctx, self.upload.con
        self.gl_ctx.make_current()
        sim.forward()
        sim.add_render_context(self)
        self.model, self.data = sim.model, sim.data
        self.scn = mujoco.MjvScene(sim.model._model, maxgeom=1000)
        self.cam = mujoco.MjvCamera()
        self.cam.fixedcamid = 0
        self.cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self.vopt = mujoco.MjvOption()
        self.pert = mujoco.MjvPerturb()
        self.pert.active, self.pert.select, self.pert.skinselect = 0, 0, -1
        release_pages(sim.model._model.tex_data)

    def update_offscreen_size(self, width: int, height: int) -> None:
        raise ValueError(f"a shared render context cannot grow its offscreen buffer to {width}x{height}; it is "
                         f"{self.con.offWidth}x{self.con.offHeight}")

    def upload_texture(self, tex_id: int) -> None:
        raise RuntimeError(f"texture {tex_id} cannot be uploaded again: the model's texture pixels were released "
                           "after the scene's upload")

    def __del__(self):
        pass  # the upload is freed with its last user; robosuite's __del__ would free it for all


def release_current() -> None:
    """Leave no GL context current in this thread. An EGL context can be current in one thread at a
    time, so an env that renders with its context current and then releases it can be rendered
    next from any thread (e.g. the rollout engine's simulator thread). Other renderers: nothing."""
    from robosuite.utils import binding_utils

    if binding_utils._MUJOCO_GL != "egl":
        return
    from robosuite.renderers.context import egl_context

    if egl_context.EGL_DISPLAY is not None:
        EGL = egl_context.EGL
        EGL.eglMakeCurrent(egl_context.EGL_DISPLAY, EGL.EGL_NO_SURFACE, EGL.EGL_NO_SURFACE, EGL.EGL_NO_CONTEXT)


def render_context_factory(scene: Callable[[], str], resolution: int):
    """What robosuite calls to make a sim's offscreen render context: a `SharedRenderContext` for the
    scene `scene()` names (a digest of its compiled XML), or robosuite's own when the frames are
    larger than the model's offscreen buffer, which only a private context can grow."""

    def make(sim, device_id: int = -1, **options):
        visual = sim.model._model.vis.global_
        if resolution > min(visual.offwidth, visual.offheight) or options:
            return MjRenderContextOffscreen(sim, device_id=device_id, **options)
        return SharedRenderContext(sim, device_id, scene())

    return make


def scene_digest(xml: str) -> str:
    return hashlib.sha256(xml.encode()).hexdigest()


@contextmanager
def shared_rendering(make_context):
    """While robosuite builds an env, its sims get their render context from `make_context`
    (robosuite has no hook for it, so the name its base env calls is replaced for the duration)."""
    import robosuite.environments.base as base

    private = base.MjRenderContextOffscreen
    base.MjRenderContextOffscreen = make_context
    try:
        yield
    finally:
        base.MjRenderContextOffscreen = private


_MADV_DONTNEED = 4


def release_pages(array: np.ndarray) -> None:
    """Give the whole memory pages under `array` back to the OS (Linux; elsewhere nothing happens).
    Reading them afterwards gives zeros. By hand: no library frees part of an allocation it does
    not own (Python's `mmap.madvise` needs an mmap object)."""
    if not sys.platform.startswith("linux") or array.nbytes == 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE
    start = -(-array.ctypes.data // page) * page
    end = (array.ctypes.data + array.nbytes) // page * page
    if end > start and libc.madvise(start, end - start, _MADV_DONTNEED) != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_DONTNEED) failed on the model's texture pixels")
