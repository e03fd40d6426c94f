"""`minivla-wmrl compare EVAL_A EVAL_B [...]`: paired comparison of evaluations against the first.

Two checkpoints evaluated on the same (task, trial, sample) episodes start from the same init
states with the same sampling seeds, so their difference is judged episode by episode: the
difference in success with a 95% paired-bootstrap interval (init states resampled, their samples
kept together) and the exact McNemar p-value of the discordant episodes. Evaluations whose
result-changing settings differ (step cap, sampling, image convention, ...) are not comparable
and are refused, naming the settings.
"""

from __future__ import annotations

import json
from pathlib import Path

from minivla_wmrl.evaluation.evaluate import read_episodes, setting
from minivla_wmrl.evaluation.statistics import paired_difference
from minivla_wmrl.infra.outputs import write_json_output

# the settings that may differ between compared evaluations: what is compared, and what cannot change results
FREE_SETTINGS = ("checkpoint", "checkpoint_sha256", "tasks", "trials", "first_trial", "torch", "python")


def load_evaluation(path: Path) -> tuple[dict, dict]:
    """(settings, success by (task, trial, sample)) of an evaluation directory (or its eval_info.json)."""
    directory = Path(path).parent if Path(path).name == "eval_info.json" else Path(path)
    settings_path = directory / "eval_settings.json"
    if not settings_path.is_file():
        raise FileNotFoundError(f"{directory} is not an evaluation directory: it lacks eval_settings.json "
                                "(written by minivla-wmrl eval)")
    episodes = read_episodes(directory / "episodes.jsonl")
    if not episodes:
        raise ValueError(f"{directory}: episodes.jsonl holds no finished episode")
    return json.loads(settings_path.read_text()), {key: bool(r["success"]) for key, r in episodes.items()}


def check_comparable(a: dict, b: dict, name_a: str, name_b: str) -> None:
    keys = sorted((set(a) | set(b)) - set(FREE_SETTINGS))
    differ = [k for k in keys if setting(a, k) != setting(b, k)]
    if differ:
        details = "; ".join(f"{k}: {setting(a, k)!r} vs {setting(b, k)!r}" for k in differ)
        raise ValueError(f"{name_a} and {name_b} were evaluated with different settings that change results "
                         f"({details}); evaluate both with the same settings")


def by_state(results: dict) -> dict:
    """Success by ((task, trial), sample): the init state is the unit the bootstrap resamples."""
    return {((task, trial), sample): v for (task, trial, sample), v in results.items()}


def compare(paths: list[Path]) -> list[dict]:
    """Each evaluation after the first against the first, on the episodes they share."""
    if len(paths) < 2:
        raise ValueError("compare needs at least two evaluation directories")
    base_settings, base = load_evaluation(paths[0])
    rows = []
    for path in paths[1:]:
        settings, other = load_evaluation(path)
        check_comparable(base_settings, settings, str(paths[0]), str(path))
        rows.append({"a": str(paths[0]), "b": str(path), **paired_difference(by_state(base), by_state(other))})
    return rows


def comparison_table(rows: list[dict]) -> str:
    lines = ["| A | B | episodes | success A | success B | B − A [95% CI] | gained / lost | McNemar p |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        low, high = r["ci95"]
        lines.append(f"| {r['a']} | {r['b']} | {r['episodes']} | {100 * r['success_a']:.1f}% "
                     f"| {100 * r['success_b']:.1f}% "
                     f"| {100 * r['difference']:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] "
                     f"| {r['gained']} / {r['lost']} "
                     f"| {r['p_mcnemar']:.3g} |")
    lines += ["", "Two checkpoints, one evaluation each: the interval resamples init states (random: the states, "
              "their samples kept together); McNemar tests the discordant episodes. Neither says whether *training* "
              "helps: that takes several training seeds (`minivla-wmrl ablate`, the seed as the unit)."]
    return "\n".join(lines) + "\n"


def main(args) -> None:
    rows = compare([Path(p) for p in args.evaluations])
    print(comparison_table(rows))
    if args.json:
        write_json_output(Path(args.json), rows)
