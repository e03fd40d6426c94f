"""How LIBERO envs render: every robosuite sim gets its offscreen render context from here.

A LIBERO scene's textures take ~555 MB once uploaded to its GL context (17 textures up to 4096²,
six faces for cube maps, RGBA with mipmaps), its meshes and 4096² shadow map ~190 MB more, and
the MuJoCo model keeps another 185 MB of texture pixels after the upload. robosuite gives every
sim a context of its own. Here envs of the same compiled scene share one context (one upload),
each keeping its own MjvScene, camera and options, so its frames are those a private context
renders; and the model's texture pixels, never read again, are given back to the OS.

Envs that cannot share (hard resets, frames larger than the model's offscreen buffer) get a
private context, as in robosuite, but one that frees its GL objects in its own context: robosuite
frees them in whichever context is current when Python collects the old sim, which after a hard
reset is the new sim's, whose textures and framebuffers are then gone (frames of noise).

Every context here is freed before EGL is terminated at interpreter exit (robosuite's own print
"Exception ignored ... EGLError" when Python collects them afterwards).

Written against robosuite's `MjRenderContext` (the object its sims and sensors render through),
which has no way to share a context between sims nor to free one in the right GL context.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import mmap
import sys
import weakref
from contextlib import contextmanager
from typing import Callable

import mujoco
import numpy as np
import robosuite.environments.base as robosuite_base
from robosuite.utils import binding_utils
from robosuite.utils.binding_utils import GLContext, MjRenderContext, MjRenderContextOffscreen


def _egl():
    """robosuite's EGL module when it renders through EGL, else None (OSMesa, GLFW)."""
    if binding_utils._MUJOCO_GL != "egl":
        return None
    from robosuite.renderers.context import egl_context  # raises ImportError unless rendering through EGL

    return egl_context if egl_context.EGL_DISPLAY is not None else None


def _make_current(context) -> None:
    """Make an EGL context (None: no context) current in this thread."""
    egl = _egl()
    if egl is not None:
        EGL = egl.EGL
        EGL.eglMakeCurrent(egl.EGL_DISPLAY, EGL.EGL_NO_SURFACE, EGL.EGL_NO_SURFACE,
                           EGL.EGL_NO_CONTEXT if context is None else context)


def release_current() -> None:
    """Leave no GL context current in this thread. An EGL context can be current in one thread at a
    time, so an env that renders with its context current and then releases it can be rendered
    next from any thread (e.g. the rollout engine's simulator thread). Other renderers: nothing."""
    _make_current(None)


def _free_gl(gl_ctx: GLContext, con: mujoco.MjrContext) -> None:
    """Free an MjrContext's GL objects in their own GL context, then that context, and leave the
    context that was current in this thread (if another) current again: Python may collect a render
    context in the middle of another's work, e.g. a hard reset building the next sim's."""
    egl = _egl()
    previous = egl.EGL.eglGetCurrentContext() if egl is not None else None
    own = getattr(gl_ctx, "_context", None)
    gl_ctx.make_current()
    con.free()
    gl_ctx.free()  # leaves no context current in this thread (robosuite's eglReleaseThread)
    if previous and not (own and previous.address == own.address):
        _make_current(previous)


_live: weakref.WeakSet = weakref.WeakSet()  # GL owners to free before EGL is terminated at exit
_exit_hook_registered = False


def _track(owner) -> None:
    """Free `owner` at exit if it is still alive then. robosuite registers EGL's termination with
    `atexit` when the process's first GL context is made; a hook registered after it runs before it."""
    global _exit_hook_registered
    _live.add(owner)
    if not _exit_hook_registered:
        atexit.register(_free_all)
        _exit_hook_registered = True


def _free_all() -> None:
    for owner in list(_live):
        try:
            owner.free()
        except Exception:  # the display was terminated first (another library's exit hook): the OS frees all
            _forget(owner.gl_ctx)


def _forget(gl_ctx: GLContext) -> None:
    """Drop a GL context without freeing it, so that its own `__del__` does nothing."""
    if hasattr(gl_ctx, "_context"):
        gl_ctx._context = None


class _OwnsGL:
    """A GL context and MjrContext freed once, in order (`_free_gl`), by `free()`, collection or exit."""

    gl_ctx: GLContext
    con: mujoco.MjrContext | None = None

    def free(self) -> None:
        con, self.con = self.con, None
        if con is None:
            return
        if sys.is_finalizing():  # EGL may be terminated already; the OS frees all
            _forget(self.gl_ctx)
        else:
            _free_gl(self.gl_ctx, con)

    def __del__(self):
        self.free()


class SceneUpload(_OwnsGL):
    """A GL context holding one scene's uploaded textures, meshes and offscreen buffers (MuJoCo's
    MjrContext); freed when the last render context using it is gone."""

    def __init__(self, model: mujoco.MjModel, device_id: int):
        self.gl_ctx = GLContext(max_width=model.vis.global_.offwidth, max_height=model.vis.global_.offheight,
                                device_id=device_id)
        self.gl_ctx.make_current()
        self.con = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.con)
        _track(self)


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


class PrivateRenderContext(_OwnsGL, MjRenderContextOffscreen):
    """robosuite's offscreen render context for one sim, with a GL context of its own, freed in that
    context (robosuite's own frees its GL objects in whichever context is current)."""

    def __init__(self, sim, device_id: int = -1, **options):
        MjRenderContextOffscreen.__init__(self, sim, device_id=device_id, **options)
        _track(self)


def render_context_factory(scene: Callable[[], str] | None, resolution: int):
    """What robosuite calls to make a sim's offscreen render context: a `SharedRenderContext` for the
    scene `scene()` names (a digest of its compiled XML); a `PrivateRenderContext` without a scene
    or when the frames are larger than the model's offscreen buffer, which only a private context
    can grow."""

    def make(sim, device_id: int = -1, **options):
        visual = sim.model._model.vis.global_
        if scene is None or resolution > min(visual.offwidth, visual.offheight) or options:
            return PrivateRenderContext(sim, device_id=device_id, **options)
        return SharedRenderContext(sim, device_id, scene())

    return make


def scene_digest(xml: str) -> str:
    return hashlib.sha256(xml.encode()).hexdigest()


@contextmanager
def rendering_through(make_context):
    """While robosuite builds an env or hard-resets it (a new sim), its sims get their render context
    from `make_context` (robosuite has no hook for it, so the name its base env calls is replaced for
    the duration)."""
    private = robosuite_base.MjRenderContextOffscreen
    robosuite_base.MjRenderContextOffscreen = make_context
    try:
        yield
    finally:
        robosuite_base.MjRenderContextOffscreen = private


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
