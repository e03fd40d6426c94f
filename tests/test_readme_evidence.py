"""The README's headline evidence is the committed ablations': its rows are recomputed from
`docs/ablation_rl_cpu*.json`'s per-episode evidence (as `ablate --from-json` does) and must match;
likewise the gate-report table in docs/wmrl_grpo.md from `docs/gate_report_task28.json`."""

from pathlib import Path

import numpy as np

from minivla_wmrl.ablation import against, evidence_from_json, merge_evidence, report_from_json, summarize_ablation

ROOT = Path(__file__).resolve().parent.parent
ROWS = {"sparse": "| sparse GRPO", "shuffled": "| shuffled rewards", "lr0": "| lr 0"}  # each arm's README row


def _points(x: float) -> str:
    return f"{100 * x:+.1f}".replace("-", "−")


def _seed_for_seed(arm: dict, reference: dict) -> str:
    """The README's per-seed differences of two arms' finals, in whole points, paired by seed index."""
    return ", ".join(f"{100 * (a - b):+.0f}".replace("-", "−")
                     for a, b in zip(arm["held_out_per_seed"], reference["held_out_per_seed"]))


def test_readme_headline_rows_are_the_committed_ablations():
    report = report_from_json(ROOT / "docs" / "ablation_rl_cpu.json")
    readme = (ROOT / "README.md").read_text().split("**Does RL help?")[1].split("\n\n**")[0]
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


def test_readme_transfer_rows_are_the_committed_ablations():
    """The sparse arm on each task, from that task's committed ablation."""
    section = (ROOT / "README.md").read_text().split("**Does it transfer?")[1].split("\n\n**")[0]
    for task, evidence in (("0", "ablation_rl_cpu.json"), ("28", "ablation_rl_cpu_t28.json"),
                           ("47", "ablation_rl_cpu_t47.json")):
        report = report_from_json(ROOT / "docs" / evidence)
        (sparse,) = [arm for arm in report["arms"] if arm["arm"] == "sparse"]
        (row,) = [line for line in section.splitlines() if line.startswith(f"| {task} (")]
        low, high = sparse["vs_sft"]["ci95"]
        for expected in (f"| {100 * report['sft']['success_rate']:.1f}% |",
                         f"| {100 * sparse['held_out']['mean']:.1f}% |",
                         f"{_points(sparse['vs_sft']['difference'])} [{_points(low)}, {_points(high)}]",
                         ", ".join(f"{100 * s:.0f}" for s in sparse["held_out_per_seed"])):
            assert expected in row, (task, expected, row)


def _merged(*names: str) -> dict:
    """The report of `ablate --from-json docs/A docs/B --merge`."""
    return summarize_ablation(merge_evidence([(n, evidence_from_json(ROOT / "docs" / n)) for n in names]))


def test_readme_shuffled_controls_on_tasks_28_and_47_are_the_committed_ablations():
    """Task 47's control ran in its own invocation, beside a repeat of sparse seed 0: merged with the
    committed sparse seeds, its seeds pair with theirs."""
    section = (ROOT / "README.md").read_text().split("**Does it transfer?")[1].split("\n\n**")[0]
    sampled = _merged("ablation_rl_cpu_t47.json", "ablation_rl_cpu_t47_control.json")
    reports = (("28", report_from_json(ROOT / "docs" / "ablation_rl_cpu_t28_shuffled.json")), ("47", sampled))
    for task, report in reports:
        arms = {arm["arm"]: arm for arm in report["arms"]}
        shuffled = arms["shuffled"]
        (line,) = [" ".join(item.split()) for item in section.split("\n- ") if item.startswith(f"task {task}:")]
        assert _difference(shuffled["vs_sft"]) in line, (task, line)
        seeds = len(shuffled["held_out_per_seed"])
        assert f"{seeds} seed{'s' if seeds > 1 else ''} (" + ", ".join(
            f"{100 * s:.0f}" for s in shuffled["held_out_per_seed"]) + "%)" in line, (task, line)
        assert f"control − sparse, seed for seed: {_difference(shuffled['vs_first_arm'])}" in line, (task, line)
    greedy = _merged("ablation_rl_cpu_t47_greedy.json", "ablation_rl_cpu_t47_control_greedy.json")
    table = (ROOT / "README.md").read_text().split("**Greedy and sampled")[1].split("\n\n**")[0]
    (row,) = [line for line in table.splitlines() if line.startswith("| 47 |")]
    shuffled = next(a for a in greedy["arms"] if a["arm"] == "shuffled")
    seeds = len(shuffled["held_out_per_seed"])
    assert row.endswith(f"| {_difference(shuffled['vs_sft'])}{f' ({seeds} seeds)' if seeds > 1 else ''} |"), row
    # the one control final the guard keeps: its greedy gain on validation, its sampled record on published states
    (guarded,) = [g for g in sampled["guarded"] if g["arm"] == "shuffled"]
    (kept,) = [seed for seed, keep in enumerate(guarded["kept"]) if keep]
    on_validation = shuffled["vs_sft"]["per_seed"][kept]
    on_published = next(a for a in sampled["arms"] if a["arm"] == "shuffled")["vs_sft"]["per_seed"][kept]
    paragraph = " ".join(table.split("\n- ")[1].split())
    for expected in (f"shuffled seed {shuffled['seeds'][kept]} reached "
                     f"{100 * shuffled['held_out_per_seed'][kept]:.0f}%",
                     f"+{on_validation['gained']}/−{on_validation['lost']} episodes against SFT, exact McNemar "
                     f"p = {on_validation['p_mcnemar']:.3f}",
                     f"(+{on_published['gained']}/−{on_published['lost']})",
                     f"guarded control, sampled: {_difference(guarded['vs_sft'])}"):
        assert expected in paragraph, expected


def test_readme_mean_over_tasks_is_the_committed_ablations_pooled():
    from minivla_wmrl.ablation import pooled_table
    from minivla_wmrl.evaluation.statistics import pooled_over_tasks

    reports = [(f, report_from_json(ROOT / "docs" / f))
               for f in ("ablation_rl_cpu.json", "ablation_rl_cpu_t28.json", "ablation_rl_cpu_t47.json")]
    pooled = pooled_over_tasks([next(a for a in r["arms"] if a["arm"] == "sparse")["vs_sft"] for _, r in reports])
    low, high = pooled["ci95"]
    figure = f"{_points(pooled['difference'])} [{_points(low)}, {_points(high)}] (p = {pooled['p']:.2f}"
    assert figure in " ".join((ROOT / "README.md").read_text().split()), figure
    assert f"{100 * pooled['difference']:+.1f} [{100 * low:.1f}, {100 * high:.1f}]" in pooled_table(reports, "sparse")


def test_the_gate_report_table_is_the_committed_replay():
    import json

    from minivla_wmrl.train.gate_report import report_table

    committed = json.loads((ROOT / "docs" / "gate_report_task28.json").read_text())
    table = report_table(committed["reports"])
    assert table in (ROOT / "docs" / "wmrl_grpo.md").read_text()
    chosen = next(r for r in committed["reports"]
                  if r["gate"]["predictor"] == "policy" and r["gate"]["min_steps"] == 24)
    assert (chosen["gate"]["patience"], chosen["gate"]["wrong_cut_rate"]) == (1, 0.2)  # the setting the docs chose
    total = chosen["total"]
    assert total["real_steps_full"] / total["real_steps"] == total["saving"]
    assert f"{total['saving']:.2f}× against" in (ROOT / "docs" / "wmrl_grpo.md").read_text()


def _difference(comparison: dict) -> str:
    """A seed-level difference as the docs print it: with its interval, or marked as one seed's."""
    if comparison["ci95"] is None:
        return f"{_points(comparison['difference'])} (1 seed)"
    low, high = comparison["ci95"]
    return f"{_points(comparison['difference'])} [{_points(low)}, {_points(high)}]"


def _assert_gated_row(text: str, start: str, arm: dict, sparse_per_step: float) -> None:
    """The one row of `text` starting with `start` shows the arm's seeds, success, difference to SFT and cost."""
    expected = [f"| {len(arm['held_out_per_seed'])} |", f"{100 * arm['held_out']['mean']:.1f}%",
                ", ".join(f"{100 * s:.0f}" for s in arm["held_out_per_seed"]) + "%",
                _difference(arm["vs_sft"]),
                f"{arm['real_steps_per_grpo_step']:.0f}", f"{sparse_per_step / arm['real_steps_per_grpo_step']:.2f}×"]
    (row,) = [line for line in text.splitlines() if line.startswith(start)]
    for figure in expected:
        assert figure in row, (arm["arm"], figure, row)


def test_the_gated_ablation_rows_are_the_committed_ablation():
    """README's and docs/wmrl_grpo.md's gated-execution rows, from docs/ablation_rl_cpu_t28.json."""
    report = report_from_json(ROOT / "docs" / "ablation_rl_cpu_t28.json")
    arms = {arm["arm"]: arm for arm in report["arms"]}
    sparse_per_step = arms["sparse"]["real_steps_per_grpo_step"]
    readme = (ROOT / "README.md").read_text().split("**Does the world model save real execution?")[1].split(
        "**At the protocol's cap")[0]
    docs = (ROOT / "docs" / "wmrl_grpo.md").read_text().split("### The deciding ablation")[1].split(
        "### At the protocol's cap")[0]
    rows = {"sparse": ("| sparse GRPO |", "| sparse |"), "gated24": ("| gated, outcome probe |", "| gated24 ("),
            "gated24_time": ("| gated, time alone |", "| gated24_time ("),
            "truncated": ("| fixed-horizon truncation |", "| truncated (")}
    for name, starts in rows.items():
        arm = arms[name]
        for text, start in zip((readme, docs), starts):
            _assert_gated_row(text, start, arm, sparse_per_step)
        (docs_row,) = [line for line in docs.splitlines() if line.startswith(starts[1])]
        assert f"| {100 * arm['cut_share']:.0f}% |" in docs_row, (name, docs_row)


def test_readme_greedy_rows_are_the_committed_ablations():
    """Sparse GRPO greedily on validation states per task, their mean, the controls, and the guard's choices."""
    from minivla_wmrl.evaluation.statistics import pooled_over_tasks

    section = (ROOT / "README.md").read_text().split("**Greedy and sampled")[1].split("\n\n**")[0]
    reports = []
    for task, evidence in (("0", "ablation_rl_cpu"), ("28", "ablation_rl_cpu_t28"), ("47", "ablation_rl_cpu_t47")):
        report = report_from_json(ROOT / "docs" / f"{evidence}_greedy.json")
        reports.append((task, report))
        settings = report["eval_settings"]
        assert settings["sampling"] == "greedy" and settings["init_states"] == "validation"
        arms = {arm["arm"]: arm for arm in report["arms"]}
        (row,) = [line for line in section.splitlines() if line.startswith(f"| {task} |")]
        sparse = arms["sparse"]
        low, high = sparse["vs_sft"]["ci95"]
        for figure in (f"| {100 * report['sft']['success_rate']:.1f}% |",
                       f"| {100 * sparse['held_out']['mean']:.1f}% |",
                       f"{_points(sparse['vs_sft']['difference'])} [{_points(low)}, {_points(high)}]",
                       ", ".join(f"{100 * s:.0f}" for s in sparse["held_out_per_seed"]) + "%"):
            assert figure in row, (task, figure, row)
        if "shuffled" in arms:
            assert _difference(arms["shuffled"]["vs_sft"]) in row, (task, row)
    pooled = pooled_over_tasks([next(a for a in r["arms"] if a["arm"] == "sparse")["vs_sft"] for _, r in reports])
    (row,) = [line for line in section.splitlines() if line.startswith("| mean over the 3 tasks |")]
    low, high = pooled["ci95"]
    assert f"**{_points(pooled['difference'])} [{_points(low)}, {_points(high)}]**, p = {pooled['p']:.2g}" in row
    for evidence in ("ablation_rl_cpu.json", "ablation_rl_cpu_t28_shuffled.json", "ablation_rl_cpu_t47.json"):
        report = report_from_json(ROOT / "docs" / evidence)
        guard = report["evidence"]["guard"]
        assert guard["accept_p"] == 0.05 and guard["protocol"]["sampling"] == "greedy"
        (sparse,) = [row for row in report["guarded"] if row["arm"] == "sparse"]
        assert sparse["kept"] == [False] * 5  # "kept SFT for all 15 seeds"


def test_readme_control_on_a_rebuilt_task_28_checkpoint_is_the_committed_ablation():
    readme = " ".join((ROOT / "README.md").read_text().split())
    greedy = report_from_json(ROOT / "docs" / "ablation_rl_cpu_t28_control_greedy.json")
    sampled = report_from_json(ROOT / "docs" / "ablation_rl_cpu_t28_control.json")
    sft = f"{100 * greedy['sft']['success_rate']:.0f}% greedy, {100 * sampled['sft']['success_rate']:.0f}% sampled"
    assert sft in readme, sft
    for report, decoding in ((greedy, "greedily"), (sampled, "sampled")):
        arms = {arm["arm"]: arm for arm in report["arms"]}
        vs = arms["shuffled"]["vs_sft"]
        low, high = vs["ci95"]
        assert len(arms["shuffled"]["held_out_per_seed"]) == 5
        assert f"{_points(vs['difference'])} [{_points(low)}, {_points(high)}] {decoding}" in readme, decoding
        assert f"{_points(arms['sparse']['vs_sft']['difference'])}" in readme


def test_readme_prefix_auroc_rows_are_the_committed_probe_reports():
    import json

    lines = (ROOT / "README.md").read_text().splitlines()
    for name, sizes, steps_shown, label in (
            ("probe_report_task28_proprio.json", (1128, 224), (32, 48, 64), "| shuffled control's 5 seeds"),
            ("probe_report_task28_cap400.json", (232, 224), (32, 48, 64, 96), "| collection + sparse400 seed 0 "),
            ("probe_report_task28_cap400_seeds.json", (904, 224), (32, 48, 64, 96), "| collection + sparse400 seeds"),
            ("probe_report_task28_cap400_fresh.json", (48, 448), (32, 48, 64, 96), "| collection alone (48)"),
            ("probe_report_task28_cap400_fresh_fit2.json", (224, 448), (24, 32, 48), "| sparse400 seed 2 (224)"),
            ("probe_report_task28_cap400_fresh_fit23.json", (448, 448), (24, 32, 48), "| sparse400 seeds 2–3"),
            ("probe_report_task28_cap400_fresh_fit234.json", (672, 448), (24, 32, 48), "| sparse400 seeds 2–4"),
            ("probe_report_task28_cap400_fresh_fit012.json", (672, 448), (24, 32, 48), "| sparse400 seeds 0–2")):
        report = json.loads((ROOT / "docs" / name).read_text())
        rows = {r["steps"]: r for r in report["rows"]}
        assert (report["train"], report["test"]) == sizes, name
        (first, *rest) = [f"| {steps} | {rows[steps]['probe_running']:.2f} | {rows[steps]['proprio_running']:.2f} | "
                          f"{rows[steps]['privileged_running']:.2f} |" for steps in steps_shown]
        (start,) = [i for i, line in enumerate(lines) if line.startswith(label)]
        assert f"({sizes[0]}) → " in lines[start] and lines[start].endswith(first), (name, first, lines[start])
        assert [line.removeprefix("| ") for line in lines[start + 1:start + len(steps_shown)]] == rest, (name, rest)


def test_the_cap_400_rows_are_the_committed_ablation_and_replay():
    """README's and docs/wmrl_grpo.md's cap-400 rows, from docs/ablation_rl_cpu_t28_cap400.json, and the
    docs' replay table from docs/gate_report_task28_cap400.json."""
    import json

    from minivla_wmrl.train.gate_report import report_table

    report = report_from_json(ROOT / "docs" / "ablation_rl_cpu_t28_cap400.json")
    arms = {arm["arm"]: arm for arm in report["arms"]}
    readme = (ROOT / "README.md").read_text().split("**At the protocol's cap")[1].split("Evidence:")[0]
    docs = (ROOT / "docs" / "wmrl_grpo.md").read_text().split("### At the protocol's cap")[1]
    rows = {"sparse400": ("| sparse GRPO |", "| sparse400 |"),
            "gated400": ("| gated, probe with proprioception |", "| gated400 ("),
            "gated400_time": ("| gated, time alone |", "| gated400_time ("),
            "gated400_cut10": ("| gated, probe, wrong-cut rate 0.1 |", "| gated400_cut10 ("),
            "gated400_long": ("| gated, probe, 28 GRPO steps |", "| gated400_long ("),
            "oracle400": ("| sparse, trained as a perfect gate would |", "| oracle400 ("),
            "gated400_zero": ("| gated, probe, cut rollouts rewarded 0 |", "| gated400_zero ("),
            "gated400_zero_long": ("| gated, probe, cut rollouts rewarded 0, 28 GRPO steps |",
                                   "| gated400_zero_long (")}
    assert sorted(arms) == sorted(rows) and f"SFT {100 * report['sft']['success_rate']:.1f}%" in readme
    sparse_per_step = arms["sparse400"]["real_steps_per_grpo_step"]
    for name, starts in rows.items():
        for text, start in zip((readme, docs), starts):
            _assert_gated_row(text, start, arms[name], sparse_per_step)
            if name != "sparse400":  # the non-inferiority column: the difference to sparse, seed level
                (row,) = [line for line in text.splitlines() if line.startswith(start)]
                figure = f"| {_difference(arms[name]['vs_first_arm'])} |"
                assert figure in row, (name, figure, row)
    for name in ("gated400", "gated400_time", "gated400_cut10"):  # the per-seed differences the README lists
        per_seed = ", ".join(_points(seed["difference"]).removesuffix(".0")
                             for seed in arms[name]["vs_first_arm"]["per_seed"])
        assert per_seed in " ".join(readme.split()), (name, per_seed)
    assert arms["gated400"]["real_step_ratio"] is None, "the README says the gated arm never reached sparse's final"
    ratio = arms["gated400"]["real_step_ratio_interval"]
    low, high = ratio["ci95"]
    claim = (f"reached in {100 * ratio['reached_share']:.0f}% of seed resamples, at {low:.2f}–{high:.2f}× fewer "
             "steps there")
    assert claim in " ".join(readme.split()), claim
    for name in ("gated400_long", "gated400_zero_long"):  # the headline: real steps to reach sparse's final
        long = arms[name]
        low, high = long["real_step_ratio_interval"]["ci95"]
        for text in (readme, docs):
            claim = f"{long['real_step_ratio']:.2f}× [{low:.2f}, {high:.2f}]"
            assert claim in text, (name, claim)
    # the rewarded-0 gate at GRPO step 14 or 15 (third evaluated checkpoint), pooled over both arms that ran it
    ends = [c[2] for c in arms["gated400_zero"]["seed_curves"] + arms["gated400_zero_long"]["seed_curves"]]
    real, success = (sum(end[i] for end in ends) / len(ends) for i in (0, 1))
    for text in (readme, docs):
        assert f"{100 * success:.1f}% at {real / 1000:.1f}k real steps" in " ".join(text.split())
    budget = arms["gated400_zero_long"]["at_budget"]  # non-inferiority at 1.5x fewer real steps than sparse
    assert report["budget"]["ratio"] == 1.5
    for text in (readme, docs):
        flat = " ".join(text.split())
        assert f"{100 * budget['held_out']['mean']:.1f}% (" in flat and _difference(budget["vs_first_arm"]) in flat
        assert f"steps {', '.join(str(s) for s in budget['steps'])}" in flat
    replay = json.loads((ROOT / "docs" / "gate_report_task28_cap400.json").read_text())
    assert report_table(replay["reports"]) in docs


def test_the_cap_400_finals_played_three_times_as_often_are_the_committed_report():
    """README's and docs/wmrl_grpo.md's `samples6` figures, from docs/ablation_rl_cpu_t28_cap400_samples6.json."""
    report = report_from_json(ROOT / "docs" / "ablation_rl_cpu_t28_cap400_samples6.json")
    sparse, zero = report["arms"]
    assert (sparse["arm"], zero["arm"]) == ("sparse400", "gated400_zero")
    assert report["eval_settings"]["samples_per_state"] == 6 and report["sft"]["trials"] == 150
    assert all(len(c["evaluations"]) == 1 for a in report["evidence"]["arms"] for c in a["cells"])  # finals only
    readme = " ".join((ROOT / "README.md").read_text().split())
    docs = " ".join((ROOT / "docs" / "wmrl_grpo.md").read_text().split())
    assert f"SFT {100 * report['sft']['success_rate']:.1f}%" in readme
    for arm in (sparse, zero):
        per_seed = ", ".join(f"{100 * s:.0f}" for s in arm["held_out_per_seed"]) + "%"
        assert f"{100 * arm['held_out']['mean']:.1f}% ({per_seed}" in readme, (arm["arm"], per_seed)
        assert _difference(arm["vs_sft"]) in readme, arm["arm"]
    versus = _difference(zero["vs_first_arm"])
    assert f"gated against sparse {versus}" in readme and f"the difference {versus}" in docs
    per_seed = ", ".join(f"{100 * s['difference']:+.1f}".replace("-", "−") for s in zero["vs_first_arm"]["per_seed"])
    assert per_seed in readme, per_seed



def _arms_against(evidence: dict, reference: str) -> dict:
    """Every arm's summary, by name, with `reference` as the arm compared against (`ablate --against`)."""
    return {arm["arm"]: arm for arm in summarize_ablation(against(evidence, reference))["arms"]}


def _first_run_sections() -> tuple[str, str]:
    """The first-run replication's README paragraph and docs/wmrl_grpo.md subsection."""
    readme = (ROOT / "README.md").read_text().split("**A first gated run on a task")[1].split("Evidence:")[0]
    docs = (ROOT / "docs" / "wmrl_grpo.md").read_text().split("### A first gated run on a task")[1].split(
        "The corrections are usable")[0]
    return readme, docs


def test_the_first_run_replication_is_the_committed_ablation():
    """README's and docs/wmrl_grpo.md's figures of the gate that learns from its run's collection alone, from
    docs/ablation_rl_cpu_t28_cap400_fresh.json: rows, the ratio to reach sparse's final, that ratio with the
    collection charged to the gated arm, and the fixed-cost comparison."""
    report = report_from_json(ROOT / "docs" / "ablation_rl_cpu_t28_cap400_fresh.json")
    arms = {arm["arm"]: arm for arm in report["arms"]}
    evidence = evidence_from_json(ROOT / "docs" / "ablation_rl_cpu_t28_cap400_fresh.json")
    readme, docs = _first_run_sections()
    order = ["sparse400", "gated400_collect", "time400_collect", "later400_probe", "later400_time", "shuffled400",
             "later400_conformal", "truncated400"]
    assert [arm["arm"] for arm in report["arms"]] == order[:len(arms)]  # the script's optional arms come in order
    assert f"{100 * report['sft']['success_rate']:.1f}%" in readme
    sparse, gated = arms["sparse400"], arms["gated400_collect"]
    _assert_gated_row(readme, "| sparse GRPO |", sparse, sparse["real_steps_per_grpo_step"])
    _assert_gated_row(readme, "| gated, probe, cut rollouts rewarded 0", gated, sparse["real_steps_per_grpo_step"])
    assert ("| gated as above, time alone" in readme) == ("time400_collect" in arms)
    if "time400_collect" in arms:
        time_alone = arms["time400_collect"]
        assert time_alone["seeds"] == gated["seeds"][:len(time_alone["seeds"])]  # paired below seed for seed
        _assert_gated_row(readme, "| gated as above, time alone", time_alone, sparse["real_steps_per_grpo_step"])
        (row,) = [line for line in readme.splitlines() if line.startswith("| gated as above, time alone")]
        assert f"| {_difference(time_alone['vs_first_arm'])} |" in row
        flat = " ".join(readme.split())
        assert f"the probe's arm against it: {_seed_for_seed(gated, time_alone)} points" in flat
        charged = time_alone["charged_ratio"]
        probe = _arms_against(evidence, "time400_collect")["gated400_collect"]  # the probe's gate against time alone's
        assert f"{_difference(probe['vs_first_arm'])} seed level" in flat
        for ratio, interval in ((time_alone["real_step_ratio"], time_alone["real_step_ratio_interval"]),
                                (charged["real_step_ratio"], charged["interval"]),
                                (probe["real_step_ratio"], probe["real_step_ratio_interval"])):
            assert f"{ratio:.2f}× [{interval['ci95'][0]:.2f}, {interval['ci95'][1]:.2f}]" in flat
    assert ("| a later run:" in readme) == ("later400_probe" in arms)
    if "later400_probe" in arms:
        vs_time = _arms_against(evidence, "later400_time")
        flat = " ".join(readme.split())
        for start, name in (("| a later run: the probe's gate, replay", "later400_probe"),
                            ("| a later run: time alone's", "later400_time")):
            _assert_gated_row(readme, start, arms[name], sparse["real_steps_per_grpo_step"])
            (row,) = [line for line in readme.splitlines() if line.startswith(start)]
            assert f"| {_difference(arms[name]['vs_first_arm'])} |" in row
            assert f"cutting {100 * arms[name]['cut_share']:.0f}%" in flat
        assert f"{arms['later400_probe']['replay_real_steps'][0]:,} real steps, which earlier runs paid" in flat
        later = [arms[name] for name in ("later400_probe", "later400_time")]
        assert later[0]["seeds"] == later[1]["seeds"]  # paired seed for seed
        assert (f"seed for seed: {_seed_for_seed(*later)} points at the end, "
                f"{_difference(vs_time['later400_probe']['vs_first_arm'])} seed level") in flat
        for arm in later:
            at_budget = arm["at_budget"]
            assert f"{100 * at_budget['held_out']['mean']:.1f}%, {_difference(at_budget['vs_first_arm'])}" in flat
    for start, name in (("| the control that must not help", "shuffled400"),
                        ("| a later run: the probe's gate, conformal", "later400_conformal"),
                        ("| fixed-horizon truncation", "truncated400")):
        assert (start in readme) == (name in arms), name
        if name in arms:
            _assert_gated_row(readme, start, arms[name], sparse["real_steps_per_grpo_step"])
    if "truncated400" in arms:
        truncated = arms["truncated400"]
        assert truncated["seeds"] == gated["seeds"][:len(truncated["seeds"])]  # paired below seed for seed
        # the probe's gate, paired on truncation's seeds
        gate_vs_truncated = _arms_against(evidence, "truncated400")["gated400_collect"]["vs_first_arm"]
        line = f"The probe's gate against it, seed for seed: {_seed_for_seed(gated, truncated)} points at the end"
        if len(truncated["seeds"]) > 1:
            line += f", {_difference(gate_vs_truncated)} seed level"
        assert line in " ".join(readme.split())
    (row,) = [line for line in readme.splitlines() if line.startswith("| gated, probe, cut rollouts rewarded 0")]
    assert f"| {_difference(gated['vs_first_arm'])} |" in row
    collection = set(gated["replay_real_steps"])
    assert len(collection) == 1 and f"{collection.pop():,} real steps" in " ".join(readme.split())
    for ratio, interval in ((gated["real_step_ratio"], gated["real_step_ratio_interval"]),
                            (gated["charged_ratio"]["real_step_ratio"], gated["charged_ratio"]["interval"])):
        claim = f"{ratio:.2f}×" + ("" if interval is None or interval["ci95"] is None else  # one seed: no interval
                                   f" [{interval['ci95'][0]:.2f}, {interval['ci95'][1]:.2f}]")
        for text in (readme, docs):
            assert claim in text, claim
    budget = gated["at_budget"]
    flat = " ".join(readme.split())
    assert f"{100 * budget['held_out']['mean']:.1f}% (" in flat and _difference(budget["vs_first_arm"]) in flat
    charged_budget = gated["at_budget_charged"]
    steps = ", ".join(str(s) for s in charged_budget["steps"])
    assert (f"charged (spent from the budget before step 1): {100 * charged_budget['held_out']['mean']:.1f}% (steps "
            f"{steps}), {_difference(charged_budget['vs_first_arm'])}") in flat
    above = gated["curve"][0]["success"]["mean"] >= sparse["curve"][-1]["success"]["mean"]  # at the first checkpoint
    assert ("The crossing is interpolated" in flat) == (gated["steps_interpolated"] and above)
    headline = " ".join((ROOT / "README.md").read_text().split("**Does the world model save real execution?")[1].split(
        "Gated execution on task 28")[0].split())
    budget, charged = gated["at_budget"], gated["at_budget_charged"]
    assert report["budget"]["ratio"] == 1.5 and len(sparse["seeds"]) == len(gated["seeds"])
    assert budget["vs_first_arm"]["ci95"][0] >= -0.05 > charged["vs_first_arm"]["ci95"][0]  # met; charged, not shown
    assert (f"held out {100 * budget['held_out']['mean']:.1f}%, {_difference(budget['vs_first_arm'])} points against "
            f"sparse's final ({len(gated['seeds'])} seeds a side, t over seeds with "
            f"{budget['vs_first_arm']['df']:.0f} df): non-inferior") in headline
    assert f"collected episodes spent from that budget, {_difference(charged['vs_first_arm'])}." in headline
    if "time400_collect" in arms:  # `probe`: the probe's gate against time alone's, above
        assert (f"on time alone ({len(arms['time400_collect']['seeds'])} seeds: {_difference(probe['vs_first_arm'])} "
                "points)") in headline
    if "later400_probe" in arms:  # `vs_time`: against later400_time, above
        assert (f"later run whose gate read five earlier runs' episodes ({len(arms['later400_probe']['seeds'])} seeds: "
                f"{_difference(vs_time['later400_probe']['vs_first_arm'])} points)") in headline
    if "truncated400" in arms:  # `gate_vs_truncated`: above
        assert (f"fixed-horizon truncation at the same cost ({len(arms['truncated400']['seeds'])} seeds: "
                f"{_difference(gate_vs_truncated)} points)") in headline
        # what settling them would take: `ablate`'s seeds a side for ±5 points, and the cells still to run for time
        settle = [gated["seeds_to_settle"], probe["seeds_to_settle"], vs_time["later400_probe"]["seeds_to_settle"],
                  _arms_against(evidence, "truncated400")["gated400_collect"]["seeds_to_settle"]]
        cells = [c for a in evidence["arms"] if a["arm"] in ("gated400_collect", "time400_collect") for c in a["cells"]]
        cell_s = np.mean([c["wall_s"] for c in cells])
        to_run = 2 * settle[1] - len(gated["seeds"]) - len(arms["time400_collect"]["seeds"])
        assert (f"an interval of ±5 points would take {settle[0]} seeds a side against sparse, {settle[1]} against "
                f"time alone ({settle[2]} in the later run) and {settle[3]} against truncation") in headline
        assert (f"about {to_run * cell_s / 2 / 3600:.0f} more hours of this machine's 2 cores ({cell_s / 60:.0f} "
                "minutes a cell, two at a time)") in headline


def test_the_first_run_replications_offline_gate_is_the_committed_replay():
    """README's and docs/wmrl_grpo.md's offline comparison of the predictors behind the first-run replication's
    gate (time alone, the probe with and without proprioception, the oracle), from
    docs/gate_report_task28_cap400_fresh_seed{0,1}.json."""
    import json

    readme, docs = _first_run_sections()
    totals = {}
    for seed in (0, 1):
        replay = json.loads((ROOT / "docs" / f"gate_report_task28_cap400_fresh_seed{seed}.json").read_text())
        assert replay["run"].endswith(f"sparse400/seed{seed}/replay") and replay["extra"] == 48
        for report in replay["reports"]:
            totals.setdefault(report["gate"]["predictor"], []).append(report["total"])
    flat, docs_flat = " ".join(readme.split()), " ".join(docs.split())
    for predictor in ("time", "proprio", "policy", "oracle"):
        assert f"{totals[predictor][0]['saving']:.2f}× and {totals[predictor][1]['saving']:.2f}×" in flat, predictor
    for predictor in ("time", "proprio"):
        shares = " and ".join(f"{100 * t['successes_cut_share']:.0f}%" for t in totals[predictor])
        assert f"{shares} of successes" in flat, (predictor, shares)
    assert all(t["failures_cut_share"] == 1.0 for t in totals["time"])
    assert "every failure outside the anchors cut" in flat
    assert " and ".join(f"{100 * t['failures_cut_share']:.0f}%" for t in totals["proprio"]) + " of failures" in flat
    assert (f"{totals['time'][0]['saving']:.2f}× and {totals['time'][1]['saving']:.2f}× against "
            f"{totals['proprio'][0]['saving']:.2f}× and {totals['proprio'][1]['saving']:.2f}×") in docs_flat


def test_where_the_first_run_gate_breaks_is_the_committed_evidence():
    """docs/wmrl_grpo.md's "Where it breaks": successes ended by step 64 (the probe report), the oracle's
    headroom over time alone (the offline replays), real steps per GRPO step of each gate on the seeds both
    ran, and the seeds a side that settling would take (the ablation)."""
    import json

    _, docs = _first_run_sections()
    docs = " ".join(docs.split("**Where it breaks**")[1].split())
    rows = json.loads((ROOT / "docs" / "probe_report_task28_cap400_fresh.json").read_text())
    (at_64,) = [row for row in rows["rows"] if row["steps"] == 64]
    ended = 1 - at_64["running_successes"] / rows["test_successes"]
    assert f"{rows['test']} episodes, {100 * ended:.0f}% of the successes have ended by step 64" in docs
    savings = {}
    for seed in (0, 1):
        replay = json.loads((ROOT / "docs" / f"gate_report_task28_cap400_fresh_seed{seed}.json").read_text())
        for report in replay["reports"]:
            savings.setdefault(report["gate"]["predictor"], []).append(report["total"]["saving"])
    headroom = [1 - time / oracle for time, oracle in zip(savings["time"], savings["oracle"])]
    assert (f"a perfect predictor would run {100 * headroom[0]:.0f}% and {100 * headroom[1]:.0f}% fewer real steps "
            "than time alone") in docs
    evidence = evidence_from_json(ROOT / "docs" / "ablation_rl_cpu_t28_cap400_fresh.json")
    cells = {arm["arm"]: arm["cells"] for arm in evidence["arms"]}

    def per_step(arm: str, seeds: int) -> float:
        return float(np.mean([c["real_steps"] / c["grpo_steps"] for c in cells[arm][:seeds]]))
    figures = []
    for probe, time_alone in (("gated400_collect", "time400_collect"), ("later400_probe", "later400_time")):
        seeds = len(cells[time_alone])  # on the seeds both ran
        ratio = per_step(probe, seeds) / per_step(time_alone, seeds)
        figures.append((per_step(probe, seeds), per_step(time_alone, seeds),
                        f"{100 * (ratio - 1):.0f}% more" if ratio > 1 else f"{100 * (1 - ratio):.0f}% fewer"))
    (first, later) = figures
    assert (f"{first[0]:.0f} real steps per GRPO step against time alone's {first[1]:.0f} in the first run "
            f"({first[2]}), and {later[0]:.0f} against {later[1]:.0f} in the later run ({later[2]})") in docs
    compared = (("time400_collect", "gated400_collect"), ("later400_time", "later400_probe"),
                ("sparse400", "gated400_collect"))
    settle = [_arms_against(evidence, reference)[arm]["seeds_to_settle"] for reference, arm in compared]
    assert f"would take {settle[0]} seeds a side ({settle[1]} in the later run), against sparse {settle[2]}" in docs


def test_the_later_run_gate_and_the_anchor_ceiling_are_the_committed_replays():
    """README's offline gate as a later run on the task would start it (fit on 720 earlier episodes), and the
    oracle's ceiling by anchor share, from docs/gate_report_task28_cap400_fresh_{later,oracle_g8,oracle_g16}_seed*
    .json."""
    import json

    def load(name: str, seed: int) -> dict:
        return json.loads((ROOT / "docs" / f"gate_report_task28_cap400_fresh_{name}_seed{seed}.json").read_text())

    totals = {}  # (predictor, min steps) -> totals of seeds 0 and 1
    for seed in (0, 1):
        replay = load("later", seed)
        assert replay["run"].endswith(f"sparse400/seed{seed}/replay") and replay["extra"] == 720
        for report in replay["reports"]:
            totals.setdefault((report["gate"]["predictor"], report["gate"]["min_steps"]), []).append(report["total"])
    flat = " ".join((ROOT / "README.md").read_text().split())

    def span(predictor: str, key: str, form) -> str:
        values = [t[key] for (p, _), ts in totals.items() if p == predictor for t in ts]
        return f"{form(min(values))}–{form(max(values))}"

    percent, times = (lambda x: f"{100 * x:.0f}"), (lambda x: f"{x:.2f}")
    assert all(t["failures_cut_share"] == 1.0 for (p, _), ts in totals.items() if p != "oracle" for t in ts)
    assert (f"{span('proprio', 'successes_cut_share', percent)}% of the successes against time alone's "
            f"{span('time', 'successes_cut_share', percent)}%") in flat
    assert (f"for {span('proprio', 'saving', times)}× fewer real steps against time alone's "
            f"{span('time', 'saving', times)}× (the oracle's {span('oracle', 'saving', times)}×)") in flat
    beyond = {m: " and ".join(f"{t['gate_auroc_beyond_time']:.2f}" for t in totals[("proprio", m)]) for m in (24, 32)}
    assert f"ranked {beyond[24]} beyond time cutting from step 24, {beyond[32]} from step 32" in flat
    assert all(t["gate_auroc_beyond_time"] == 0.5 for m in (24, 32) for t in totals[("time", m)])
    ceilings = [" and ".join(f"{load(name, seed)['reports'][0]['total']['saving']:.2f}×" for seed in (0, 1))
                for name in ("oracle_g8", "oracle_g16")]
    oracle = " and ".join(f"{t['saving']:.2f}×" for t in totals[("oracle", 24)])
    assert f"saves at most {oracle}; with one anchor in 8 rollouts" in flat
    assert f"would make them) {ceilings[0]}, in 16, {ceilings[1]}" in flat
    rates = {r["gate"]["wrong_cut_rate"]: r["total"] for r in load("later_rates", 0)["reports"]}
    time_alone = totals[("time", 32)][0]
    assert (f"{100 * rates[0.1]['successes_cut_share']:.0f}% of the successes at a target of 10% and "
            f"{100 * rates[0.05]['successes_cut_share']:.0f}% at 5%, for {rates[0.1]['saving']:.2f}× and "
            f"{rates[0.05]['saving']:.2f}× fewer real steps, against time alone's "
            f"{100 * time_alone['successes_cut_share']:.0f}% for {time_alone['saving']:.2f}×") in flat
    assert all(r["successes_cut_share"] < time_alone["successes_cut_share"] and r["saving"] > time_alone["saving"]
               for r in rates.values())  # "fewer successes cut and more steps saved at once"
    live = [{r["gate"]["predictor"]: r["total"] for r in load("later_rate01", seed)["reports"]} for seed in (0, 1)]
    assert all(load("later_rate01", seed)["run"].endswith(f"sparse400/seed{seed}/replay")
               and load("later_rate01", seed)["extra"] == 720 for seed in (0, 1))
    assert all(r["gate"]["wrong_cut_rate"] == 0.1 and r["gate"]["min_steps"] == 32
               for seed in (0, 1) for r in load("later_rate01", seed)["reports"])

    def both(predictor: str, key: str, form) -> str:
        return " and ".join(form(by[predictor][key]) for by in live)
    assert (f"time alone cut {both('time', 'successes_cut_share', percent).replace(' and ', '% and ')}% of the "
            f"successes for {both('time', 'saving', times).replace(' and ', '× and ')}× fewer real steps, the probe "
            f"{both('proprio', 'successes_cut_share', percent).replace(' and ', '% and ')}% for "
            f"{both('proprio', 'saving', times).replace(' and ', '× and ')}×") in flat
    seed0, seed1 = live
    assert all(seed0["time"]["successes_cut_share"] <= r["successes_cut_share"] <= time_alone["successes_cut_share"]
               and r["saving"] > max(seed0["time"]["saving"], time_alone["saving"]) for r in rates.values())
    time_at_20 = totals[("time", 32)][1]
    assert seed1["proprio"]["successes_cut_share"] > 0.1  # "more successes than its target"
    assert seed1["proprio"]["saving"] > max(seed1["time"]["saving"], time_at_20["saving"])  # "its larger saving"
    conformal = [{r["gate"]["predictor"]: r["total"] for r in load("later_conformal", seed)["reports"]}
                 for seed in (0, 1)]
    assert all(r["gate"]["threshold_rule"] == "conformal" and r["gate"]["wrong_cut_rate"] == 0.1
               for seed in (0, 1) for r in load("later_conformal", seed)["reports"])
    for predictor, lead in (("proprio", "the probe cut "), ("time", "and time alone ")):
        shares = " and ".join(f"{100 * by[predictor]['successes_cut_share']:.0f}%" for by in conformal)
        savings = " and ".join(f"{by[predictor]['saving']:.2f}×" for by in conformal)
        assert f"{lead}{shares} {'of the successes ' if predictor == 'proprio' else ''}for {savings}" in flat
    assert all(by["proprio"]["successes_cut_share"] <= 0.1 for by in conformal)  # "on target on both seeds"
    at_either = {f"{100 * r['successes_cut_share']:.0f}" for r in (seed1["time"], time_at_20)}
    assert len(at_either) == 1 and f"(time alone {at_either.pop()}% at either target)" in flat
