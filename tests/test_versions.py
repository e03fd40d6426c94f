"""What a run records about the software and threads it ran with (`versions.json`)."""

import json
from importlib import metadata

import torch

from minivla_wmrl.infra.versions import record_versions


def test_versions_name_the_commit_packages_and_cpu_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        recorded = json.loads(record_versions(tmp_path).read_text())
    finally:
        torch.set_num_threads(threads)
    assert recorded["torch_threads"] == 1 and recorded["omp_num_threads"] == "1"
    assert recorded["packages"]["torch"] == metadata.version("torch")
    assert recorded["minivla_wmrl_commit"] is None or len(recorded["minivla_wmrl_commit"]) >= 40
