"""LIBERO assets: the manifest, verification errors that name files, and configuration in spawned processes."""

import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.libero_assets import AssetError, configure_libero, git_blob_sha1, read_manifest, verify_assets


def test_manifest_lists_the_585_upstream_files():
    entries = read_manifest()
    assert len(entries) == 585 and len({e.path for e in entries}) == 585
    assert all(len(e.sha1) == 40 for e in entries)


def test_git_blob_sha1_matches_git():
    # `printf 'hello\n' | git hash-object --stdin`
    assert git_blob_sha1(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_installed_assets_verify_fully():
    directory = configure_libero()
    verify_assets(directory, full=True)  # raises naming any missing or altered file
    from libero.libero import get_libero_path

    assert Path(get_libero_path("assets")).resolve() == directory.resolve()  # LIBERO reads what was verified
    sample = read_manifest()[::97]  # spot-check the verifier's own work: sizes and checksums, 7 files
    assert all(git_blob_sha1((directory / e.path).read_bytes()) == e.sha1 for e in sample)


def _mirror(source: Path, target: Path) -> None:
    for entry in read_manifest():
        (target / entry.path).parent.mkdir(parents=True, exist_ok=True)
        (target / entry.path).symlink_to(source / entry.path)


def test_missing_and_altered_files_are_named(tmp_path):
    _mirror(configure_libero(), tmp_path)
    entries = read_manifest()
    missing, altered = entries[0].path, entries[1].path
    (tmp_path / missing).unlink()
    data = (tmp_path / altered).read_bytes()
    (tmp_path / altered).unlink()
    (tmp_path / altered).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(AssetError) as error:
        verify_assets(tmp_path)
    assert f"missing: {tmp_path / missing}" in str(error.value)
    assert f"altered: {tmp_path / altered}" in str(error.value)
    assert "1 missing, 1 altered" in str(error.value)


def test_assets_command_fails_naming_the_missing_file(tmp_path):
    _mirror(configure_libero(), tmp_path)
    gone = read_manifest()[10].path
    (tmp_path / gone).unlink()
    env = dict(os.environ, LIBERO_ASSETS_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "minivla_wmrl.cli", "assets"], env=env, capture_output=True, text=True)
    assert done.returncode != 0
    assert str(tmp_path / gone) in done.stderr


def _assets_path_in_child(queue):
    from envs.libero_env import get_suite

    get_suite("libero_10")  # configures LIBERO in this process
    import libero.libero

    queue.put((libero.libero.get_assets_path(), os.environ["LIBERO_CONFIG_PATH"]))


def test_spawned_worker_uses_the_verified_assets():
    assets = configure_libero()
    queue = mp.get_context("spawn").Queue()
    child = mp.get_context("spawn").Process(target=_assets_path_in_child, args=(queue,))
    child.start()
    path, config = queue.get(timeout=120)
    child.join()
    assert Path(path) == assets and (Path(config) / "config.yaml").is_file()


def test_plain_libero_import_never_prompts():
    configure_libero()
    done = subprocess.run([sys.executable, "-c", "import libero.libero.benchmark"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
