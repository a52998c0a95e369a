"""mlmlab.provenance: a findings question's declaration dated from git against its records' times, in a tiny git repo
made here (commits at set times: GIT_AUTHOR_DATE / GIT_COMMITTER_DATE)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mlmlab import provenance
from mlmlab.provenance import AFTER, BEFORE, SCREENED, cell, for_row, load

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

TABLES = """\
findings:
  kind: findings
  rows:
    - {question: "1. q", sweep: q, table: q}
q:
  kind: compare
  source: q
  by: mask.rate
  baseline: 0.15
"""


def _sweep(primary: str, family: str = "b/acc", rates: str = "0.15,0.4", extra: str = "") -> str:
    return f"""\
# @package _global_
{extra}analysis:
  primary: {primary}
  family: [{family}]
  delta: 0.01
hydra:
  sweeper:
    params:
      mask.rate: {rates}
      seed: 0,1
"""


def _git(repo: Path, *args: str, when: str | None = None) -> None:
    env = dict(os.environ)
    if when:
        env.update(GIT_AUTHOR_DATE=when, GIT_COMMITTER_DATE=when)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false",
                    *args], cwd=repo, check=True, env=env, capture_output=True)


def _commit(repo: Path, when: str, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"at {when}", when=when)


def _record(rate: float, seed: int, start: str, end: str, sweep: str = "q") -> str:
    return json.dumps({"status": "ok", "overrides": [f"+sweep={sweep}", f"mask.rate={rate}", f"seed={seed}"],
                       "argv": ["train.py", f"+sweep={sweep}"], "config": {"seed": seed, "mask": {"rate": rate}},
                       "started_at": start, "finished_at": end})


def _records(rates=(0.15, 0.4), day: str = "2026-01-02", folder: str = "q", sweep: str = "q") -> dict[str, str]:
    return {f"docs/results/{folder}/r{r}_s{s}/results.json": _record(r, s, f"{day}T10:0{s}:00+0000",
                                                                      f"{day}T11:0{s}:00+0000", sweep)
            for r in rates for s in (0, 1)}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    return r


def _run(root: Path, *args: str) -> int:
    return provenance.main([f"root={root}", *args])


def test_declared_before_the_first_job(repo: Path, capsys):
    tables = TABLES + """\
  question: {primary: a/acc, family: [b/acc], delta: 0.01}
q250:
  kind: compare
  source: q
  by: mask.rate
  baseline: 0.15
  question: {primary: a@250/acc, delta: 0.01}
findings_250:
  kind: findings
  rows:
    - {question: "1. q, 250 labels", sweep: q, table: q250}
"""
    _commit(repo, "2026-01-01T09:00:00+00:00", {"sweeps/sweep/q.yaml": _sweep("a/acc"),
                                                 "docs/results/tables.yaml": tables})
    _commit(repo, "2026-01-03T09:00:00+00:00", _records())
    assert _run(repo) == 0
    provs = load(repo)
    p = provs["q"]
    assert p.status == BEFORE and cell(p) == "before the first job"
    assert p.declared_at["time"] == "2026-01-01T09:00:00+00:00" and p.declared_in == "sweeps/sweep/q.yaml"
    assert p.first_job_at == "2026-01-02T10:00:00+00:00" and p.last_job_at == "2026-01-02T11:01:00+00:00"
    assert p.records["n"] == 4 and p.records["scope"] == "records naming +sweep=q"
    assert p.changes == [] and p.declared_not_run == []
    # the 250-label row asks what the sweep file does not: dated by tables.yaml's history, and said so
    p250 = for_row(provs, {"sweep": "q", "table": "q250"})
    assert p250.primary == "a@250/acc" and p250.declared_in.startswith("docs/results/tables.yaml")
    assert for_row(provs, {"sweep": "q", "table": "q"}) is p
    capsys.readouterr()
    assert _run(repo, "check=true") == 0  # just written: the JSON is what git + records say


def test_primary_changed_after_the_first_job(repo: Path, capsys):
    _commit(repo, "2026-01-01T09:00:00+00:00", {"sweeps/sweep/q.yaml": _sweep("a/acc"),
                                                 "docs/results/tables.yaml": TABLES})
    _commit(repo, "2026-01-02T12:00:00+00:00", _records())
    assert _run(repo) == 0
    assert load(repo)["q"].status == BEFORE
    _commit(repo, "2026-01-02T16:30:00+00:00", {"sweeps/sweep/q.yaml": _sweep("c/acc")})
    capsys.readouterr()
    assert _run(repo, "check=true") == 1  # the committed JSON no longer says what git says
    assert "differs from git + records: q" in capsys.readouterr().out
    assert _run(repo) == 0
    p = load(repo)["q"]
    assert p.status == AFTER and p.primary == "c/acc"
    assert p.declared_at["time"] == "2026-01-02T16:30:00+00:00"
    [c] = p.changes
    assert (c["old"]["primary"], c["new"]["primary"], c["time"], c["after"]) == \
        ("a/acc", "c/acc", "2026-01-02T16:30:00+00:00", "the first job")
    assert cell(p) == "after the data (primary 2026-01-02 16:30, first job 10:00)"


def test_changed_after_a_screen_inherited_from_the_parent_sweep(repo: Path):
    child = "# @package _global_\ndefaults:\n  - /sweep/q\n  - _self_\nhydra:\n  sweeper:\n    params:\n" \
            "      seed: 0,1\n      mask.rate: 0.4\n"
    tables = TABLES.replace("sweep: q, table: q}", "sweep: qc, table: q}")
    screen = {"docs/results/screen/s0/results.json": _record(0.15, 0, "2026-01-01T10:00:00+0000",
                                                             "2026-01-01T10:30:00+0000", sweep="none")}
    _commit(repo, "2026-01-01T09:00:00+00:00", {"sweeps/sweep/q.yaml": _sweep("a/acc"),
                                                 "sweeps/sweep/qc.yaml": child, "docs/results/tables.yaml": tables,
                                                 **screen, "docs/results/provenance_screens.yaml":
                                                     "qc: [docs/results/screen]\n"})
    _commit(repo, "2026-01-01T11:00:00+00:00", {"sweeps/sweep/q.yaml": _sweep("c/acc")})  # after the screen
    _commit(repo, "2026-01-03T09:00:00+00:00", _records(rates=(0.4,), sweep="qc"))
    assert _run(repo) == 0
    p = load(repo)["qc"]
    assert p.primary == "c/acc" and "inherited from sweeps/sweep/q.yaml" in p.declared_in
    assert p.status == SCREENED and [c["after"] for c in p.changes] == ["a screen"]
    assert p.screens == [{"path": "docs/results/screen", "first": "2026-01-01T10:00:00+00:00",
                          "last": "2026-01-01T10:30:00+00:00"}]
    assert cell(p) == "changed after a screen (primary 2026-01-01 11:00, screen 10:00)"


def test_a_declared_arm_without_records_is_listed(repo: Path):
    _commit(repo, "2026-01-01T09:00:00+00:00", {"sweeps/sweep/q.yaml": _sweep("a/acc", rates="0.15,0.4,0.6"),
                                                 "docs/results/tables.yaml": TABLES})
    _commit(repo, "2026-01-03T09:00:00+00:00", _records(rates=(0.15, 0.4)))
    assert _run(repo) == 0
    p = load(repo)["q"]
    assert p.status == BEFORE and p.declared_not_run == ["rate 0.6"]
    assert cell(p) == "before the first job; declared, not run: rate 0.6"


def test_check_without_git_history_passes_with_a_message(repo: Path, tmp_path: Path, capsys):
    _commit(repo, "2026-01-01T09:00:00+00:00", {"sweeps/sweep/q.yaml": _sweep("a/acc"),
                                                 "docs/results/tables.yaml": TABLES})
    _commit(repo, "2026-01-03T09:00:00+00:00", _records())
    assert _run(repo) == 0
    _commit(repo, "2026-01-04T09:00:00+00:00", {})  # the JSON, committed
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True,
                   capture_output=True)
    bare = tmp_path / "nogit"
    shutil.copytree(repo, bare, ignore=shutil.ignore_patterns(".git"))
    for root, why in ((shallow, "shallow"), (bare, "no git history")):
        json_path = root / "docs/results/provenance.json"
        json_path.write_text(json_path.read_text().replace("before the first job", "tampered"))
        capsys.readouterr()
        assert _run(root, "check=true") == 0
        out = capsys.readouterr().out
        assert "provenance not checked" in out and why in out
        assert _run(root) == 1  # rewriting needs the history


def test_the_repo_provenance_matches_its_history():
    """docs/results/provenance.json is what the sweep files' git history and the records say (where the checkout has
    its history; a shallow clone is reported and passes), so the README's "declared" column cannot drift."""
    root = Path(__file__).resolve().parents[1]
    try:
        changed = provenance.update(root, check=True)
    except provenance.GitUnavailable as e:
        pytest.skip(f"no git history here: {e}")
    assert changed == []
