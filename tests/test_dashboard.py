"""mlmlab.dashboard: the workspace/report objects (built offline) and the CLI's failures without a W&B server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("wandb_workspaces")

import wandb_workspaces.reports.v2 as wr  # noqa: E402
import wandb_workspaces.workspaces as ws  # noqa: E402

from mlmlab import dashboard  # noqa: E402
from mlmlab.dashboard import (  # noqa: E402
    CURVES,
    DEFAULT_AXES,
    SCORE,
    STEP,
    TELEMETRY,
    DashboardError,
    build_report,
    build_workspace,
    main,
    parse_args,
)

ROOT = Path(__file__).resolve().parents[1]
AXES = ("mask.rate", "mask.unit", "mask.schedule._target_")


def spec_panels(workspace) -> dict[str, list[dict]]:
    """Section name -> the panels as they would be sent to W&B."""
    sections = workspace._spec["spec"]["section"]["panelBankConfig"]["sections"]
    return {s["name"]: s["panels"] for s in sections}


def all_panels(workspace) -> list[dict]:
    return [p for panels in spec_panels(workspace).values() for p in panels]


def logged_telemetry_keys() -> set[str]:
    """The keys mlmlab.masking.masker.telemetry really returns (the training step logs them as train/<key>)."""
    import torch

    from mlmlab.masking.masker import IGNORE_INDEX, KEPT, MASKED, RANDOM, MaskedBatch, telemetry

    ids = torch.tensor([[1, 5, 6, 7, 8, 2]])
    special = torch.tensor([[1, 0, 0, 0, 0, 1]])
    kind = torch.tensor([[0, MASKED, RANDOM, KEPT, 0, 0]], dtype=torch.int8)
    labels = torch.where(kind > 0, ids, torch.full_like(ids, IGNORE_INDEX))
    out = MaskedBatch(input_ids=ids, labels=labels, kind=kind, n_units=torch.tensor([3]))
    return {f"train/{k}" for k in telemetry(ids, special, out)}


def test_workspace_has_a_panel_per_axis_and_the_parallel_coordinates():
    w = build_workspace("ent", "proj", "sweep_a", axes=AXES)
    assert isinstance(w, ws.Workspace)
    assert (w.entity, w.project, w.name) == ("ent", "proj", "mlmlab: sweep_a")
    panels = all_panels(w)

    bars = [p["config"] for p in panels if p["viewType"] == "Bar Chart"]
    assert [b["groupBy"] for b in bars] == ["mask.value.rate", "mask.value.unit", "mask.value.schedule._target_"]
    for b in bars:  # mean over the seeds that share the axis value, with their spread
        assert b["metrics"] == [SCORE] and b["groupAgg"] == "mean" and b["groupArea"] == "minmax" and b["aggregate"]
    scatters = [p["config"] for p in panels if p["viewType"] == "Scatter Plot"]
    assert [s["xAxis"] for s in scatters] == [f"config:{a.replace('mask.', 'mask.value.', 1)}" for a in AXES]
    assert {s["yAxis"] for s in scatters} == {f"summary:{SCORE}"}

    (pc,) = [p["config"] for p in panels if p["viewType"] == "Parallel Coordinates Plot"]
    assert [c["accessor"] for c in pc["columns"]] == [
        "config:mask.value.rate", "config:mask.value.unit", "config:mask.value.schedule._target_", f"summary:{SCORE}"]
    assert [c["displayName"] for c in pc["columns"]] == ["mask.rate", "mask.unit", "mask.schedule", SCORE]


def test_workspace_curves_and_telemetry():
    w = build_workspace("ent", "proj", "sweep_a", axes=AXES)
    curves = {p["config"]["metrics"][0]: p["config"] for p in all_panels(w)
              if p["viewType"] == "Run History Line Plot" and not p["config"].get("useMetricRegex")}
    expected = {"train/mask_rate", "val/mlm_loss_r15", "train/selected_frac", "train/mask_frac", "train/random_frac",
                "train/keep_frac", "train/random_equals_original", "train/special_selected"}
    assert expected <= set(curves)
    assert {c["xAxis"] for c in curves.values()} == {STEP}
    assert all(len(c["metrics"]) == 1 for c in curves.values())
    sections = spec_panels(w)
    assert {p["config"]["metrics"][0] for p in sections["Realized corruption"]} == set(TELEMETRY)
    assert {p["config"]["metrics"][0] for p in sections["Training"]} == {"train/mask_rate", "val/mlm_loss_r15"}
    # the evaluation curves match the keys mlmlab.lit.curves logs (curve/blimp/acc, curve/probe/sst2/acc)
    import re

    regexes = [p["config"]["metricRegex"] for p in sections["Evaluation curves"]]
    assert [bool(re.search(r, "curve/blimp/acc")) for r in regexes] == [True, False]
    assert [bool(re.search(r, "curve/probe/sst2/acc")) for r in regexes] == [False, True]


def test_telemetry_panels_use_the_logged_keys():
    assert set(TELEMETRY) <= logged_telemetry_keys()
    source = (ROOT / "mlmlab" / "lit" / "mlm.py").read_text()
    assert 'self.log("train/mask_rate"' in source and 'f"val/mlm_loss_{self.eval_suffix}"' in source
    assert 'f"train/{k}": v for k, v in telemetry(' in source


def test_workspace_filters_the_sweeps_pretraining_runs():
    w = build_workspace("ent", "proj", "sweep_b", axes=AXES)
    filters = w._spec["spec"]["section"]["runSets"][0]["filters"]
    leaves = {(f["key"]["section"], f["key"]["name"], f["op"], f["value"]) for f in filters["filters"]}
    assert leaves == {("run", "group", "=", "sweep_b"), ("run", "jobType", "=", "pretrain")}
    assert filters["filters"][1].get("connector", "AND") == "AND"
    assert "config:mask.value.rate" in w.runset_settings.pinned_columns
    assert f"summary:{SCORE}" in w.runset_settings.pinned_columns


@pytest.mark.parametrize("overrides", [(), ("mask=spanbert", "mask/schedule=linear", "mask/sampler=unigram"),
                                       ("objective=electra",)])
def test_default_axes_are_logged_config_keys(cfg_factory, overrides):
    """Every default axis is a path in the config the runs log (``wandb.init(config=to_container(cfg))``)."""
    from mlmlab.config import to_container

    config = to_container(cfg_factory(*overrides))
    for axis in DEFAULT_AXES:
        node = config
        for part in axis.split("."):
            assert isinstance(node, dict) and part in node, f"{axis} is not in the logged config ({overrides})"
            node = node[part]
        assert node is None or isinstance(node, (str, int, float, bool)), axis
    w = build_workspace("ent", "proj", "g")
    assert len([p for p in all_panels(w) if p["viewType"] == "Bar Chart"]) == len(DEFAULT_AXES)


def test_report_has_the_same_panels_and_run_set():
    r = build_report("ent", "proj", "sweep_c", axes=AXES, name="my report")
    assert isinstance(r, wr.Report) and r.title == "my report"
    grids = [b for b in r.blocks if isinstance(b, wr.PanelGrid)]
    assert len(grids) == 5
    for g in grids:
        (rs,) = g.runsets
        assert (rs.entity, rs.project) == ("ent", "proj")
        assert rs.filters == "Metric(\"Group\") == 'sweep_c' and Metric(\"JobType\") == 'pretrain'"
    panels = [p for g in grids for p in g.panels]
    assert sum(isinstance(p, wr.BarPlot) for p in panels) == len(AXES)
    assert sum(isinstance(p, wr.ParallelCoordinatesPlot) for p in panels) == 1
    assert {p.y[0] for p in panels if isinstance(p, wr.LinePlot) and p.y} == {"train/mask_rate", "val/mlm_loss_r15",
                                                                              *TELEMETRY}
    assert {p.metric_regex for p in panels if isinstance(p, wr.LinePlot) and not p.y} == {r for _, r in CURVES}


def test_parse_args():
    o = parse_args(["entity=e", "project=p", "group=g", "axes=[mask.rate, mask.unit]", "report=true", "name=n"])
    assert (o.entity, o.project, o.group, o.axes, o.report, o.name) == ("e", "p", "g", ("mask.rate", "mask.unit"),
                                                                        True, "n")
    o = parse_args(["group=g"])
    assert (o.entity, o.project, o.axes, o.report) == (None, "mlmlab", DEFAULT_AXES, False)


@pytest.mark.parametrize("argv, named", [
    (["entity=e", "group=g", "projct=p"], "'projct'"),
    (["entity=e", "project=p"], "group=<sweep> is required"),
    (["group=g", "mask.rate"], "'mask.rate' is not key=value"),
    (["group=g", "report=maybe"], "report='maybe'"),
    (["group=g", "axes=[]"], "axes=[]: the list is empty"),
    (["group=it's"], "group=\"it's\""),
])
def test_bad_arguments_name_the_key(argv, named, capsys):
    with pytest.raises(DashboardError) as e:
        parse_args(argv)
    assert named in str(e.value) and e.value.code == 2
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("mlmlab.dashboard: ") and named in err and "Traceback" not in err


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "WANDB_SILENT": "true", **env}
    return subprocess.run([sys.executable, "-m", "mlmlab.dashboard", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=60)


def test_cli_offline_fails_fast_with_a_clear_message():
    t0 = time.monotonic()
    p = run_cli("entity=x", "project=y", "group=z", WANDB_MODE="offline")
    elapsed = time.monotonic() - t0
    assert p.returncode == 1, p
    assert "needs a W&B server: WANDB_MODE=offline" in p.stderr and "mlmlab.analysis" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert elapsed < 20, elapsed


def test_cli_unknown_key_exits_2():
    p = run_cli("entity=x", "group=z", "colour=red", WANDB_MODE="offline")
    assert p.returncode == 2 and "unknown key 'colour'" in p.stderr and "Traceback" not in p.stderr


def test_cli_unreachable_server_fails_fast(tmp_path):
    t0 = time.monotonic()
    p = run_cli("entity=x", "group=z", WANDB_MODE="online", WANDB_BASE_URL="http://127.0.0.1:9",
                WANDB_API_KEY="a" * 40, HOME=str(tmp_path), WANDB_CONFIG_DIR=str(tmp_path))
    assert p.returncode == 1, p
    assert "needs a W&B server: cannot reach http://127.0.0.1:9" in p.stderr and "Traceback" not in p.stderr
    assert time.monotonic() - t0 < 20 + dashboard.CONNECT_TIMEOUT_S


class FakeApi:
    default_entity = "me"

    def __init__(self, timeout=None):
        self.timeout = timeout


def test_main_saves_workspace_and_report(monkeypatch, capsys):
    saved = []
    monkeypatch.setattr(dashboard, "check_server", lambda: "https://wandb.example")
    monkeypatch.setattr("wandb.Api", FakeApi)
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    monkeypatch.setattr(ws.Workspace, "save", lambda self: saved.append(self) or self)
    monkeypatch.setattr(ws.Workspace, "url", property(lambda self: "https://wandb.example/me/p?nw=x"))
    monkeypatch.setattr(wr.Report, "save", lambda self: saved.append(self) or self)
    monkeypatch.setattr(wr.Report, "url", property(lambda self: "https://wandb.example/me/p/reports/r"))
    assert main(["project=p", "group=g", "axes=[mask.rate]", "report=true"]) == 0
    w, r = saved
    assert isinstance(w, ws.Workspace) and isinstance(r, wr.Report)
    assert (w.entity, w.project, w.name, r.entity, r.title) == ("me", "p", "mlmlab: g", "me", "mlmlab: g")
    assert "https://wandb.example/me/p?nw=x" in capsys.readouterr().out

    def refuse(self):
        raise RuntimeError("permission denied\n<html>...</html>")

    monkeypatch.setattr(ws.Workspace, "save", refuse)
    assert main(["entity=e", "group=g"]) == 1
    err = capsys.readouterr().err
    assert "saving the workspace to https://wandb.example (e/mlmlab) failed: RuntimeError: permission denied" in err
    assert len(err.strip().splitlines()) == 1
