"""The command line: the env benchmark end to end on the real simulator."""

import json
import subprocess
import sys

import pytest


@pytest.mark.simulator
def test_bench_env_writes_the_three_timings(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "minivla_wmrl.cli", "bench", "env", "--suite", "libero_90",
                           "--task", "0", "--steps", "16", "--chunk", "8", "--repeats", "1", "--json", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert {"naive_s", "engine_s", "floor_s", "speedup"} <= set(result)
    assert result["speedup"] == result["naive_s"] / result["engine_s"]
    assert all(result[k] > 0 for k in ("naive_s", "engine_s", "floor_s"))
    assert "| naive " in done.stdout and "speedup (naive / engine)" in done.stdout


def test_unknown_suite_is_a_clean_error():
    done = subprocess.run([sys.executable, "-m", "minivla_wmrl.cli", "bench", "env", "--suite", "libero_100",
                           "--repeats", "1"], capture_output=True, text=True)
    assert done.returncode == 1 and "unknown LIBERO suite 'libero_100'" in done.stderr
