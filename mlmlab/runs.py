"""Loading runs: a sweep's records -> pandas, from any of three sources that agree with each other.

``load_runs(source)`` gives one tidy row per job:

* a local folder (a job dir, a sweep dir, or a folder of sweeps): the jobs' ``results.json`` files;
* the same folder's offline W&B runs (``source_kind="wandb"``, or automatically where a job left no results.json);
* the W&B API: ``"wandb:<entity>/<project>"`` (optionally ``/<group>``), with ``filters`` passed to ``wandb.Api().runs``.

Columns: ``run_dir``, ``status``, ``overrides``, the whole resolved config flattened with dots (``mask.rate``,
``mask.replace.mask``, ``seed`` ...), every metric under its logged key (``downstream/score``, ``val/mlm_loss_r15``,
``train/selected_frac`` ...) and ``timings.<phase>``. Truncated or unreadable results are skipped, counted and named
in ``df.attrs["skipped"]``; a source with no runs at all raises ``NoRunsError``. Also: W&B histories
(``load_history``, ``read_wandb_offline``) and a run's per-item predictions (``load_predictions``).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

log = logging.getLogger(__name__)


class NoRunsError(ValueError):
    """The source holds no readable run: a wrong path, a sweep that has not finished a job, or filters too narrow."""


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = tuple(v) if isinstance(v, list) else v  # hashable, so list-valued keys can be grouped by
    return out


def load_runs(source: str | Path | Sequence[str | Path], include_failed: bool = False, source_kind: str = "auto",
              job_type: str = "pretrain", filters: dict | None = None) -> pd.DataFrame:
    """One row per run of ``source`` (see the module docstring). ``source_kind``: ``auto`` (results.json, and the
    offline W&B run of any job dir without one), ``results`` or ``wandb`` (offline runs only). ``job_type`` selects
    the W&B runs (pretraining runs; ``finetune`` for the per-fine-tuning runs of ``downstream.wandb_runs=true``).
    A list of sources gives their runs in one frame (an arm another sweep ran, reused as this one's baseline)."""
    if not isinstance(source, (str, Path)):
        frames = [load_runs(s, include_failed, source_kind, job_type, filters) for s in source]
        df = pd.concat(frames, ignore_index=True)
        df.attrs.update(source=", ".join(f.attrs["source"] for f in frames),
                        skipped=[s for f in frames for s in f.attrs["skipped"]],
                        n_skipped=sum(f.attrs["n_skipped"] for f in frames),
                        n_failed=sum(f.attrs["n_failed"] for f in frames),
                        n_running=sum(f.attrs.get("n_running", 0) for f in frames),
                        running=[d for f in frames for d in f.attrs.get("running", [])])
        return df
    if source_kind not in ("auto", "results", "wandb"):
        raise ValueError(f"source_kind={source_kind!r}; allowed: auto, results, wandb")
    if isinstance(source, str) and source.startswith("wandb:"):
        rows, skipped = _from_api(source[len("wandb:"):], job_type, filters), []
    else:
        root = Path(source).expanduser()
        if not root.exists():
            raise NoRunsError(f"{root} does not exist; give a job or sweep dir, or wandb:<entity>/<project>[/<group>]")
        rows, skipped = _from_dir(root, source_kind, job_type)
    failed = [r for r in rows if r["status"] not in ("ok", "running")]
    running = [r for r in rows if r["status"] == "running"]  # a live job (its W&B run has no exit code yet)
    if not include_failed:
        rows = [r for r in rows if r["status"] == "ok"]
    if skipped:
        log.warning("skipped %d unreadable run(s): %s", len(skipped), "; ".join(f"{p} ({why})" for p, why in skipped))
    if not rows:
        what = (f"{len(failed)} failed run(s) (include_failed=true shows them: "
                f"{'; '.join(str(r.get('error', r['status']))[:120] for r in failed[:3])})" if failed else
                f"no finished runs yet ({len(running)} running)" if running else "no runs")
        detail = f"; {len(skipped)} unreadable: {skipped[0][0]} ({skipped[0][1]})" if skipped else ""
        raise NoRunsError(f"{source}: {what}{detail}")
    df = pd.DataFrame(rows)
    df.attrs.update(source=str(source), skipped=[{"path": str(p), "reason": why} for p, why in skipped],
                    n_skipped=len(skipped), n_failed=len(failed), n_running=len(running),
                    running=[str(r["run_dir"]) for r in running])
    return df


def _from_dir(root: Path, kind: str, job_type: str) -> tuple[list[dict], list[tuple[Path, str]]]:
    rows, skipped = [], []
    results = sorted(p for p in root.rglob("results.json") if "wandb" not in p.parts)
    with_results = {p.parent for p in results}
    if kind in ("auto", "results"):
        for path in results:
            try:
                r = json.loads(path.read_text())
                if not isinstance(r, dict) or "status" not in r or "config" not in r:
                    raise ValueError("not a run record (no status/config)")
            except (OSError, ValueError) as e:  # a truncated file from a killed job: reported, skipped, counted
                skipped.append((path, f"{type(e).__name__}: {e}"))
                continue
            rows.append(_row_from_results(path.parent, r))
    if kind in ("auto", "wandb"):
        latest: dict[str, dict] = {}  # a job run again (skip_completed, a rerun) has several W&B runs: keep the last,
        for run_dir in sorted(root.rglob("offline-run-*")):  # preferring finished ones (names sort by start time)
            job_dir = run_dir.parent.parent  # <job dir>/wandb/offline-run-*
            if kind == "auto" and job_dir in with_results:
                continue
            try:
                info = read_wandb_offline(run_dir)
            except (OSError, ValueError) as e:
                skipped.append((run_dir, f"{type(e).__name__}: {e}"))
                continue
            if info["run"].get("job_type", job_type) != job_type:
                continue
            row = _row_from_wandb(str(job_dir), info["config"], info["summary"], info["exit_code"], info["run"])
            prev = latest.get(row["run_dir"])
            if prev is None or row["status"] == "ok" or prev["status"] != "ok":
                latest[row["run_dir"]] = row
        rows.extend(latest.values())
    if kind == "results" and not results:
        raise NoRunsError(f"{root}: no results.json below it")
    return rows, skipped


def _row_from_results(job_dir: Path, r: dict) -> dict:
    row = {"run_dir": str(job_dir), "status": r.get("status"), "overrides": " ".join(r.get("overrides") or [])}
    # a fine-tuning job of an existing checkpoint (python -m mlmlab.finetune): the pretraining run's config fills the
    # keys its own config lacks (seed, mask.*, objective.*), so its arms and pretraining seeds pair like the sweep's
    pre = (r.get("source_checkpoint") or {}).get("pretrain_config")
    row.update(_flatten(pre) if isinstance(pre, dict) else {})
    row.update(_flatten(r.get("config") or {}))
    row.update({k: float("nan") if v is None else v for k, v in (r.get("metrics") or {}).items()})  # null: missing
    row.update({f"timings.{k}": v for k, v in (r.get("timings_s") or {}).items()})
    if r.get("status") != "ok" and r.get("error"):
        row["error"] = f"{r['error'].get('type')}: {r['error'].get('message')}"
    return row


def _row_from_wandb(run_dir: str, config: dict, summary: dict, exit_code, run: dict) -> dict:
    overrides = config.get("overrides")  # not part of the logged config; the run name carries them
    status = "ok" if exit_code == 0 else ("running" if exit_code is None else "failed")
    row = {"run_dir": run_dir, "status": status, "overrides": overrides or "", "wandb.name": run.get("name"),
           "wandb.group": run.get("group"), "wandb.id": run.get("id")}
    row.update(_flatten({k: v for k, v in config.items() if not k.startswith("_")}))
    for k, v in summary.items():
        if k.startswith("_") or isinstance(v, dict):
            continue
        row[k.replace("timings/", "timings.", 1) if k.startswith("timings/") else k] = v
    return row


def _api_runs(path: str, job_type: str, filters: dict | None = None):
    """The W&B API's runs of ``<entity>/<project>[/<group>]`` with ``job_type`` (and ``filters``); NoRunsError, not a
    deep stack, when there is no key or no server."""
    import wandb

    parts = path.strip("/").split("/")
    if len(parts) not in (2, 3):
        raise ValueError(f"wandb:{path}: expected wandb:<entity>/<project>[/<group>]")
    f = dict(filters or {})
    if len(parts) == 3:
        f.setdefault("group", parts[2])
    if job_type:
        f.setdefault("jobType", job_type)
    try:
        return list(wandb.Api(timeout=30).runs(f"{parts[0]}/{parts[1]}", filters=f))
    except Exception as e:
        raise NoRunsError(f"wandb:{path}: could not read runs from the W&B API ({type(e).__name__}: {e}); "
                          "read local job dirs instead: load_runs(<sweep dir>)") from e


def _from_api(path: str, job_type: str, filters: dict | None) -> list[dict]:
    return [_row_from_wandb("wandb:" + "/".join(run.path), dict(run.config), dict(run.summary),
                            {"finished": 0, "running": None}.get(run.state, 1),
                            {"id": run.id, "name": run.name, "group": run.group})
            for run in _api_runs(path, job_type, filters)]


def load_history(source: str | Path, keys: Sequence[str] = ("train/mask_rate",), job_type: str = "pretrain") -> pd.DataFrame:
    """Long-format curves: one row per (run, logged step) with ``run_dir``, ``step`` (trainer/global_step) and each of
    ``keys`` -- from the offline W&B logs below a local folder, or from the W&B API for a ``wandb:`` source. Join with
    ``load_runs`` on ``run_dir`` to group by config."""
    frames = []
    if isinstance(source, str) and source.startswith("wandb:"):
        for run in _api_runs(source[len("wandb:"):], job_type):  # step = trainer/global_step, as offline
            h = run.history(keys=[*keys, "trainer/global_step"], pandas=True)
            h = h.drop(columns="_step", errors="ignore").rename(columns={"trainer/global_step": "step"})
            frames.append(h.assign(run_dir="wandb:" + "/".join(run.path)))
    else:
        runs: dict[str, list[tuple[Path, dict]]] = {}  # one W&B run id -> its offline logs, oldest first
        for run_dir in sorted(Path(source).expanduser().rglob("offline-run-*"), key=lambda p: p.name):
            info = read_wandb_offline(run_dir)
            if info["run"].get("job_type", job_type) != job_type:
                continue
            runs.setdefault(info["run"].get("id") or str(run_dir), []).append((run_dir, info))
        for logs in runs.values():
            rows = _merged_history(logs, keys)
            if rows:
                frames.append(pd.DataFrame(rows).assign(run_dir=str(logs[-1][0].parent.parent)))
    if not frames:
        raise NoRunsError(f"{source}: no logged history with any of {list(keys)}")
    return pd.concat(frames, ignore_index=True)


def _leet_records(log: Path) -> list[dict]:
    """The records of a ``run-*.wandb`` transaction log, read by W&B's own reader (``wandb leet inspect --json``: its
    Go core, offline, one JSON object per record). A log cut short by a killed process gives the records before the
    cut."""
    import subprocess

    p = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)], capture_output=True,
                       text=True, timeout=300, stdin=subprocess.DEVNULL)
    records = []
    for line in p.stdout.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            break  # a partial last line
    if not records:
        raise ValueError(f"{log}: `wandb leet inspect` read no records (exit {p.returncode}: "
                         f"{(p.stderr or p.stdout).strip()[-300:]})")
    return records


def read_wandb_offline(run_dir: str | Path) -> dict:
    """Config, summary, history rows and exit code of an offline W&B run dir (``.../wandb/offline-run-*``), read from
    its ``run-*.wandb`` log -- the same file ``wandb sync`` uploads -- by W&B's reader (:func:`_leet_records`)."""
    logs = list(Path(run_dir).glob("run-*.wandb"))
    if len(logs) != 1:
        raise ValueError(f"{run_dir}: expected one run-*.wandb log, found {len(logs)}")
    out: dict = {"config": {}, "summary": {}, "history": [], "exit_code": None, "run": {}}
    for rec in _leet_records(logs[0]):
        kind, body = rec.get("type"), rec.get(rec.get("type") or "", {})
        if kind == "config":  # later config updates wrap each value as {"value": ..., "desc": ...}
            for k, v in (body.get("update") or {}).items():
                out["config"][k] = v["value"] if isinstance(v, dict) and "value" in v else v
        elif kind == "summary":
            out["summary"].update(body.get("update") or {})
        elif kind == "history":
            out["history"].append(dict(body.get("item") or {}))
        elif kind == "exit":
            out["exit_code"] = body.get("exit_code", 0)  # proto3 JSON leaves a zero exit code out
        elif kind == "run":  # the config given to wandb.init travels inside the run record
            out["config"].update((body.get("config") or {}).get("update") or {})
            out["run"] = {"id": body.get("run_id"), "project": body.get("project"), "group": body.get("run_group"),
                          "job_type": body.get("job_type"), "name": body.get("display_name")}
    return out


def _merged_history(logs: list[tuple[Path, dict]], keys: Sequence[str]) -> list[dict]:
    """One history from the offline logs of one W&B run id, oldest first: a job resumed from a checkpoint continues
    its killed run's id in a new log (offline W&B cannot append to the old one), starting at the checkpoint's step, so
    each log keeps its rows before the next log's first step (the steps the resumed job re-did replace the killed
    job's)."""
    per_log = [[{"step": h.get("trainer/global_step", h.get("_step")), **{k: h[k] for k in keys if k in h}}
                for h in info["history"] if any(k in h for k in keys)] for _, info in logs]
    out = []
    for rows, after in zip(per_log, per_log[1:] + [[]]):
        cut = after[0]["step"] if after else None
        out.extend(r for r in rows if cut is None or r["step"] < cut)
    return out


def wandb_run_dirs(job_dir: str | Path) -> list[Path]:
    return sorted(Path(job_dir).glob("wandb/offline-run-*"))


def load_predictions(spec: str | Path) -> dict:
    """A run's per-item predictions (``<run dir>/predictions/<arm>.json`` or ``.json.gz``, written by every job with downstream
    tasks). ``spec``: ``<run dir>`` (the pretrained encoder) or ``<run dir>:random_init`` (its random-init arm)."""
    text = str(spec)
    arm = "pretrained"
    if ":" in text and text.rsplit(":", 1)[1] in ("pretrained", "random_init"):
        text, arm = text.rsplit(":", 1)
    path = Path(text) / "predictions" / f"{arm}.json"
    packed = path.with_name(path.name + ".gz")  # as archived next to a report (docs/results), gzip-compressed
    if not path.is_file() and packed.is_file():
        import gzip

        return json.loads(gzip.decompress(packed.read_bytes()))
    if not path.is_file():
        raise NoRunsError(f"{path} not found: give a run dir of a job with downstream tasks (optionally "
                          "<dir>:random_init for its random-init arm)")
    return json.loads(path.read_text())


def label_counts(run_dirs: Sequence[str | Path], also: Sequence[str | Path] = ()) -> dict[str, dict]:
    """Per task (as the jobs name it, ``sst2@500``), how often each label occurs in the evaluation set its scores are
    on, from the jobs' per-item predictions (``truth``): what the regime gate's constant predictor needs. Sentence
    tasks only (token tasks' entity F1 has a floor of 0 whatever the labels). ``also``: further run dirs (or folders
    of them) to look in for a task whose own runs kept no predictions -- a task's evaluation set is found there by its
    base name, split and size. Tasks found nowhere are absent."""
    from collections import Counter

    def of(d: Path) -> dict[str, tuple]:
        try:
            preds = load_predictions(d)
        except (NoRunsError, OSError, ValueError):
            return {}
        out = {}
        for task, p in preds.items():
            truth = p.get("truth") or []
            if truth and not isinstance(truth[0], list):
                out[task] = (p.get("split"), dict(Counter(map(str, truth))))
        return out

    found: dict[str, tuple] = {}
    for d in run_dirs:
        for task, v in of(Path(d)).items():
            found.setdefault(task, v)
    pool: dict[tuple, dict] = {}
    for root in also:
        for pred in sorted(Path(root).rglob("predictions/pretrained.json*")):
            for task, (split, counts) in of(pred.parent.parent).items():
                pool.setdefault((task.split("@")[0], split, sum(counts.values())), counts)
    out = {task: counts for task, (_, counts) in found.items()}
    for d in run_dirs:  # tasks these runs scored but kept no predictions of: their evaluation set found elsewhere
        rec = Path(d) / "results.json"
        if not rec.is_file():
            continue
        for task, info in (json.loads(rec.read_text()).get("downstream") or {}).items():
            if task in out or not isinstance(info, dict):
                continue
            n = (info.get("n") or {}).get(info.get("reported_split", "test"))
            hit = pool.get((task.split("@")[0], info.get("reported_split"), n))
            if hit is not None:
                out[task] = hit
    return out
