"""The README's headline evidence is the committed ablation's: its rows are recomputed from
`docs/ablation_rl_cpu.json`'s per-episode evidence (as `ablate --from-json` does) and must match."""

from pathlib import Path

from minivla_wmrl.ablation import report_from_json

ROOT = Path(__file__).resolve().parent.parent
ROWS = {"sparse": "| sparse GRPO", "shuffled": "| shuffled rewards", "lr0": "| lr 0"}  # each arm's README row


def _points(x: float) -> str:
    return f"{100 * x:+.1f}".replace("-", "−")


def test_readme_headline_rows_are_the_committed_ablations():
    report = report_from_json(ROOT / "docs" / "ablation_rl_cpu.json")
    readme = (ROOT / "README.md").read_text()
    assert f"vs SFT ({100 * report['sft']['success_rate']:.1f}%)" in readme
    assert sorted(arm["arm"] for arm in report["arms"]) == sorted(ROWS)  # no arm missing, no stale row
    for arm in report["arms"]:
        (row,) = [line for line in readme.splitlines() if line.startswith(ROWS[arm["arm"]])]
        assert f"{100 * arm['held_out']['mean']:.1f}%" in row, (arm["arm"], row)
        assert ", ".join(f"{100 * s:.0f}" for s in arm["held_out_per_seed"]) in row, (arm["arm"], row)
        vs = arm["vs_sft"]
        assert _points(vs["difference"]) in row, (arm["arm"], row)
        if vs["ci95"] is not None:
            low, high = vs["ci95"]
            assert f"[{_points(low)}, {_points(high)}]" in row, (arm["arm"], row)
