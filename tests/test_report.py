"""The generated tables (mlmlab.report): the repo's README/docs match their data, and a hand edit or a stale block fails."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from scipy import stats

from mlmlab import report

ROOT = Path(__file__).resolve().parents[1]


def test_repo_tables_match_their_data():
    """Every generated block of README.md and docs/*.md is what its results.json / benchmark JSON files say."""
    assert report.update(ROOT, check=True) == []


def _record(seeds_pre: list[float], seeds_ri: list[float]) -> dict:
    m = {"val/mlm_loss_r15": 4.25}
    for i, (a, b) in enumerate(zip(seeds_pre, seeds_ri)):
        m[f"downstream/t/seed_{i}/acc"] = a
        m[f"random_init/t/seed_{i}/acc"] = b
    return {"status": "ok", "config": {"seed": 3}, "metrics": m, "budget": {"steps": 1200, "tokens": 4_915_200}}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "results").mkdir(parents=True)
    pre, ri = [0.80, 0.82, 0.79, 0.81], [0.75, 0.78, 0.76, 0.74]
    (tmp_path / "docs" / "results" / "a.json").write_text(json.dumps(_record(pre, ri)))
    (tmp_path / "docs" / "results" / "tables.yaml").write_text(
        "t1:\n  kind: runs\n  rows:\n    - {label: one, run: a.json}\n  columns:\n"
        "    - {head: run, kind: label}\n    - {head: seed, key: config.seed}\n"
        "    - {head: steps, kind: steps_tokens}\n    - {head: loss, key: 'metric:val/mlm_loss_r15', fmt: .2f}\n"
        "    - {head: pre, kind: ci, task: t}\n    - {head: gain, kind: gain, task: t}\n"
        "    - {head: p, kind: p, task: t}\n")
    (tmp_path / "README.md").write_text("# x\n\n<!-- table: t1 -->\nold\n<!-- /table -->\n\ntext after\n")
    return tmp_path


def test_runs_table_computes_the_paired_gain(repo: Path):
    assert report.update(repo, check=True) == ["README.md: t1"]  # "old" is not what the data says
    assert report.update(repo) == ["README.md: t1"]
    text = (repo / "README.md").read_text()
    pre, ri = [0.80, 0.82, 0.79, 0.81], [0.75, 0.78, 0.76, 0.74]
    d = [a - b for a, b in zip(pre, ri)]
    p = stats.ttest_rel(pre, ri).pvalue
    mean = sum(d) / 4
    ci = stats.t.ppf(0.975, 3) * stats.tstd(d) / 2
    row = next(line for line in text.splitlines() if line.startswith("| one"))
    assert row == f"| one | 3 | 1,200 (4.9M) | 4.25 | 0.805 ± {stats.t.ppf(0.975, 3) * stats.tstd(pre) / 2:.3f} | " \
                  f"**+{100 * mean:.1f} ± {100 * ci:.1f}** | {p:.2g} |"
    assert text.endswith("<!-- /table -->\n\ntext after\n")  # the text around the block is kept
    assert report.update(repo, check=True) == []  # idempotent


def test_a_hand_edited_number_fails_the_check(repo: Path):
    report.update(repo)
    path = repo / "README.md"
    path.write_text(path.read_text().replace("4.25", "4.20"))
    assert report.main(["check=true", f"root={repo}"]) == 1
    assert "4.20" in path.read_text()  # check mode writes nothing


def test_a_deleted_end_marker_is_named_with_its_block_and_line(repo: Path):
    """Issue 54 item 15: not blamed on tables.yaml or on another block."""
    path = repo / "README.md"
    text = path.read_text()
    path.write_text(text.replace("<!-- /table -->", "", 1))
    line = text[: text.index("<!-- table: ")].count("\n") + 1
    with pytest.raises(report.ReportError, match=rf"README.md:{line}: block 't1' has no end marker <!-- /table -->"):
        report.update(repo, check=True)


def test_bad_specs_are_named(repo: Path, capsys):
    path = repo / "README.md"
    path.write_text(path.read_text() + "<!-- table: nope -->\nx\n<!-- /table -->\n")
    with pytest.raises(report.ReportError, match="'nope' has no entry"):
        report.update(repo)
    path.write_text("no blocks\n")
    with pytest.raises(report.ReportError, match="no file has a block for t1"):
        report.update(repo)
    (repo / "docs" / "results" / "tables.yaml").write_text("t1: {kind: pie}\n")
    assert report.main([f"root={repo}"]) == 2
    assert "kind='pie'" in capsys.readouterr().err
    assert report.main(["chek=true"]) == 2  # an unknown key: the usage error of every entry point


def test_compare_table_and_detectable_difference(repo: Path):
    """A sweep folder of results.json files, compared arm against arm and paired on the pretraining seed."""
    sweep = repo / "docs" / "results" / "sweep"
    for i, (rate, seed, score) in enumerate([(0.15, 0, 0.70), (0.15, 1, 0.72), (0.15, 2, 0.71),
                                            (0.4, 0, 0.73), (0.4, 1, 0.74), (0.4, 2, 0.745)]):
        (sweep / str(i)).mkdir(parents=True)
        (sweep / str(i) / "results.json").write_text(json.dumps(
            {"status": "ok", "config": {"seed": seed, "mask": {"rate": rate}}, "metrics": {"downstream/score": score}}))
    (repo / "docs" / "results" / "tables.yaml").write_text(
        "t1:\n  kind: compare\n  source: sweep\n  by: mask.rate\n  baseline: 0.15\n"
        "  metrics:\n    - {key: downstream/score, label: score, scale: 100, fmt: .1f}\n")
    report.update(repo)
    row = next(line for line in (repo / "README.md").read_text().splitlines() if line.startswith("| score"))
    d = [0.03, 0.02, 0.035]
    lo, hi = stats.t.interval(0.95, 2, sum(d) / 3, stats.sem(d))
    from mlmlab.stats import mdd_range, sd_interval

    sd = stats.tstd(d)
    r = mdd_range(sd, 3)
    assert sd_interval(sd, 3)[0] < sd < sd_interval(sd, 3)[1]
    assert row.split(" | ")[1:] == ["0.15 → 0.4", "71.0", "73.8", f"+{100 * sum(d) / 3:.1f} [+{100 * lo:.1f}, "
                                    f"+{100 * hi:.1f}]",
                                    f"{stats.ttest_rel([0.73, 0.74, 0.745], [0.70, 0.72, 0.71]).pvalue:.2g}", "-", "3",
                                    f"{100 * r.value:.1f} [{100 * r.low:.1f}, {100 * r.high:.1f}]", "exploratory |"]
    # a declared question: the family's p-values Holm-adjusted (here two metrics), a verdict by the rules
    (repo / "docs" / "results" / "tables.yaml").write_text(
        "t1:\n  kind: compare\n  source: sweep\n  by: mask.rate\n  baseline: 0.15\n"
        "  question: {primary: downstream/score, family: [downstream/other]}\n"
        "  metrics:\n    - {key: downstream/score, label: score, scale: 100, fmt: .1f}\n"
        "    - {key: downstream/other, label: other}\n")
    for i in range(6):
        rec = json.loads((sweep / str(i) / "results.json").read_text())
        rec["metrics"]["downstream/other"] = 0.5 + 0.01 * i * (i % 2)
        (sweep / str(i) / "results.json").write_text(json.dumps(rec))
    report.update(repo)
    rows = {line.split(" | ")[0]: line.split(" | ") for line in (repo / "README.md").read_text().splitlines()
            if line.startswith(("| score", "| other"))}
    p = stats.ttest_rel([0.73, 0.74, 0.745], [0.70, 0.72, 0.71]).pvalue
    p_other = float(rows["| other"][5])
    assert rows["| score"][6] == f"{min(1, p * (2 if p < p_other else 1)):.2g}"  # Holm: the smaller p x 2
    assert rows["| score"][-1] in ("0.4 better |", "inconclusive at 3 seeds |")
    # "a - b": each run's a less its b, then paired between arms (the domain contrast); a missing part is named
    (repo / "docs" / "results" / "tables.yaml").write_text(
        "t1:\n  kind: compare\n  source: sweep\n  by: mask.rate\n  baseline: 0.15\n"
        "  metrics:\n    - {key: downstream/score - downstream/score, label: zero, fmt: .3f}\n")
    report.update(repo)
    row = next(line for line in (repo / "README.md").read_text().splitlines() if line.startswith("| zero"))
    assert row.split(" | ")[2:5] == ["0.000", "0.000", "+0.000 [+0.000, +0.000]"]
    (repo / "docs" / "results" / "tables.yaml").write_text(
        "t1:\n  kind: compare\n  source: sweep\n  by: mask.rate\n  baseline: 0.15\n"
        "  metrics:\n    - {key: downstream/score - val/loss, label: x}\n")
    with pytest.raises(report.ReportError, match=r"no metric 'downstream/score - val/loss' in its runs \(.*no column \['val/loss'\]"):
        report.update(repo)


def test_bench_tables_come_from_benchmarks_results(repo: Path):
    shutil.copytree(ROOT / "benchmarks", repo / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "docs" / "results" / "tables.yaml").write_text("t1: {kind: bench, bench: e2e}\n")
    report.update(repo)
    e2e = json.loads((ROOT / "benchmarks" / "results" / "bench_e2e.json").read_text())["results"]
    assert f"| {e2e['wall_s']:.0f} |" in (repo / "README.md").read_text()
    (repo / "benchmarks" / "results" / "bench_e2e.json").unlink()
    with pytest.raises(report.ReportError, match="bench_e2e.json does not exist"):
        report.update(repo)


def test_items_table_pairs_predictions_item_by_item(repo: Path):
    import numpy as np

    from mlmlab.analysis import compare_items

    rng = np.random.default_rng(0)
    truth = [int(x) for x in rng.integers(0, 2, 200)]
    preds = {}
    for name, acc in (("a0", 0.85), ("b0", 0.75), ("a1", 0.8), ("b1", 0.8)):
        seeds = {str(s): [t if rng.random() < acc else 1 - t for t in truth] for s in range(2)}
        preds[name] = {"t": {"truth": truth, "seeds": seeds}}
        d = repo / "docs" / "results" / name / "predictions"
        d.mkdir(parents=True)
        if name.startswith("a"):
            (d / "pretrained.json").write_text(json.dumps(preds[name]))
        else:  # archived compressed, as docs/results keeps them
            (d / "pretrained.json.gz").write_bytes(gzip.compress(json.dumps(preds[name]).encode()))
    (repo / "docs" / "results" / "tables.yaml").write_text(
        "t1:\n  kind: items\n  pooled: true\n  pairs:\n    - {label: s0, a: a0, b: b0}\n    - {label: s1, a: a1, b: b1}\n")
    report.update(repo)
    rows = [line.split(" | ") for line in (repo / "README.md").read_text().splitlines() if line.startswith("| s")
            or line.startswith("| pooled")]
    assert [r[0] for r in rows] == ["| s0", "| s1", "| pooled"]
    want = compare_items(preds["a0"], preds["b0"]).iloc[0]
    assert rows[0][3:6] == ["200 x 2", f"{want['a']:.3f}", f"{want['b']:.3f}"]
    assert rows[0][6] == f"{100 * want['diff']:+.1f} [{100 * want['ci_low']:+.1f}, {100 * want['ci_high']:+.1f}]"
    assert rows[2][3] == "200 x 4" and rows[2][7] .endswith("of 4 < 0.05")  # both pairs' seeds, item by item


def test_compare_table_across_two_sweeps_with_exclusions(repo: Path):
    """Two sweep folders compared on one axis (ELECTRA's sweep against the MLM sweep's 40% arm): the other MLM arm is
    excluded, so it does not enter the MLM mean."""
    res = repo / "docs" / "results"
    rows = [("mlm_sweep", "mlm", 0.15, 0.60), ("mlm_sweep", "mlm", 0.4, 0.70), ("el_sweep", "electra", 0.15, 0.75)]
    for seed in range(3):
        for folder, obj, rate, score in rows:
            d = res / folder / f"{obj}_{rate}_{seed}"
            d.mkdir(parents=True)
            (d / "results.json").write_text(json.dumps({"status": "ok", "config": {
                "seed": seed, "mask": {"rate": rate}, "objective": {"name": obj}},
                "metrics": {"downstream/score": score + 0.01 * seed * (obj == "electra")}}))
    (res / "tables.yaml").write_text(
        "t1:\n  kind: compare\n  source: [mlm_sweep, el_sweep]\n  by: objective.name\n  baseline: mlm\n"
        "  exclude: [{objective.name: mlm, mask.rate: 0.15}]\n  metrics:\n    - {key: downstream/score, fmt: .2f}\n")
    report.update(repo)
    row = next(line for line in (repo / "README.md").read_text().splitlines() if line.startswith("| downstream"))
    assert row.split(" | ")[1:5] == ["mlm → electra", "0.70", "0.76", "+0.06 [+0.04, +0.08]"]
    spec = (res / "tables.yaml").read_text()  # names: what the table prints for an arm's value
    (res / "tables.yaml").write_text(spec + "  names: {mlm: MLM 40%, electra: ELECTRA}\n")
    report.update(repo)
    row = next(line for line in (repo / "README.md").read_text().splitlines() if line.startswith("| downstream"))
    assert row.split(" | ")[1:3] == ["MLM 40% → ELECTRA", "0.70"]


def test_items_table_pools_each_group_of_pairs_with_probe_and_zeroshot(repo: Path):
    """``pooled: only`` with a ``group`` per pair: one pooled row per group, task and protocol -- the fine-tuning seeds of
    every pair, and every pretraining run's probe and zero-shot outcomes -- and no per-pair rows."""
    import numpy as np

    from mlmlab.analysis import compare_items

    rng = np.random.default_rng(1)
    truth = [int(x) for x in rng.integers(0, 2, 100)]
    flip = lambda acc: [t if rng.random() < acc else 1 - t for t in truth]  # noqa: E731
    preds = {}
    for name, acc in (("x0", 0.9), ("x1", 0.85), ("y0", 0.6), ("y1", 0.65), ("b0", 0.7), ("b1", 0.7)):
        preds[name] = {"t": {"truth": truth, "seeds": {"0": flip(acc)}, "probe": flip(acc)},
                       "z": {"items": "".join(rng.choice(["0", "1", "-"], 50, p=[1 - acc - 0.02, acc, 0.02]))}}
        d = repo / "docs" / "results" / name / "predictions"
        d.mkdir(parents=True)
        (d / "pretrained.json").write_text(json.dumps(preds[name]))
    (repo / "docs" / "results" / "tables.yaml").write_text(
        "t1:\n  kind: items\n  pooled: only\n  pairs:\n"
        "    - {label: s0, group: x, a: x0, b: b0}\n    - {label: s1, group: x, a: x1, b: b1}\n"
        "    - {label: s0, group: y, a: y0, b: b0}\n    - {label: s1, group: y, a: y1, b: b1}\n")
    report.update(repo)
    rows = [line.split(" | ") for line in (repo / "README.md").read_text().splitlines() if line.startswith("| x")
            or line.startswith("| y") or line.startswith("| s")]
    assert [(r[0], r[1], r[2]) for r in rows] == [(f"| {g}, pooled", t, p) for g in "xy" for t, p in
                                                  (("t", "finetune"), ("t", "probe"), ("z", "zeroshot"))]
    x = {k: {"truth": truth, "probe_runs": [preds["x0"]["t"]["probe"], preds["x1"]["t"]["probe"]]} for k in "t"}
    b = {k: {"truth": truth, "probe_runs": [preds["b0"]["t"]["probe"], preds["b1"]["t"]["probe"]]} for k in "t"}
    want = compare_items(x, b).loc[("t", "probe")]
    assert want["runs_paired"] == 2 and rows[1][3] == "100 x 2"
    assert rows[1][4:7] == [f"{want['a']:.3f}", f"{want['b']:.3f}", f"{100 * want['diff']:+.1f} "
                            f"[{100 * want['ci_low']:+.1f}, {100 * want['ci_high']:+.1f}]"]
    both = [i for i in range(50) if all(preds[n]["z"]["items"][i] != "-" for n in ("x0", "x1", "b0", "b1"))]
    assert rows[2][3] == f"{len(both)} x 2"  # an item tied in any pooled run is dropped from every run
    (repo / "docs" / "results" / "tables.yaml").write_text(
        "t1:\n  kind: items\n  pooled: some\n  pairs:\n    - {label: s0, a: x0, b: b0}\n")
    with pytest.raises(report.ReportError, match="pooled='some'; allowed: true, false, only"):
        report.update(repo)


def _findings_row(repo: Path, spec: str) -> str:
    """Render a compare table ``t1`` and a findings table ``f`` from ``spec``; the findings row of question ``q1``."""
    (repo / "docs" / "results" / "tables.yaml").write_text(spec)
    (repo / "README.md").write_text("<!-- table: t1 -->\n<!-- /table -->\n<!-- table: f -->\n<!-- /table -->\n")
    report.update(repo)
    return next(line for line in (repo / "README.md").read_text().splitlines() if line.startswith("| q1"))


def test_findings_table_states_the_regime_before_comparing(repo: Path):
    """The README's findings: where the baseline arm does not beat random init on the primary metric (its interval
    over seeds), the verdict reads "not in a regime where pretraining pays", whatever the arms' difference."""
    sweep = repo / "docs" / "results" / "sweep"
    for i, (rate, seed, score, gain) in enumerate([(0.15, 0, 0.70, 0.01), (0.15, 1, 0.72, -0.02), (0.15, 2, 0.71, 0.0),
                                                  (0.4, 0, 0.73, 0.03), (0.4, 1, 0.74, 0.0), (0.4, 2, 0.745, 0.04)]):
        (sweep / str(i)).mkdir(parents=True)
        (sweep / str(i) / "results.json").write_text(json.dumps(
            {"status": "ok", "config": {"seed": seed, "mask": {"rate": rate}},
             "metrics": {"downstream/t/acc": score, "gain/t/acc": gain}}))
    spec = ("t1:\n  kind: compare\n  source: sweep\n  by: mask.rate\n  baseline: 0.15\n"
            "  question: {primary: downstream/t/acc, delta: 0.01}\n"
            "  metrics:\n    - {key: downstream/t/acc, label: acc, scale: 100, fmt: .1f}\n"
            "f:\n  kind: findings\n  rows:\n    - {question: q1, sweep: s, table: t1}\n")
    row = _findings_row(repo, spec)
    assert row.endswith("**not in a regime where pretraining pays** |")
    assert "0.15: -0.3 [" in row and "; 0.4: +2.3 [" in row  # each arm's gain over random init, over seeds, points
    for i in range(3):  # now the baseline pays: the comparison decides
        rec = json.loads((sweep / str(i) / "results.json").read_text())
        rec["metrics"]["gain/t/acc"] = 0.05 + 0.01 * i
        (sweep / str(i) / "results.json").write_text(json.dumps(rec))
    report.update(repo)
    row = next(line for line in (repo / "README.md").read_text().splitlines() if line.startswith("| q1"))
    assert "not in a regime" not in row and row.endswith(("**0.4 better** |", "**inconclusive at 3 seeds** |"))
    (repo / "docs" / "results" / "tables.yaml").write_text(spec.replace("kind: findings", "kind: findings\n  compact: true"))
    report.update(repo)  # the README's form: one row per question, the effect with its adjusted p, the verdict once
    rows = [line for line in (repo / "README.md").read_text().splitlines() if line.startswith("| q1")]
    assert len(rows) == 1 and "0.4: +2.8 [" in rows[0] and "adjusted p" in rows[0] and rows[0].count("**") == 2


def _gate_sweep(repo: Path, rows) -> Path:
    """A sweep of 2 arms x 3 seeds whose records carry the primary, its gain over random init, random init's own
    score and per-item predictions (the evaluation labels: 60% one class), as jobs write them."""
    import gzip

    sweep = repo / "docs" / "results" / "sweep"
    for i, (rate, seed, score, ri) in enumerate(rows):
        d = sweep / str(i)
        (d / "predictions").mkdir(parents=True)
        (d / "results.json").write_text(json.dumps(
            {"status": "ok", "config": {"seed": seed, "mask": {"rate": rate}},
             "metrics": {"downstream/t/acc": score, "random_init/t/acc": ri, "gain/t/acc": score - ri},
             "downstream": {"t": {"reported_split": "test", "n": {"test": 10}}}}))
        (d / "predictions" / "pretrained.json.gz").write_bytes(gzip.compress(json.dumps(
            {"t": {"split": "test", "truth": [1] * 6 + [0] * 4, "seeds": {}}}).encode()))
    return sweep


GATE_SPEC = ("t1:\n  kind: compare\n  source: sweep\n  by: mask.rate\n  baseline: 0.15\n"
             "  question: {primary: downstream/t/acc, delta: 0.01}\n"
             "  metrics:\n    - {key: downstream/t/acc, label: acc, scale: 100, fmt: .1f}\n"
             "f:\n  kind: findings\n  compact: true\n  rows:\n    - {question: q1, sweep: s, table: t1}\n")


def test_the_gate_reads_a_degenerate_comparator_an_arm_below_random_init_and_harm(repo: Path):
    """The regime gate: a random-init comparator at the constant predictor (the majority class, 60% here) reads
    "degenerate comparator at this label budget", however far the pretrained arms are above it; an arm whose gains over
    random init lie below 0 "did not learn", not "<baseline> better"; a baseline significantly below random init
    reads "pretraining hurts here", not "not in a regime"."""
    sweep = _gate_sweep(repo, [(0.15, s, 0.75 + 0.01 * s, 0.60) for s in range(3)]
                        + [(0.4, s, 0.70 + 0.01 * s, 0.60) for s in range(3)])
    row = _findings_row(repo, GATE_SPEC)
    assert "**degenerate comparator at this label budget (random_init acc 60.0 vs 60.0 for a constant predictor)**" \
        in row, row
    for i in range(6):  # random init above chance now; the 0.4 arm below it on every seed
        rec = json.loads((sweep / str(i) / "results.json").read_text())
        m = rec["metrics"]
        m["random_init/t/acc"] = 0.70 + 0.002 * i
        m["downstream/t/acc"] = (0.78 if i < 3 else 0.66) + 0.01 * (i % 3)
        m["gain/t/acc"] = m["downstream/t/acc"] - m["random_init/t/acc"]
        (sweep / str(i) / "results.json").write_text(json.dumps(rec))
    report.update(repo)
    row = next(line for line in (repo / "README.md").read_text().splitlines() if line.startswith("| q1"))
    assert "**0.4 did not learn (-3.8 [" in row and "] below random init)**" in row and "0.15 better" not in row, row
    for i in range(3):  # the baseline arm itself below random init on every seed
        rec = json.loads((sweep / str(i) / "results.json").read_text())
        rec["metrics"]["downstream/t/acc"] = 0.65 + 0.01 * i
        rec["metrics"]["gain/t/acc"] = rec["metrics"]["downstream/t/acc"] - rec["metrics"]["random_init/t/acc"]
        (sweep / str(i) / "results.json").write_text(json.dumps(rec))
    report.update(repo)
    row = next(line for line in (repo / "README.md").read_text().splitlines() if line.startswith("| q1"))
    assert "**pretraining hurts here (0.15: -4.2 [" in row and "not in a regime" not in row, row


def test_a_question_over_two_tables_is_adjusted_as_one(repo: Path):
    """Tables that share a ``question_id`` are one question: every hypothesis of both (each baseline's arms) enters
    one Holm adjustment, so the adjusted p of a table alone is smaller than the same row's inside its question."""
    _gate_sweep(repo, [(r, s, 0.75 + 0.01 * s + (0.02 + 0.004 * s) * (r > 0.2) + (0.03 + 0.01 * s) * (r > 0.5), 0.70)
                       for r in (0.15, 0.4, 0.8) for s in range(3)])
    alone = ("t1:\n  kind: compare\n  source: sweep\n  by: mask.rate\n  baseline: 0.15\n"
             "  exclude: [{mask.rate: 0.8}]\n  question: {primary: downstream/t/acc}\n"
             "  metrics:\n    - {key: downstream/t/acc, label: acc, scale: 100, fmt: .1f}\n"
             "t2:\n  kind: compare\n  source: sweep\n  by: mask.rate\n  baseline: 0.15\n"
             "  exclude: [{mask.rate: 0.4}]\n  question: {primary: downstream/t/acc}\n"
             "  metrics:\n    - {key: downstream/t/acc, label: acc, scale: 100, fmt: .1f}\n")
    (repo / "README.md").write_text("<!-- table: t1 -->\n<!-- /table -->\n<!-- table: t2 -->\n<!-- /table -->\n")
    (repo / "docs" / "results" / "tables.yaml").write_text(alone)
    report.update(repo)
    solo = [line for line in (repo / "README.md").read_text().splitlines() if line.startswith("| acc")]
    together = alone.replace("kind: compare\n", "kind: compare\n  question_id: q\n")
    (repo / "docs" / "results" / "tables.yaml").write_text(together)
    report.update(repo)
    joint = [line for line in (repo / "README.md").read_text().splitlines() if line.startswith("| acc")]
    p_solo = [float(r.split(" | ")[6]) for r in solo]
    p_joint = [float(r.split(" | ")[6]) for r in joint]
    p_raw = [float(r.split(" | ")[5]) for r in joint]
    assert p_solo == [float(r.split(" | ")[5]) for r in solo] == p_raw  # each table alone: adjusted p = raw p
    assert sorted(p_joint) == pytest.approx(sorted([2 * min(p_raw), max(2 * min(p_raw), max(p_raw))]), rel=0.05)


def test_findings_row_of_a_sequential_sweep_takes_the_rules_decision_and_wall_time(repo: Path):
    """A sweep run in rounds (``sequential:``): its primary row carries the sequential rule's inference, re-scored from
    the records under the plan its sequential.json ran (the repeated CI at the look it stopped, the stagewise-ordering
    p, the design's power in place of a fixed-n MDD), the verdict with where it stopped, and its cost: the wall time
    from the first job's start to the last job's end, the jobs' minutes summed, and the fixed design's; a sequential.json that the records contradict is an error."""
    sweep = repo / "docs" / "results" / "sweep"
    times = iter(["2026-12-06T10:00:00+0000", "2026-12-06T10:20:00+0000", "2026-12-06T10:00:05+0000",
                  "2026-12-06T10:21:00+0000", "2026-12-06T10:20:00+0000", "2026-12-06T11:04:00+0000",
                  "2026-12-06T10:21:00+0000", "2026-12-06T11:05:00+0000"])
    for i, (rate, seed, score) in enumerate([(0.15, 0, 0.70), (0.4, 0, 0.74), (0.15, 1, 0.72), (0.4, 1, 0.7601)]):
        (sweep / str(i)).mkdir(parents=True)
        (sweep / str(i) / "results.json").write_text(json.dumps(
            {"status": "ok", "config": {"seed": seed, "mask": {"rate": rate}}, "started_at": next(times),
             "finished_at": next(times), "metrics": {"downstream/t/acc": score, "gain/t/acc": 0.05 + 0.001 * seed}}))
    state = {"looks": [2, 4, 6, 8], "plan": {"max_seeds": 8, "round": 2, "first": None, "spending": "pocock"},
             "seeds": list(range(8)), "alpha": 0.05, "alpha_per_arm": 0.05, "delta": 0.01,
             "arms": [{"arm": "mask.rate=0.4", "verdict": "better", "round": 1, "seeds": 2}]}
    (sweep / "sequential.json").write_text(json.dumps(state))
    spec = ("t1:\n  kind: compare\n  source: sweep\n  by: mask.rate\n  baseline: 0.15\n  sequential: sweep\n"
            "  question: {primary: downstream/t/acc, delta: 0.01}\n"
            "  metrics:\n    - {key: downstream/t/acc, label: acc, scale: 100, fmt: .1f}\n"
            "f:\n  kind: findings\n  compact: true\n  rows:\n    - {question: q1, sweep: s, table: t1, sequential: sweep}\n")
    row = _findings_row(repo, spec)
    assert row.endswith("**0.4 better (sequential rule stopped at look 1 of 4, 2 seeds); 4 jobs in 1 h 05 min, "
                        "129 job-minutes (fixed design: 16 jobs, ~516)** |"), row  # 20 + 20.9 + 44 + 44 minutes
    assert "(repeated CI, look 1 of 4), stagewise p " in row, row
    arm = next(line for line in (repo / "README.md").read_text().splitlines() if line.startswith("| acc"))
    assert "(stagewise)" in arm and "design power " in arm and " at ±1, " in arm, arm
    state["arms"][0]["verdict"] = "continue"  # what the sweep recorded is not what its records give
    (sweep / "sequential.json").write_text(json.dumps(state))
    with pytest.raises(report.ReportError, match="continue at 2 seeds, but its records give better at 2"):
        report.update(repo)
    state["arms"] = [{"arm": "mask.rate=0.8", "verdict": "better", "seeds": 2}]
    (sweep / "sequential.json").write_text(json.dumps(state))
    with pytest.raises(report.ReportError, match="has arm 'mask.rate=0.8', which no record has"):
        report.update(repo)


def test_check_fails_on_a_table_typed_by_hand(repo: Path):
    """A Markdown table outside a generated block has no record behind it: check=true names it, unless it is marked as
    holding no measurement."""
    (repo / "docs" / "results" / "tables.yaml").write_text("")
    (repo / "README.md").write_text("# x\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n")
    assert report.update(repo, check=True) == [
        "README.md:3: a table typed by hand (no record; generate it, or mark a table of no measurements with "
        "<!-- not measured --> on the line above)"]
    (repo / "README.md").write_text("# x\n\n<!-- not measured -->\n| a | b |\n| --- | --- |\n| 1 | 2 |\n")
    assert report.update(repo, check=True) == []


def test_stability_table_sets_two_budgets_side_by_side_with_their_phases(repo: Path):
    """kind: stability -- per question and arm, the effect and verdict at the early budget and past the drop, each
    side's phase from its records (recorded, or docs/results/phases.json for records made before the phase), and what
    changed; a runs table's phase column reads the same."""
    res = repo / "docs" / "results"
    for name, scores, phase in (("early", (0.70, 0.71, 0.69, 0.68, 0.70, 0.715), None),
                                ("late", (0.70, 0.75, 0.72, 0.77, 0.71, 0.761), "past the drop")):
        for i, (rate, seed) in enumerate([(0.15, 0), (0.4, 0), (0.15, 1), (0.4, 1), (0.15, 2), (0.4, 2)]):
            d = res / name / str(i)
            d.mkdir(parents=True)
            rec = {"status": "ok", "config": {"seed": seed, "mask": {"rate": rate}},
                   "metrics": {"downstream/t/acc": scores[i], "gain/t/acc": 0.05 + 0.01 * seed}}
            if phase:
                rec["phase"] = {"label": phase}
            (d / "results.json").write_text(json.dumps(rec))
    (res / "phases.json").write_text(json.dumps({f"early/{i}/results.json": {"label": "lexical"} for i in range(5)}))
    compare = "  kind: compare\n  by: mask.rate\n  baseline: 0.15\n  question: {primary: downstream/t/acc}\n" \
              "  metrics:\n    - {key: downstream/t/acc, label: acc, scale: 100, fmt: .1f}\n"
    spec = (f"a:\n  source: early\n{compare}b:\n  source: late\n{compare}"
            "s:\n  kind: stability\n  rows:\n    - question: q1\n      before: {table: a, budget: B0}\n"
            "      after: {table: b, budget: B1}\n"
            "r:\n  kind: runs\n  rows:\n    - {label: x, run: early/0/results.json}\n"
            "    - {label: y, run: early/5/results.json}\n    - {label: z, run: late/0/results.json}\n"
            "  columns:\n    - {head: run, kind: label}\n    - {head: phase, kind: phase}\n")
    (res / "tables.yaml").write_text(spec)
    (repo / "README.md").write_text("".join(f"<!-- table: {t} -->\n<!-- /table -->\n" for t in "absr"))
    report.update(repo)
    text = (repo / "README.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| q1"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["0.4 vs 0.15", "B0", "lexical (5 of 6); not recorded (1 of 6)"], cells
    assert cells[6:8] == ["B1", "past the drop (6 of 6)"], cells
    assert cells[4].startswith("+0.5 [") and "better" not in cells[5], cells  # early: +1, -1, +1.5 points
    assert cells[8].startswith("+5.0 [") and cells[9] == "**0.4 better**", cells  # late: +5, +5, +5.1 points
    assert cells[10] == "same direction, decided only past the drop", cells
    assert "| x | lexical |" in text and "| y | not recorded |" in text and "| z | past the drop |" in text
