"""Runs -> pandas: load a sweep, aggregate over seeds, compare against a baseline, plot; also a CLI.

``load_runs(source)`` gives one tidy row per job, from any of three sources that agree with each other:

* a local folder (a job dir, a sweep dir, or a folder of sweeps): the jobs' ``results.json`` files;
* the same folder's offline W&B runs (``source_kind="wandb"``, or automatically where a job left no results.json);
* the W&B API: ``"wandb:<entity>/<project>"`` (optionally ``/<group>``), with ``filters`` passed to ``wandb.Api().runs``.

Columns: ``run_dir``, ``status``, ``overrides``, the whole resolved config flattened with dots (``mask.rate``,
``mask.replace.mask``, ``seed`` ...), every metric under its logged key (``downstream/score``, ``val/mlm_loss_r15``,
``train/selected_frac`` ...) and ``timings.<phase>``. Truncated or unreadable results are skipped, counted and named
in ``df.attrs["skipped"]``; a source with no runs at all raises ``NoRunsError``.

``aggregate(df, by=["mask.rate"], metric="downstream/score")`` -> mean, std, n and the t-distribution 95% CI per group;
``compare(df, by="mask.rate", baseline=0.15)`` -> paired differences over seeds with a paired t-test;
``plot_metric`` / ``plot_history`` draw a metric against an axis with CI bands and curves per group.

``python -m mlmlab.analysis <dir | wandb:entity/project[/group]> by=mask.rate [metric=[...]] [baseline=0.15]
[csv=out.csv] [png=out.png]`` prints the table (``key=value`` arguments like every entry point, :mod:`mlmlab.cli`;
``python -m mlmlab.analysis help`` lists them).
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from mlmlab import stats
from mlmlab.cli import BOOL, Opt
from mlmlab.cli import run as cli_run

log = logging.getLogger(__name__)

DEFAULT_METRIC = "downstream/score"


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


# ---------------------------------------------------------------------------------------------------------- loading


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
                        n_failed=sum(f.attrs["n_failed"] for f in frames))
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
    failed = [r for r in rows if r["status"] != "ok"]
    if not include_failed:
        rows = [r for r in rows if r["status"] == "ok"]
    if skipped:
        log.warning("skipped %d unreadable run(s): %s", len(skipped), "; ".join(f"{p} ({why})" for p, why in skipped))
    if not rows:
        what = (f"{len(failed)} failed run(s) (include_failed=true shows them: "
                f"{'; '.join(str(r.get('error', r['status']))[:120] for r in failed[:3])})" if failed else "no runs")
        detail = f"; {len(skipped)} unreadable: {skipped[0][0]} ({skipped[0][1]})" if skipped else ""
        raise NoRunsError(f"{source}: {what}{detail}")
    df = pd.DataFrame(rows)
    df.attrs.update(source=str(source), skipped=[{"path": str(p), "reason": why} for p, why in skipped],
                    n_skipped=len(skipped), n_failed=len(failed))
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
    row.update(r.get("metrics") or {})
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


# ----------------------------------------------------------------------------------------------------- statistics


def _columns(df: pd.DataFrame, names: str | Iterable[str]) -> list[str]:
    """``names`` checked against ``df``'s columns (KeyError naming near misses); a dict-valued config key is added to
    ``df`` as one column first (:func:`_add_dict_column`)."""
    names = [names] if isinstance(names, str) else list(names)
    for n in names:
        if n not in df.columns:
            _add_dict_column(df, n)
        if n not in df.columns:
            _add_difference_column(df, n)
    missing = [n for n in names if n not in df.columns]
    if missing:
        near = [c for c in df.columns if any(m.split(".")[-1] in c for m in missing)][:8]
        raise KeyError(f"no column {missing} in the runs; similar: {near or '-'}")
    return names


def select(df: pd.DataFrame, where: dict | None = None, exclude: Sequence[dict] = ()) -> pd.DataFrame:
    """The runs of ``df`` whose config matches every ``key: value`` of ``where``, less those matching every key of
    any ``exclude`` entry (``{"mask.rate": 0.4}``; a dict-valued key compares as its override text,
    ``{"mask.replace": "{mask:1.0,random:0.0,keep:0.0}"}``). An unknown key is a KeyError naming near misses; a
    ``where`` that keeps no run is a NoRunsError naming the values the runs have."""
    def hit(cond: dict) -> pd.Series:
        out = pd.Series(True, index=df.index)
        for k, v in cond.items():
            out &= df[_columns(df, k)[0]] == v
        return out

    keep = hit(where or {})
    if where and not keep.any():
        have = {k: sorted(map(str, df[k].dropna().unique()))[:8] for k in where}
        raise NoRunsError(f"where={where}: no run matches; the runs have {have}")
    for drop in exclude:
        keep &= ~hit(drop)
    out = df[keep].copy()
    out.attrs.update(df.attrs)
    return out


def _add_dict_column(df: pd.DataFrame, name: str) -> None:
    """A dict-valued config key (``mask.replace``: flattened to ``mask.replace.mask`` / ``.random`` / ``.keep``) as
    one column ``name`` (in place), its values written as the override that sets it: ``{mask:0.8,random:0.1,keep:0.1}``,
    so ``by=mask.replace baseline="{mask:0.8,random:0.1,keep:0.1}"`` groups and pairs the arms of a split sweep."""
    parts = [c for c in df.columns if c.startswith(name + ".")]
    if not parts:
        return
    values = ["{" + ",".join(f"{c[len(name) + 1:]}:{v}" for c, v in row.items()
                             if not (pd.api.types.is_scalar(v) and pd.isna(v))) + "}"  # a key this run lacks: left out
              for _, row in df[parts].iterrows()]
    with warnings.catch_warnings():  # a frame of many metric columns is "fragmented": harmless for one more column
        warnings.simplefilter("ignore", pd.errors.PerformanceWarning)
        df[name] = values


DIFFERENCE = " - "  # "a - b": a metric column less another, per run


def _add_difference_column(df: pd.DataFrame, name: str) -> None:
    """``"a - b"`` (spaces around the minus): column ``a`` less column ``b`` per run, added as column ``name`` (in
    place). Compared between arms it is a difference in differences -- ``metric="val/mlm_loss_at_mask_r15_mix1 -
    val/mlm_loss_at_mask_r15_mix0"`` with ``baseline=`` pairs each arm's effect on the domain source's validation
    blocks less its effect on the general source's, per seed (the domain claim within the same encoders). A missing
    part is a KeyError naming it."""
    parts = [x.strip() for x in name.split(DIFFERENCE)]
    if len(parts) == 1 or not all(parts):
        return
    if len(parts) > 2:
        raise KeyError(f"{name!r}: one difference at most, \"a - b\"")
    a, b = (_columns(df, x)[0] for x in parts)
    text = [x for x in (a, b) if not pd.api.types.is_numeric_dtype(df[x])]
    if text:
        raise KeyError(f"{name!r}: {text} not numeric; a difference needs two metric columns")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pd.errors.PerformanceWarning)
        df[name] = df[a] - df[b]


def t_ci(std: float, n: int, level: float = 0.95) -> float:
    """Half-width of the t-distribution confidence interval of a mean of ``n`` values (nan below 2;
    :func:`mlmlab.stats.t_half_width`)."""
    return stats.t_half_width(std, n, level)


def aggregate(df: pd.DataFrame, by: str | Sequence[str], metric: str | Sequence[str] = DEFAULT_METRIC,
              level: float = 0.95) -> pd.DataFrame:
    """Per group of ``by``: ``n``, ``mean``, ``std`` (sample), ``ci95`` (t half-width) for each metric. One metric
    gives flat columns; several give a (metric, stat) column MultiIndex."""
    by, metrics = _columns(df, by), _columns(df, metric)
    tables = {}
    for m in metrics:
        g = df.groupby(by, dropna=False)[m]
        t = pd.DataFrame({"n": g.count(), "mean": g.mean(), "std": g.std(ddof=1)})
        t["ci95"] = [t_ci(s, int(n), level) for s, n in zip(t["std"], t["n"])]
        tables[m] = t
    if len(metrics) == 1:
        return tables[metrics[0]]
    return pd.concat(tables, axis=1)


def compare(df: pd.DataFrame, by: str, baseline, metric: str = DEFAULT_METRIC, pair_on: str = "seed",
            level: float = 0.95) -> pd.DataFrame:
    """Each value of ``by`` against ``baseline``, paired on ``pair_on`` (the pretraining seed: the same seed sees the
    same data order): mean difference, its std, n pairs, t CI, the two-sided paired t-test p-value (raw: for a
    family's adjusted p and the verdict, :func:`mlmlab.verdicts.question_table`) and the minimal detectable
    difference at 80% power (exact noncentral t, :func:`mlmlab.stats.mdd`)."""
    by, metric, pair_on = _columns(df, by)[0], _columns(df, metric)[0], _columns(df, pair_on)[0]
    if baseline not in set(df[by]):
        raise ValueError(f"baseline {by}={baseline!r} is not among the runs; present: {sorted(set(df[by]), key=str)}")
    _one_run_per_pair(df, by, metric, pair_on)
    wide = df.pivot_table(index=pair_on, columns=by, values=metric, aggfunc="mean")
    if baseline not in wide.columns:  # pivot_table drops a column with no values: say which, not a KeyError
        raise ValueError(f"baseline {by}={baseline!r} has no value of {metric} (older records may lack it); "
                         f"runs with values: {sorted(set(df.loc[df[metric].notna(), by]), key=str)}")
    rows = []
    for value in wide.columns:
        if value == baseline:
            continue
        pair = wide[[baseline, value]].dropna()
        iv = stats.paired_t(pair[value].to_numpy(), pair[baseline].to_numpy(), level)
        sd = iv.sd if iv.n > 1 else float("nan")
        rows.append({by: value, "n": iv.n, "mean": float(pair[value].mean()), "baseline": float(pair[baseline].mean()),
                     "diff": iv.mean, "diff_std": sd, "diff_ci95": iv.half, "p_value": iv.p,
                     "mdd": stats.mdd(sd, iv.n)})
    cols = [by, "n", "mean", "baseline", "diff", "diff_std", "diff_ci95", "p_value", "mdd"]
    return pd.DataFrame(rows, columns=cols).set_index(by)  # empty (with these columns) if only the baseline ran


def question(df: pd.DataFrame, by: str, baseline, metrics: str | Sequence[str], declared=None, pair_on: str = "seed",
             names: dict | None = None) -> pd.DataFrame:
    """Every arm of ``by`` against ``baseline`` on every metric, paired on the pretraining seed, with the declared
    question's family-adjusted p-values and verdicts (:func:`mlmlab.verdicts.question_table`; ``declared``: a
    :class:`mlmlab.stats.Question`, default :func:`declared_question` of the runs)."""
    from mlmlab.verdicts import question_table

    by, pair_on = _columns(df, by)[0], _columns(df, pair_on)[0]
    metrics = _columns(df, metrics)
    for m in metrics:
        _one_run_per_pair(df, by, m, pair_on)
    return question_table(df, by, baseline, metrics, declared or declared_question(df), pair_on, names)


def plan(df: pd.DataFrame, by: str, baseline, metric: str, effect: float, pair_on: str = "seed",
         power: float = 0.8) -> pd.DataFrame:
    """The pretraining seeds a question needs, from a pilot sweep (:func:`mlmlab.verdicts.plan_table`)."""
    from mlmlab.verdicts import plan_table

    by, metric, pair_on = _columns(df, by)[0], _columns(df, metric)[0], _columns(df, pair_on)[0]
    _one_run_per_pair(df, by, metric, pair_on)
    return plan_table(df, by, baseline, metric, effect, pair_on, power)


def _one_run_per_pair(df: pd.DataFrame, by: str, metric: str, pair_on: str) -> None:
    """A ValueError when two runs with a value of ``metric`` share an arm and a seed: averaging them would hide that
    they differ (``mask.sampler.mix`` 0.5 and 1.0 under one sampler class), or count a rerun twice. It names the runs
    and the config keys they differ in. Records without the metric (a job's re-score or fine-tuning beside it) pass."""
    cells = df.loc[df[metric].notna(), [pair_on, by]].groupby([pair_on, by]).size()
    if not (cells > 1).any():
        return
    scored = df[df[metric].notna()]
    seed, value = (v.item() if hasattr(v, "item") else v for v in cells[cells > 1].index[0])  # numpy -> Python
    same = scored[(scored[pair_on] == seed) & (scored[by] == value)]
    skip = {"run_dir", "status", "overrides", "error", "wandb.name", "wandb.id"}
    differ = [c for c in same.columns if "/" not in c and c not in skip and not c.startswith(("timings.", "paths."))
              and same[c].astype(str).nunique() > 1]  # not where each run wrote
    runs = ", ".join(map(str, same.get("run_dir", same.index)))
    why = (f"they differ in {', '.join(f'{c} ({sorted(set(map(str, same[c])))})' for c in differ[:4])}"
           if differ else "their configs are the same (a rerun in another dir?)")
    raise ValueError(f"{by}={value!r}, {pair_on}={seed}: {len(same)} runs have a value of {metric} ({runs}); {why}. "
                     "Keep one per arm and seed (where=<key>=<value>, or select() in Python), or compare by the key "
                     "that tells them apart")


def label_budget_curve(df: pd.DataFrame, task: str, metric: str = "acc", by: str | None = None,
                       prefix: str = "downstream", level: float = 0.95) -> pd.DataFrame:
    """The label-budget curve of ``task`` (jobs run with ``downstream.max_train_examples=[250, 1000, 4000]``): per
    budget (and per ``by`` group), ``n``, ``mean``, ``std``, ``ci95`` of ``<prefix>/<task>@<N>/<metric>``
    (``prefix="gain"``: the paired gain over random init). Over pretraining runs where a group has several; over the
    fine-tuning seeds of its one run otherwise (``unit`` says which)."""
    import re

    pat = re.compile(rf"{re.escape(prefix)}/{re.escape(task)}@(\d+)/seed_(\w+)/{re.escape(metric)}")
    cols = {c: pat.fullmatch(c) for c in df.columns}
    cols = {c: (int(m.group(1)), m.group(2)) for c, m in cols.items() if m}
    if not cols:
        raise NoRunsError(f"no {prefix}/{task}@<N>/seed_<s>/{metric} columns: run the jobs with "
                          "downstream.max_train_examples=[...] (a list of label budgets)")
    keys = ["run_dir"] + ([_columns(df, by)[0]] if by else [])
    long = df[keys + list(cols)].melt(id_vars=keys, var_name="col", value_name="value").dropna(subset=["value"])
    long["budget"] = long["col"].map(lambda c: cols[c][0])
    group = ([by] if by else []) + ["budget"]
    per_run = long.groupby(keys + ["budget"], dropna=False)["value"].mean().reset_index()
    rows = []
    for gkey, part in per_run.groupby(group, dropna=False):
        runs = part["run_dir"].nunique()
        vals = part["value"] if runs > 1 else long[(long["run_dir"] == part["run_dir"].iloc[0])
                                                   & (long["budget"] == part["budget"].iloc[0])]["value"]
        std = float(vals.std(ddof=1)) if len(vals) > 1 else float("nan")
        rows.append((*(gkey if isinstance(gkey, tuple) else (gkey,)), len(vals), float(vals.mean()), std,
                     t_ci(std, len(vals), level), "runs" if runs > 1 else "fine-tuning seeds"))
    return pd.DataFrame(rows, columns=[*group, "n", "mean", "std", "ci95", "unit"]).set_index(group)


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


def _correct(p: dict) -> dict[str, list[list[float]]]:
    """Per protocol: one 0/1 (None: tie) row per fine-tuning seed (or one row for the probe / zero-shot; one per
    pretraining run where several were pooled: ``probe_runs``, ``items_runs``)."""
    out: dict[str, list] = {}
    if "items" in p or "items_runs" in p:  # one zero-shot run, or several pooled (mlmlab.report's pooled rows)
        runs = p.get("items_runs", [p.get("items")])
        out["zeroshot"] = [[None if c == "-" else float(c) for c in items] for items in runs]
        return out
    truth = p["truth"]
    if truth and isinstance(truth[0], list):
        return out  # token tasks: entity F1 does not split into per-item outcomes
    if "seeds" in p:
        out["finetune"] = [[float(a == t) for a, t in zip(v, truth)] for _, v in sorted(p["seeds"].items())]
    if "probe" in p or "probe_runs" in p:
        out["probe"] = [[float(a == t) for a, t in zip(run, truth)] for run in p.get("probe_runs", [p.get("probe")])]
    return out


def compare_items(a: dict, b: dict, level: float = 0.95, n_resamples: int = 10000,
                  clusters: dict[str, list] | None = None) -> pd.DataFrame:
    """Two prediction sets (``load_predictions``) on the same items, per task and protocol: accuracy of each, the
    difference with a paired percentile bootstrap CI over items (:func:`mlmlab.stats.bootstrap`, ``levels=("item",)``;
    fine-tuning seeds averaged per item; items resampled in ``clusters`` where given: ``{task: [label per item]}``,
    by default a task's own ``clusters`` list, and BLiMP's paradigm from its ``pair_ids``), the exact McNemar p (per fine-tuning seed, paired by seed), and the minimal detectable
    difference at this many items (80% power, exact noncentral t). **Conditional on the encoders that were trained**:
    it ignores the pretraining seed, so it never decides a verdict (:mod:`mlmlab.verdicts` does, over seeds). Ties
    (zero-shot) are dropped from both sides."""
    import numpy as np

    rows = []
    for task in sorted(set(a) & set(b)):
        pa, pb = a[task], b[task]
        items_a, items_b = pa.get("items_runs", [pa.get("items", "")]), pb.get("items_runs", [pb.get("items", "")])
        if pa.get("truth") != pb.get("truth") or {len(x) for x in items_a} != {len(x) for x in items_b}:
            raise ValueError(f"task {task}: the two runs scored different items (split, subsample or labels differ)")
        ca, cb = _correct(pa), _correct(pb)
        for proto in sorted(set(ca) & set(cb)):
            ra, rb = ca[proto], cb[proto]
            if proto == "finetune":
                common = sorted(set(pa["seeds"]) & set(pb["seeds"]))
                ra = [ca[proto][sorted(pa["seeds"]).index(s)] for s in common]
                rb = [cb[proto][sorted(pb["seeds"]).index(s)] for s in common]
            keep = [i for i in range(len(ra[0])) if all(r[i] is not None for r in ra + rb)]
            xa = np.array([[r[i] for i in keep] for r in ra]).mean(0)
            xb = np.array([[r[i] for i in keep] for r in rb]).mean(0)
            d = xa - xb
            groups = (clusters or {}).get(task) or pa.get("clusters") or (  # BLiMP: its paradigm per pair
                [pid[0] for pid in pa["pair_ids"]] if pa.get("pair_ids") and proto == "zeroshot" else None)
            lo, hi = stats.bootstrap(d[None, None, :], [groups[i] for i in keep] if groups else None, ("item",), level,
                               n_resamples)
            tests = [stats.mcnemar([r[i] for i in keep], [q[i] for i in keep]) for r, q in zip(ra, rb)]
            rows.append({"task": task, "protocol": proto, "n_items": len(keep), "runs_paired": len(ra),
                         "a": float(xa.mean()), "b": float(xb.mean()), "diff": float(d.mean()),
                         "ci_low": lo, "ci_high": hi,
                         "mcnemar_p": ", ".join(f"{t['p']:.3g}" for t in tests),
                         "mdd": stats.mdd(float(d.std(ddof=1)), len(d)) if len(d) > 1 else float("nan")})
    if not rows:
        raise NoRunsError("the two prediction sets share no task with per-item outcomes")
    return pd.DataFrame(rows).set_index(["task", "protocol"])


# ---------------------------------------------------------------------------------------------------------- plots


def plot_metric(df: pd.DataFrame, x: str, metric: str = DEFAULT_METRIC, hue: str | None = None, ax=None,
                level: float = 0.95):
    """``metric`` against ``x`` (mean over seeds), a line per ``hue`` value, with the t confidence band."""
    import matplotlib.pyplot as plt  # the notebook's inline backend there, headless Agg elsewhere

    ax = ax or plt.subplots(figsize=(5, 3.5))[1]
    groups = [(None, df)] if hue is None else sorted(df.groupby(_columns(df, hue)[0]), key=lambda kv: str(kv[0]))
    for name, part in groups:
        t = aggregate(part, x, metric, level).sort_index()
        xs = list(t.index)
        numeric = all(isinstance(v, (int, float)) for v in xs)
        pos = xs if numeric else list(range(len(xs)))
        ci = t["ci95"].fillna(0)
        ax.plot(pos, t["mean"], marker="o", label=None if hue is None else f"{hue}={name}")
        ax.fill_between(pos, t["mean"] - ci, t["mean"] + ci, alpha=0.2)
        if not numeric:
            ax.set_xticks(pos, [str(v) for v in xs])
    ax.set_xlabel(x)
    ax.set_ylabel(f"{metric} (mean, {int(level * 100)}% CI)")
    if hue is not None:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


def plot_label_budget(curve: pd.DataFrame, ax=None, ylabel: str = "score"):
    """A ``label_budget_curve`` table: score against the number of labelled examples (log x), a line per group."""
    import matplotlib.pyplot as plt  # the notebook's inline backend there, headless Agg elsewhere

    ax = ax or plt.subplots(figsize=(5, 3.5))[1]
    t = curve.reset_index()
    groups = [(None, t)] if t.columns[0] == "budget" else list(t.groupby(t.columns[0]))
    for name, part in groups:
        part = part.sort_values("budget")
        ci = part["ci95"].fillna(0)
        ax.plot(part["budget"], part["mean"], marker="o", label=None if name is None else f"{t.columns[0]}={name}")
        ax.fill_between(part["budget"], part["mean"] - ci, part["mean"] + ci, alpha=0.2)
    ax.set_xscale("log")
    ax.set_xlabel("labelled training examples")
    ax.set_ylabel(f"{ylabel} (mean, 95% CI)")
    if len(groups) > 1:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


def plot_history(history: pd.DataFrame, runs: pd.DataFrame, key: str, by: str, ax=None):
    """A logged curve (``train/mask_rate``, ``val/mlm_loss_r15`` ...) against step: mean over the runs of each
    ``by`` group (``runs`` from ``load_runs``, joined on ``run_dir``)."""
    import matplotlib.pyplot as plt  # the notebook's inline backend there, headless Agg elsewhere

    ax = ax or plt.subplots(figsize=(5, 3.5))[1]
    h = history.dropna(subset=[key]).merge(runs[["run_dir", by]], on="run_dir")
    if h.empty:
        raise NoRunsError(f"no {key} history for these runs")
    for name, part in sorted(h.groupby(by), key=lambda kv: str(kv[0])):
        curve = part.groupby("step")[key].mean()
        ax.plot(curve.index, curve.values, label=f"{by}={name}")
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


# --------------------------------------------------------------------------------------------- offline W&B reader


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


# ------------------------------------------------------------------------------------------------------------ CLI


def _parse_value(s: str):
    for cast in (int, float):
        try:
            return cast(s)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(s.lower(), s)


OPTIONS = {
    "source": Opt("a job/sweep dir, or wandb:<entity>/<project>[/<group>] (also the first bare argument)",
                  required=True),
    "by": Opt("config columns to group by, e.g. by=mask.rate or by=[mask.rate,mask.name] (required unless items_vs "
              "or label_budget)", many=True),
    "metric": Opt("metric columns; \"a - b\" (spaces around the minus) is column a less column b per run",
                  default=[DEFAULT_METRIC], many=True),
    "baseline": Opt("a value of the (first) by column: paired differences against it"),
    "pair_on": Opt("the column that pairs runs in baseline comparisons", default="seed"),
    "source_kind": Opt("where runs are read from", default="auto", choices=("auto", "results", "wandb")),
    "csv": Opt("write the table (and the comparison, as <name>.compare.csv) here"),
    "png": Opt("write the plot of the first metric against the first by column here"),
    "hue": Opt("a second config column: one line per value in the plot"),
    "label_budget": Opt("TASK: the label-budget curve of TASK (jobs run with downstream.max_train_examples=[...]) per "
                        "by group, for the first metric's last part (e.g. acc); png= plots it"),
    "prefix": Opt("with label_budget: downstream | gain | random_init", default="downstream",
                  choices=("downstream", "gain", "random_init")),
    "also": Opt("further sources whose runs join the table, e.g. the baseline arm another sweep ran (folders "
                "without commas)", many=True),
    "where": Opt("keep the runs whose config matches, e.g. where=mask.rate=0.4 or where=[mask.rate=0.4,seed=0]",
                 many=True),
    "primary": Opt("the question's primary metric (default: the runs' declared analysis.primary, from their sweep file)"),
    "family": Opt("metrics adjusted with the primary (Holm; default: the runs' analysis.family; with no primary "
                  "declared, every metric asked is one family)", many=True),
    "delta": Opt("equivalence margin on the primary metric (default: the runs' analysis.delta)", type=float),
    "include_failed": Opt("keep failed runs in the table (their metrics are mostly missing)", False, BOOL),
    "items_vs": Opt("RUN[:random_init]: compare the per-item predictions of the run source (or source:random_init) "
                    "with this one: paired bootstrap CI, McNemar, minimal detectable difference"),
}
PROG = "python -m mlmlab.analysis"


PLAN_OPTIONS = {
    "source": Opt("the pilot sweep: a job/sweep dir (also the first bare argument after plan)", required=True),
    "by": Opt("the config column of the arms, e.g. by=mask.rate", required=True),
    "baseline": Opt("the baseline arm's value of by", required=True),
    "effect": Opt("the true difference to detect, in the metric's units (0.01 = 1 point of accuracy)", required=True,
                  type=float),
    "metric": Opt("the metric (default: the runs' analysis.primary, else downstream/score)"),
    "power": Opt("the power to reach", default=0.8, type=float),
    "pair_on": Opt("the column that pairs runs", default="seed"),
    "also": Opt("further sources whose runs join the pilot", many=True),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Aggregate a sweep's runs over seeds (``key=value`` arguments, :mod:`mlmlab.cli`; ``help`` lists them);
    ``plan <pilot> ...``: the pretraining seeds a question needs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plan"]:
        return cli_run(_plan_main, argv[1:], PLAN_OPTIONS, f"{PROG} plan", positional="source")
    return cli_run(_main, argv, OPTIONS, PROG, positional="source")


def declared_question(df: pd.DataFrame, primary=None, family=None, delta=None):
    """The question the runs' sweep declared (``analysis.*`` in their config), overridden by what is given."""
    from mlmlab.stats import Question

    def one(key):
        col = f"analysis.{key}"
        vals = df[col].dropna().map(lambda v: tuple(v) if isinstance(v, (list, tuple)) else v).unique() \
            if col in df.columns else []
        if len(vals) > 1:
            raise ValueError(f"the runs declare different {col}: {sorted(map(str, vals))}; select one sweep")
        return vals[0] if len(vals) else None

    fam = family if family is not None else list(one("family") or [])
    seq = {k: one(f"sequential.{k}") for k in ("max_seeds", "round", "first", "spending")}
    seq = {k: (int(v) if k != "spending" else v) for k, v in seq.items() if v is not None and v == v}
    return Question(primary=primary or one("primary"), family=fam,
                    delta=delta if delta is not None else one("delta"), sequential=seq or None)


def _plan_main(a) -> int:
    try:
        df = load_runs([a.source, *(a.also or [])])
        metric = a.metric or declared_question(df).primary or DEFAULT_METRIC
        table = plan(df, a.by, _cli_value(a.baseline, df[_columns(df, a.by)[0]]), metric, a.effect, a.pair_on,
                     a.power)
    except (NoRunsError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
        print(f"plan from the pilot {a.source}: {metric}, {a.by} against {a.baseline}, a true difference of "
              f"{a.effect:g} at {a.power:.0%} power (two-sided paired t over pretraining seeds, alpha 0.05)")
        print(table.T.to_string())
    return 0


def _main(a) -> int:
    if a.items_vs:
        try:
            table = compare_items(load_predictions(a.source), load_predictions(a.items_vs))
        except (NoRunsError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format",
                               "{:.4f}".format):
            print(f"per-item comparison, a = {a.source}, b = {a.items_vs} (diff = a - b)")
            print(table.to_string())
        if a.csv:
            table.to_csv(a.csv)
        return 0
    if a.label_budget:  # by= optional: one curve per group, or one curve
        return _label_budget_cli(a)
    if not a.by:
        print(f"{PROG}: by= is required (unless items_vs= or label_budget=)", file=sys.stderr)
        return 2
    try:
        df = _load_selected(a)  # failed jobs: left out, counted below (include_failed=true: listed)
        failed = df[df["status"] != "ok"]
        if len(failed):
            print(f"{len(failed)} failed run(s):")
            for _, r in failed.iterrows():
                print(f"  {r['run_dir']}: {r.get('error', r['status'])}")
            if failed.shape[0] == df.shape[0]:
                return 0
        _columns(df, [*a.by, *a.metric])  # dict-valued and "a - b" columns added to df itself, before any filtering
        table = aggregate(df[df["status"] == "ok"], a.by, a.metric)
        comparison = None
        if a.baseline is not None:
            base = _cli_value(a.baseline, df[a.by[0]])
            declared = declared_question(df, a.primary, a.family, a.delta)
            metrics = list(dict.fromkeys([*a.metric, *declared.metrics_family(a.metric)]))
            comparison = question(df, a.by[0], base, metrics, declared, pair_on=a.pair_on)
    except (NoRunsError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 160, "display.max_columns", 50, "display.float_format", "{:.4f}".format):
        left_out = [f"{df.attrs[k]} {what}" for k, what in (("n_skipped", "unreadable"), ("n_failed", "failed"))
                    if df.attrs.get(k)]
        print(f"{len(df)} runs from {df.attrs.get('source', a.source)}" + (f" ({', '.join(left_out)}, left out)" if left_out else ""))
        print(table.to_string())
        if comparison is not None:
            print(f"\nagainst {a.by[0]}={a.baseline}, paired on {a.pair_on} (the pretraining seed: the unit); "
                  "interval: t over seeds; p_holm: Holm within the family; mdd: 80% power, [range of the sd's 95% CI]")
            for metric, part in comparison.groupby("metric", sort=False):
                print(f"\n{metric} ({part['role'].iloc[0]})")
                print(_printable(part).to_string())
            if declared.sequential.enabled and declared.primary:
                from mlmlab.verdicts import sequential_verdict

                for value in sorted(set(df[a.by[0]]) - {base}, key=str):
                    r = sequential_verdict(df, a.by[0], base, value, declared.primary, declared, a.pair_on)
                    print(f"\nsequential rule ({declared.sequential.spending} spending, looks at "
                          f"{list(declared.sequential.looks())} seeds), {a.by[0]}={value}: {r.verdict} at look "
                          f"{r.look} ({r.n} seeds; {r.interval.mean:+.4f} [{r.interval.low:+.4f}, "
                          f"{r.interval.high:+.4f}] at level {r.interval.level:.4f})")
    if a.csv:
        table.to_csv(a.csv)
        if comparison is not None:
            _printable(comparison, keep_metric=True).to_csv(Path(a.csv).with_suffix(".compare.csv"))
    if a.png:
        import matplotlib

        matplotlib.use("Agg")
        ax = plot_metric(df, a.by[0], a.metric[0], hue=a.hue)
        ax.figure.tight_layout()
        ax.figure.savefig(a.png, dpi=120)
    return 0


def _printable(t: pd.DataFrame, keep_metric: bool = False) -> pd.DataFrame:
    """A question table as printed: intervals as numbers, no objects."""
    out = t.copy()
    for side in ("baseline_gain", "arm_gain"):
        out[side] = [f"{g.mean:+.4f} [{g.low:+.4f}, {g.high:+.4f}]" if g is not None and g.n > 1 else "-"
                     for g in out[side]]
    cols = ["metric", "arm", "n", "baseline_mean", "arm_mean", "diff", "low", "high", "p", "p_holm", "mdd",
            "mdd_low", "mdd_high", "seeds_80", "baseline_gain", "arm_gain", "verdict"]
    out = out[[c for c in cols if keep_metric or c != "metric"]]
    return out.set_index("arm")


def _load_selected(a) -> pd.DataFrame:
    """The CLI's runs: ``source`` and ``also``, kept by ``where``."""
    where = {}
    for cond in a.where or []:
        key, sep, value = cond.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"where={cond!r}: expected key=value, e.g. where=mask.rate=0.4")
        where[key.strip()] = value.strip()
    df = load_runs([a.source, *(a.also or [])], source_kind=a.source_kind, include_failed=a.include_failed)
    where = {key: _cli_value(raw, df[_columns(df, key)[0]]) for key, raw in where.items()}
    return select(df, where) if where else df


def _cli_value(raw: str, column: pd.Series):
    """A CLI value (``baseline=``, ``where=``) as the column holds it: parsed (0.4, 8192, true) where the column has
    that value, else the text -- "32" may be a string column (trainer.precision), "0.15" one too (mask.unit=word ...)."""
    value = _parse_value(raw)
    return value if value in set(column.dropna()) else raw


def _label_budget_cli(a) -> int:
    metric = a.metric[0].rsplit("/", 1)[-1] if a.metric != [DEFAULT_METRIC] else "acc"
    try:
        df = _load_selected(a)
        curve = label_budget_curve(df, a.label_budget, metric, a.by[0] if a.by else None, a.prefix)
    except (NoRunsError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 160, "display.float_format", "{:.4f}".format):
        print(f"{a.prefix}/{a.label_budget}@<N>/{metric} by label budget, {len(df)} runs from {a.source}")
        print(curve.to_string())
    if a.csv:
        curve.to_csv(a.csv)
    if a.png:
        import matplotlib

        matplotlib.use("Agg")
        ax = plot_label_budget(curve, ylabel=f"{a.prefix} {a.label_budget} {metric}")
        ax.figure.tight_layout()
        ax.figure.savefig(a.png, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
