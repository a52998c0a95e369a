"""Tables of a sweep: select runs, aggregate a metric over seeds, compare arms against a baseline (the verdicts of
:mod:`mlmlab.verdicts`, over pretraining seeds), plan the seeds a question needs, label-budget curves, and per-item
comparisons of two runs' predictions. Every interval and p-value comes from :mod:`mlmlab.stats`."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence

import pandas as pd

from mlmlab import stats
from mlmlab.runs import NoRunsError

DEFAULT_METRIC = "downstream/score"



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
            level: float = 0.95, ignore: Sequence[str] = ()) -> pd.DataFrame:
    """Each value of ``by`` against ``baseline``, paired on ``pair_on`` (the pretraining seed: the same seed sees the
    same data order): mean difference, its std, n pairs, t CI, the two-sided paired t-test p-value (raw: for a
    family's adjusted p and the verdict, :func:`mlmlab.verdicts.question_table`) and the minimal detectable
    difference at 80% power (exact noncentral t, :func:`mlmlab.stats.mdd`). Runs made under different protocols are
    refused (:func:`same_protocol`; ``ignore``: the keys declared irrelevant)."""
    by, metric, pair_on = _columns(df, by)[0], _columns(df, metric)[0], _columns(df, pair_on)[0]
    if baseline not in set(df[by]):
        raise ValueError(f"baseline {by}={baseline!r} is not among the runs; present: {sorted(set(df[by]), key=str)}")
    _one_run_per_pair(df, by, metric, pair_on)
    same_protocol(df, by, [metric], pair_on, ignore)
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
             names: dict | None = None, counts: dict | None = None, also: Sequence = (),
             ignore: Sequence[str] = ()) -> pd.DataFrame:
    """Every arm of ``by`` against ``baseline`` on every metric, paired on the pretraining seed, with the declared
    question's adjusted p-values, the regime gate and verdicts (:func:`mlmlab.verdicts.question_table`; ``declared``:
    a :class:`mlmlab.stats.Question`, default :func:`declared_question` of the runs). The gate's constant predictor
    reads each task's evaluation labels: ``counts`` (task -> {label: count}), else the runs' own per-item predictions
    (:func:`mlmlab.runs.label_counts`, with ``also``: more folders to find a task's labels in). Runs made under
    different protocols are refused (:func:`same_protocol`; ``ignore``: keys declared irrelevant); a finished run
    that lacks a declared metric is named in ``attrs["missing"]`` (:func:`mlmlab.verdicts.question_table`)."""
    from mlmlab.runs import label_counts
    from mlmlab.verdicts import question_table

    by, pair_on = _columns(df, by)[0], _columns(df, pair_on)[0]
    metrics = _columns(df, metrics)
    for m in metrics:
        _one_run_per_pair(df, by, m, pair_on)
    same_protocol(df, by, metrics, pair_on, ignore)
    if counts is None and "run_dir" in df.columns:
        counts = label_counts([d for d in df["run_dir"].dropna().unique()], also)
    return question_table(df, by, baseline, metrics, declared or declared_question(df), pair_on, names, counts)


def plan(df: pd.DataFrame, by: str, baseline, metric: str, effect: float, pair_on: str = "seed",
         power: float = 0.8, question=None) -> pd.DataFrame:
    """The pretraining seeds a question needs and their cost-optimal allocation, from a pilot sweep
    (:func:`mlmlab.verdicts.plan_table`); ``question`` (:func:`declared_question`): its alpha and sequential rule."""
    from mlmlab.verdicts import plan_table

    by, metric, pair_on = _columns(df, by)[0], _columns(df, metric)[0], _columns(df, pair_on)[0]
    _one_run_per_pair(df, by, metric, pair_on)
    q = question or stats.Question()
    primary = metric == q.primary  # the sequential rule and the margin are the primary metric's
    return plan_table(df, by, baseline, metric, effect, pair_on, power, q.alpha,
                      q.sequential if primary and q.sequential.enabled else None, q.delta if primary else None)


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


# keys that only say where or how a job ran, or what it recorded: never a protocol difference
NEVER_PROTOCOL = {"run_dir", "status", "overrides", "error", "checkpoint", "skip_completed", "resume", "trainer.threads",
                  "trainer.accelerator", "trainer.compile", "trainer.enable_progress_bar", "trainer.log_every_n_steps",
                  "trainer.checkpoint_every_n_steps", "data.num_proc", "data.num_workers", "data.val_batch_size",
                  "downstream.wandb_runs", "downstream.task_dirs", "downstream.reuse_random_init",
                  "downstream.random_init_baseline",  # which job computed the seed's shared random-init row
                  "downstream.zeroshot.batch_size", "overwrite",  # overwrite=true: where a job ran again, not how
                  "eval.per_source"}  # adds per-source metrics; the ones compared are scored the same with or without
NEVER_PROTOCOL_PREFIXES = ("wandb.", "logger.", "paths.", "timings.", "hydra.", "launcher.", "analysis.", "callbacks.")
# keys that must be equal across every arm compared (unless the axis, under it, or ignored): how an arm is measured
PROTOCOL_PREFIXES = ("downstream.", "eval.", "data.", "tokenizer.", "model.", "trainer.budget.", "optim.", "objective.")
PROTOCOL_KEYS = {"trainer.max_steps"}


def _ignored(key: str, ignore: Sequence[str]) -> bool:
    """``key`` is one of ``ignore``, under one (``downstream.finetune`` covers ``downstream.finetune.lr``) or matches a
    pattern (``downstream.*``)."""
    import fnmatch

    return any(key == i or key.startswith(i.rstrip(".*") + ".") or fnmatch.fnmatchcase(key, i) for i in ignore)


def same_protocol(df: pd.DataFrame, by: str, metrics: Sequence[str], pair_on: str = "seed",
                  ignore: Sequence[str] = ()) -> None:
    """A ValueError (one line, naming the keys and their values) when the runs that enter a comparison (those with a
    value of one of ``metrics``) were made under different protocols. Per config key other than ``by`` (and the keys
    under it), ``pair_on``, the keys of :data:`NEVER_PROTOCOL` and ``ignore``:

    * values that differ among the runs of one arm (across seeds): a protocol difference;
    * values that are a function of the arm: the arm's definition (``mask.name`` under ``by=mask.sampler._target_``),
      accepted -- except the protocol keys (``downstream.*``, ``eval.*``, ``data.*``, ``tokenizer.*``, ``model.*``,
      ``trainer.max_steps``, ``trainer.budget.*``, ``optim.*``, ``objective.*``), which must be equal across all arms
      unless they sit beside ``by`` (``by=objective.name``: ``objective.temperature`` is the arm's too).

    A key one run lacks reads as ``<unset>``: a run from before the key existed is refused until it is ignored."""
    if by not in df.columns:
        return
    seen = set()
    for m in metrics:  # per metric: the runs that pair on it (a pretraining record and its fine-tuning record apart)
        if m in df.columns:
            runs = df[df[m].notna() & df[by].notna()]
            if len(runs) > 1 and (key := tuple(runs.index)) not in seen:
                seen.add(key)
                named = [x.strip() for n in metrics for x in n.split(DIFFERENCE)]  # a metric without "/" is no key
                _same_protocol(runs, by, pair_on, [*ignore, *named])


def _same_protocol(runs: pd.DataFrame, by: str, pair_on: str, ignore: Sequence[str]) -> None:
    def text(v) -> str:
        if isinstance(v, (list, tuple, dict)):
            return str(v)
        return "<unset>" if pd.isna(v) else str(v)

    parent = by.rpartition(".")[0] + "." if "." in by else ""  # by=objective.name: objective.* defines the arm too
    within, across = [], []
    for c in runs.columns:
        if ("/" in c or DIFFERENCE in c or c in (by, pair_on) or c.startswith(by + ".") or c in NEVER_PROTOCOL
                or c.startswith(NEVER_PROTOCOL_PREFIXES) or _ignored(c, ignore)):
            continue
        vals = runs[c].map(text)
        if vals.nunique() < 2:
            continue
        per_arm = vals.groupby(runs[by]).agg(lambda s: sorted(set(s)))
        arms = ", ".join(f"{by}={a!s}: {' | '.join(x[:60] for x in v[:3])}{' ...' if len(v) > 3 else ''}"
                         for a, v in per_arm.items())
        if (per_arm.map(len) > 1).any():
            within.append(f"{c} varies within an arm ({arms})")
        elif (c in PROTOCOL_KEYS or c.startswith(PROTOCOL_PREFIXES)) and not (parent and c.startswith(parent)):
            across.append(f"{c} differs across arms ({arms})")
    if within or across:
        raise ValueError(f"the runs compared were made under different protocols: {'; '.join(within + across)}. "
                         "Select runs made alike (where=), or declare the keys irrelevant: ignore=[<key>,...]")


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


def declared_question(df: pd.DataFrame, primary=None, family=None, delta=None):
    """The question the runs' sweep declared (``analysis.*`` in their config), overridden by what is given. Records
    that declare ``analysis.sequential.*`` without ``min_seeds`` were written before it existed and ran their first
    look at ``first or max(2, round)`` seeds: their plan is rebuilt with ``min_seeds=2``, so re-analysing such a
    sweep reproduces its looks."""
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
    min_seeds = one("sequential.min_seeds")
    if seq and (min_seeds is None or min_seeds != min_seeds):
        seq["min_seeds"] = 2  # a record from before min_seeds: its looks started at first or max(2, round)
    elif seq:
        seq["min_seeds"] = int(min_seeds)
    extra = {k: v for k in ("multiplicity", "chance_margin") if (v := one(k)) is not None and v == v}
    return Question(primary=primary or one("primary"), family=fam,
                    delta=delta if delta is not None else one("delta"), sequential=seq or None, **extra)
