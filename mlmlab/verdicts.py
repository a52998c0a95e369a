"""A question's answer from a sweep's runs: every arm against the baseline arm on every metric, paired on the
pretraining seed, p-values Holm-adjusted within the question's family, and a verdict by fixed rules
(:func:`mlmlab.stats.verdict`); and the pilot -> seeds plan. The numbers come from :mod:`mlmlab.stats`; this module
only arranges runs (pandas) into the units those functions take.

It takes a frame whose columns are resolved (:func:`mlmlab.analysis.question` and :func:`mlmlab.analysis.plan` add a
dict-valued or ``a - b`` column and check one run per arm and seed first).

A question is declared in its sweep file (``analysis:`` -- :class:`Question`) before it runs: the primary metric, the
family of metrics whose comparisons are adjusted together (the primary is always in it), the equivalence margin on
the primary metric, and optionally the sequential rule. Every other metric is exploratory: shown with its raw p,
given no verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from mlmlab import stats
from mlmlab.stats import Question


def gain_column(metric: str) -> str | None:
    """The per-run gain over random init that says whether pretraining pays on ``metric``."""
    head, _, rest = metric.partition("/")
    return {"downstream": f"gain/{rest}", "probe": f"gain_probe/{rest}", "gain": metric}.get(head)


def _per_seed(df: pd.DataFrame, by: str, value, col: str | None, pair_on: str) -> pd.Series:
    """``col``'s value per ``pair_on`` (one run per arm and seed, checked by the caller) in the arm ``by == value``."""
    if not col or col not in df.columns:
        return pd.Series(dtype=float)
    part = df.loc[(df[by] == value) & df[col].notna(), [pair_on, col]]  # two columns, not a copy of a wide frame
    return part.groupby(pair_on)[col].mean() if len(part) else pd.Series(dtype=float)


def comparator_column(df: pd.DataFrame, metric: str) -> str | None:
    """The per-run score of the encoder a pretrained arm is compared with on ``metric`` (what its ``gain/`` is over):
    the start of a continued pretraining (``start/...``) where the runs have one, else random init."""
    head, _, rest = metric.partition("/")
    if head != "downstream":
        return None
    for prefix in ("start", "random_init"):
        col = f"{prefix}/{rest}"
        if col in df.columns and df[col].notna().any():
            return col
    return None


def floors(df: pd.DataFrame, by: str, baseline, metric: str, counts: dict | None, margin: float,
           pair_on: str = "seed") -> list[stats.Floor]:
    """The chance-floor checks of the regime gate on ``metric`` (``downstream/<task>/<name>``): the baseline arm and
    its comparator (random init, or the start), each its mean over pretraining seeds, against the constant predictor
    of the task's evaluation labels (``counts``: task -> {label: count}); on accuracy, macro-F1 too where the runs
    logged it (a majority-class predictor on imbalanced classes has a high accuracy but a macro-F1 of ~1/K of it).
    Empty where the labels are not known."""
    head, _, rest = metric.partition("/")
    task, _, name = rest.rpartition("/")
    if head != "downstream" or not counts or task not in counts:
        return []
    out = []
    for m in [metric] + ([f"downstream/{task}/f1"] if name == "acc" and f"downstream/{task}/f1" in df.columns else []):
        floor = stats.constant_predictor(counts[task], m)
        comp = comparator_column(df, m)
        for what, col in (("baseline", m), ("comparator", comp)):
            vals = _per_seed(df, by, baseline, col, pair_on)
            if len(vals):
                out.append(stats.Floor(what if what == "baseline" else col.split("/", 1)[0], m,
                                       float(vals.mean()), floor, margin))
    return out


def question_table(df: pd.DataFrame, by: str, baseline, metrics: Sequence[str], question: Question | None = None,
                   pair_on: str = "seed", names: dict | None = None, counts: dict | None = None) -> pd.DataFrame:
    """One row per (metric, arm) against ``baseline``, paired on ``pair_on``: n seeds, the two means, the difference
    with its t interval over seeds (``low``/``high``), raw and question-adjusted p (:func:`adjust`: Holm over every
    hypothesis of the question, or the declared gatekeeping order), the equivalence test (TOST within ``delta``,
    adjusted alike), the minimal detectable difference at 80% power with the range its sd's 95% interval gives, the
    seeds 80% power needs at ``delta`` (or at the observed difference), each side's gain over random init (or the
    start) over seeds where the metric has one, the regime gate's reading (``gate``: :func:`mlmlab.stats.gate`, with
    the chance floor from ``counts``, task -> {label: count} of its evaluation set), the role (primary / family /
    exploratory) and the verdict. ``attrs["missing"]``: per declared metric, the finished runs that lack it
    (:func:`missing_runs`); where the primary is among them, its rows are "not decided: <k> run(s) lack <metric>"
    (``lacking``: k)."""
    q = question or Question()
    metrics = list(metrics)
    col = "downstream.score_split"
    if col in df.columns and (df[col] == "selection").any():  # a screen's score never decides a verdict
        runs = df.loc[df[col] == "selection", "run_dir"].tolist() if "run_dir" in df.columns else []
        raise ValueError(f"{len(runs) or 'some'} run(s) scored the selection split (downstream.score_split=selection: "
                         f"screens), not the split that reports a verdict: {', '.join(map(str, runs[:3]))}")
    if baseline not in set(df[by]):
        raise ValueError(f"baseline {by}={baseline!r} is not among the runs; present: {sorted(set(df[by]), key=str)}")
    family = q.metrics_family(metrics)
    missing = [m for m in family if m not in metrics]
    if missing:
        raise ValueError(f"the family's metrics {missing} are not among those compared ({metrics}); add them to metric=")
    name = (lambda v: str((names or {}).get(str(v), v)))  # noqa: E731
    lacking = missing_runs(df, by, family, pair_on)
    rows = []
    for m in metrics:
        base = _per_seed(df, by, baseline, m, pair_on)
        g = gain_column(m)
        base_gain = _per_seed(df, by, baseline, g, pair_on)
        fl = floors(df, by, baseline, m, counts, q.chance_margin, pair_on)
        for value in sorted(set(df[by]) - {baseline}, key=str):
            arm = _per_seed(df, by, value, m, pair_on)
            common = sorted(set(arm.index) & set(base.index))
            iv = stats.paired_t(arm[common].to_numpy(), base[common].to_numpy())
            delta = q.delta if m == q.primary else None
            arm_gain = _per_seed(df, by, value, g, pair_on)
            r = stats.mdd_range(iv.sd, iv.n, q.alpha)
            target = delta or abs(iv.mean)
            rows.append({"metric": m, "arm": name(value), "baseline": name(baseline),
                         "role": "primary" if m == q.primary else ("family" if m in family else "exploratory"),
                         "n": iv.n, "baseline_mean": float(base[common].mean()) if common else math.nan,
                         "arm_mean": float(arm[common].mean()) if common else math.nan,
                         "diff": iv.mean, "low": iv.low, "high": iv.high, "sd": iv.sd, "p": iv.p,
                         "p_equiv": stats.tost_p(arm[common].to_numpy() - base[common].to_numpy(), delta)
                         if delta else math.nan,
                         "mdd": r.value, "mdd_low": r.low, "mdd_high": r.high,
                         "seeds_80": stats.seeds_for_power(target, iv.sd, 0.8, q.alpha) if iv.n > 1 else None,
                         "seeds_80_high": stats.seeds_for_power(target, stats.sd_interval(iv.sd, iv.n)[1], 0.8,
                                                                q.alpha) if iv.n > 1 else None,
                         "power_at": target, "delta": delta,
                         "baseline_gain": _gain(base_gain), "arm_gain": _gain(arm_gain),
                         "pays": stats.pays(base_gain.to_numpy()) if len(base_gain) else None,
                         "floors": fl,
                         "gate": stats.gate(base_gain.to_numpy(), arm_gain.to_numpy(), fl),
                         "lacking": len(lacking.get(m, [])) if m == q.primary else 0})
    t = pd.DataFrame(rows)
    t.attrs["missing"] = lacking
    if t.empty:
        return t
    t.attrs["question"] = q
    return readjust([t], q)[0]


def missing_runs(df: pd.DataFrame, by: str, metrics: Sequence[str], pair_on: str = "seed") -> dict[str, list]:
    """Per declared metric (primary and family), the finished runs (``status`` ok) of an arm whose arm and seed have
    no value of it (a record beside it that has one -- its fine-tuning job -- counts): each would drop a seed from
    the pairs unnamed. Their ``run_dir`` (the row index where there is none); metrics no run lacks are left out."""
    ok = df[df[by].notna()]
    if "status" in ok.columns:
        ok = ok[ok["status"].fillna("ok") == "ok"]
    out = {}
    for m in metrics:
        if m not in ok.columns:
            continue
        has = ok[m].notna().groupby([ok[by], ok[pair_on]], dropna=False).transform("any") if pair_on in ok.columns else ok[m].notna()
        runs = ok[~has]
        if len(runs):
            out[m] = [str(r) for r in (runs["run_dir"] if "run_dir" in runs.columns else runs.index)]
    return out


def readjust(tables: Sequence[pd.DataFrame], q: Question) -> list[pd.DataFrame]:
    """Adjust the hypotheses of several question tables of **one question** together (:func:`mlmlab.stats.adjust`:
    every arm x every baseline x the primary and family metrics, Holm or the declared gatekeeping order) and rewrite
    their ``p_holm`` / ``p_equiv_holm`` / ``verdict`` columns. A row's ``p`` is what enters: a sequential primary's
    row carries its stagewise-ordering p there (:func:`apply_sequential`)."""
    tables = [t.copy() for t in tables]
    keys = [(i, j) for i, t in enumerate(tables) for j in t.index[t["role"] != "exploratory"]]
    ps = [tables[i].at[j, "p"] for i, j in keys]
    pes = [tables[i].at[j, "p_equiv"] for i, j in keys]
    prim = [tables[i].at[j, "role"] == "primary" for i, j in keys]
    p_adj, pe_adj = stats.adjust(ps, pes, prim, q.multiplicity, q.alpha) if keys else ([], [])
    for t in tables:
        t["p_holm"] = math.nan
        t["p_equiv_holm"] = math.nan
    for (i, j), a, b in zip(keys, p_adj, pe_adj):
        tables[i].at[j, "p_holm"] = a
        tables[i].at[j, "p_equiv_holm"] = b
    for t in tables:
        if "gate" in t.columns:  # the question's regime is the primary's: a family row under a gated primary is gated too
            prim = {r["arm"]: r["gate"] for _, r in t[t["role"] == "primary"].iterrows() if isinstance(r["gate"], str)}
            t["gate"] = [prim.get(r["arm"], r["gate"]) if r["role"] == "family" else r["gate"] for _, r in t.iterrows()]
        t["verdict"] = [_word(r, q) for _, r in t.iterrows()]
        t.attrs["question"] = q
    return tables


def apply_sequential(t: pd.DataFrame, results: dict, design: dict | None = None) -> pd.DataFrame:
    """A sequential question's primary rows take the rule's inference (``results``: arm name ->
    :class:`mlmlab.stats.SequentialResult` at the look it stopped): the repeated confidence interval at that look
    (``low``/``high``), the stagewise-ordering p (``p``, what the question's adjustment reads), the look and seeds,
    and (``design``: arm -> (power at the margin, power at the observed effect)) the design's power from the same
    boundaries. The fixed-n minimal detectable difference and seeds-for-power do not apply and are cleared."""
    t = t.copy()
    for col in ("look", "looks", "p_repeated", "power_margin", "power_observed", "seq_verdict", "level"):
        if col not in t.columns:
            t[col] = None
    for j in t.index[t["role"] == "primary"]:
        r = results.get(str(t.at[j, "arm"]))
        if r is None:
            continue
        iv = r.interval
        t.at[j, "low"], t.at[j, "high"], t.at[j, "diff"] = iv.low, iv.high, iv.mean
        t.at[j, "n"] = r.n
        ps = getattr(r, "p_stagewise", math.nan)  # nan where the rule cannot order the outcome (an equivalence stop)
        t.at[j, "p"] = ps if ps == ps else 1.0  # still one hypothesis of the question: it keeps its place in Holm
        t.at[j, "p_repeated"] = getattr(r, "p_repeated", math.nan)
        t.at[j, "look"], t.at[j, "looks"], t.at[j, "level"] = r.look, len(getattr(r, "looks", ()) or ()), iv.level
        t.at[j, "seq_verdict"] = r.verdict
        for col in ("mdd", "mdd_low", "mdd_high", "seeds_80", "seeds_80_high"):
            t.at[j, col] = math.nan
        if design and str(t.at[j, "arm"]) in design:
            t.at[j, "power_margin"], t.at[j, "power_observed"] = design[str(t.at[j, "arm"])]
        if r.verdict == "equivalent":
            t.at[j, "p_equiv"] = 0.0  # the rule's RCI lies within the margin: equivalence decided at its level
    return t


def _gain(s: pd.Series) -> stats.Interval | None:
    return stats.mean_interval(s.to_numpy()) if len(s) else None


def _word(r: pd.Series, q: Question) -> str:
    if r["role"] == "exploratory":
        return "exploratory"
    k = r.get("lacking")
    if r["role"] == "primary" and k and k == k:  # a finished run without the primary: the pairs lost a seed unnamed
        return f"not decided: {int(k)} run(s) lack {r['metric']}"
    iv = stats.Interval(r["diff"], r["sd"], int(r["n"]), r["high"] - r["diff"], r["p"])
    gate = r.get("gate")  # each metric with a comparator is gated on itself; the question's regime is the primary's
    return stats.verdict(iv, r["p_holm"], r["p_equiv_holm"], arm=r["arm"], baseline=r["baseline"],
                         metric=r["metric"], delta=r["delta"] if r["delta"] == r["delta"] else None, alpha=q.alpha,
                         pays=r["pays"], reading=gate if isinstance(gate, str) else None)


def sequential_results(df: pd.DataFrame, by: str, baseline, metric: str, state: dict, pair_on: str = "seed",
                       names: dict | None = None) -> tuple[dict, dict]:
    """A sweep run in rounds, re-scored from its records: ``state`` is its ``sequential.json`` (the plan and looks it
    ran under, alpha per arm, the seeds' order). Per arm (by its printed name): the rule's result over the per-seed
    differences in that order (:func:`mlmlab.stats.sequential`: the repeated CI at the look it stopped, the
    stagewise-ordering p), and the design's power from the same boundaries at the margin and at the observed effect
    (:func:`mlmlab.stats.sequential_design`, at the stopping look's sd)."""
    plan_d = dict(state["plan"])
    looks = tuple(state["looks"])
    kw = {k: plan_d.get(k) for k in ("max_seeds", "round", "spending") if plan_d.get(k) is not None}
    kw["first"] = looks[0]
    if "min_seeds" in stats.SequentialPlan.__dataclass_fields__:
        kw["min_seeds"] = min(looks[0], plan_d.get("min_seeds") or looks[0])
    plan = stats.SequentialPlan(**kw)
    if tuple(plan.looks()) != looks:
        raise ValueError(f"sequential.json: looks {list(looks)} do not follow from its plan {plan_d}")
    alpha, delta = float(state.get("alpha_per_arm", state.get("alpha", stats.ALPHA))), state.get("delta")
    name = (lambda v: str((names or {}).get(str(v), v)))  # noqa: E731
    base = _per_seed(df, by, baseline, metric, pair_on)
    results, design = {}, {}
    for value in sorted(set(df[by]) - {baseline}, key=str):
        arm = _per_seed(df, by, value, metric, pair_on)
        order = [s for s in state["seeds"] if s in arm.index and s in base.index]
        diffs = (arm[order] - base[order]).to_numpy()
        r = stats.sequential(diffs, plan, delta, stats.higher_is_better(metric), alpha)
        results[name(value)] = r
        sd = r.interval.sd
        if hasattr(stats, "sequential_design") and sd == sd and sd > 0:
            kind = plan.spending
            at = [stats.sequential_design(looks, e, sd, alpha, kind).power if e else math.nan
                  for e in (delta, abs(r.interval.mean))]
            design[name(value)] = tuple(at)
    return results, design


def sequential_verdict(df: pd.DataFrame, by: str, baseline, value, metric: str, question: Question,
                       pair_on: str = "seed") -> stats.SequentialResult:
    """The sequential rule on the primary metric: the per-seed differences in seed order (the order rounds ran)."""
    base, arm = (_per_seed(df, by, v, metric, pair_on) for v in (baseline, value))
    common = sorted(set(arm.index) & set(base.index))
    return stats.sequential((arm[common] - base[common]).to_numpy(), question.sequential, question.delta,
                            stats.higher_is_better(metric), question.alpha)


# ---------------------------------------------------------------------------------------------------------- plan


def plan_table(df: pd.DataFrame, by: str, baseline, metric: str, effect: float, pair_on: str = "seed",
               power: float = 0.8, alpha: float = stats.ALPHA, sequential: stats.SequentialPlan | None = None,
               delta: float | None = None, m_max: int = 64) -> pd.DataFrame:
    """From a pilot sweep: per arm, the per-seed paired difference's sd (and its 95% range), its variance components
    and the pretraining seeds a paired t needs for ``power`` at a true difference ``effect`` (at the observed sd, at
    the top of its 95% range, with twice the fine-tuning seeds); and the cost-optimal allocation
    (:func:`mlmlab.stats.allocation`) from the unit costs the runs recorded (:func:`unit_costs`).

    The components (``between``: pretraining seed x arm; ``within``: one fine-tuning run's variance; metric units
    squared) come from the per-fine-tuning-seed values ``<task>/seed_<s>/<name>`` of the metric where both arms
    logged the same fine-tuning seeds (paired on the fine-tuning seed, :func:`mlmlab.stats.paired_components`), else
    from each run's ``<metric>_std`` (:func:`mlmlab.stats.components`); ``components_from`` says which.

    Allocation columns: ``m_star`` (continuous), ``m_opt`` fine-tuning seeds per encoder, ``n_opt`` pretraining seeds,
    ``power_opt``, ``cpu_min_opt``; against the pilot's design (``pilot_seeds`` x ``finetune_seeds``):
    ``pilot_cpu_min_spent`` (the records' summed ``timings_s.total`` of the two arms' runs), ``pilot_cpu_min_model``
    (that design at the unit costs: the metric's label budget only, the comparator once per seed), ``n_at_pilot_m``
    and ``cpu_min_at_pilot_m`` (the seeds ``effect`` needs at the pilot's m) and, at the pilot's own minimal
    detectable difference (``pilot_mdd``), the cheapest design reaching it (``m_at_pilot_mdd``, ``n_at_pilot_mdd``,
    ``cpu_min_at_pilot_mdd``). These use the components' sd at m, sqrt(between + 2 within / m): the observed sd at
    the pilot's m unless between was floored at 0 (then ``seeds_for_80``, on the observed sd, can be fewer). ``sequential`` (the runs' declared ``analysis.sequential``): the group-sequential
    design's power, expected seeds and chance of having stopped by each look at ``effect``
    (:func:`mlmlab.stats.sequential_design`; equivalence stops within the margin ``delta``) at the pilot's m
    (``seq_power``, ``seq_expected_seeds``, ``seq_stop_by_look``) and at ``m_opt`` (``..._at_m_opt``)."""
    if not (isinstance(effect, (int, float)) and math.isfinite(effect) and effect > 0):
        raise ValueError(f"effect={effect!r} must be a difference > 0 in {metric}'s units (0.01 = 1 point of accuracy)")
    values = pd.to_numeric(df[metric], errors="coerce").dropna() if metric in df.columns else pd.Series(dtype=float)
    if len(values) and values.between(0, 1).all() and effect >= 0.5:
        raise ValueError(f"effect={effect:g} is on the wrong scale: {metric} lies in [0, 1] (the pilot's runs: "
                         f"{values.min():.3g} to {values.max():.3g}); give it in the metric's units, 0.01 = 1 point")
    std_col = f"{metric}_std" if f"{metric}_std" in df.columns else None
    m_ft = _finetune_seeds(df)
    rows = []
    base = _per_seed(df, by, baseline, metric, pair_on)
    base_ft = _per_finetune_seed(df, by, baseline, metric, pair_on)
    for value in sorted(set(df[by]) - {baseline}, key=str):
        arm = _per_seed(df, by, value, metric, pair_on)
        common = sorted(set(arm.index) & set(base.index))
        d = (arm[common] - base[common]).to_numpy()
        if len(d) < 2:
            raise ValueError(f"the pilot pairs {len(d)} pretraining seed(s) ({pair_on}) of {by}={value} with "
                             f"{by}={baseline} on {metric}; a plan needs >= 2 (the sd over pretraining seeds)")
        iv = stats.mean_interval(d)
        c, source = _plan_components(base_ft, _per_finetune_seed(df, by, value, metric, pair_on), common, m_ft)
        within = []
        if c is None:
            within = df[df[by].isin([baseline, value])][std_col].dropna().tolist() if std_col and m_ft > 1 else []
            c, source = stats.components(d, within, m_ft), (f"{metric}_std" if within else "none")
        has_within = source != "none"
        lo, hi = stats.sd_interval(iv.sd, iv.n)
        n_obs = stats.seeds_for_power(effect, iv.sd, power, alpha)
        n_hi = stats.seeds_for_power(effect, hi, power, alpha)
        n_more_ft = stats.seeds_for_power(effect, c.unit_sd(2 * m_ft), power, alpha) if has_within else None
        row = {"arm": value, "pilot_seeds": iv.n, "diff": iv.mean, "sd": iv.sd, "sd_low": lo, "sd_high": hi,
               "between_sd": math.sqrt(c.between) if c.between == c.between else math.nan,
               "finetune_sd": math.sqrt(c.within) if has_within else math.nan, "finetune_seeds": m_ft,
               "effect": effect, "seeds_for_80": n_obs, "seeds_for_80_at_sd_high": n_hi,
               f"seeds_for_80_with_{2 * m_ft}_finetune_seeds": n_more_ft,
               "between": c.between, "within": c.within if has_within else math.nan, "components_from": source}
        costs = unit_costs(df[df[by].isin([baseline, value])], by, baseline, metric, pair_on, all_runs=df)
        row.update(costs)
        row.update(_allocation_columns(c, costs, effect, iv, m_ft, power, alpha, m_max, has_within))
        row.update(_sequential_columns(sequential, effect, iv.sd, row.get("sd_opt", math.nan), alpha, delta))
        rows.append(row)
    return pd.DataFrame(rows).set_index("arm")


def _per_finetune_seed(df: pd.DataFrame, by: str, value, metric: str, pair_on: str) -> pd.DataFrame:
    """The metric's per-fine-tuning-seed values (``<stem>/seed_<s>/<name>`` of ``<stem>/<name>``) of the arm
    ``by == value``: one row per ``pair_on`` value, one column per fine-tuning seed (empty where not logged)."""
    import re

    stem, _, name = metric.rpartition("/")
    pat = re.compile(rf"{re.escape(stem)}/seed_([^/]+)/{re.escape(name)}")
    cols = {c: m.group(1) for c in df.columns if (m := pat.fullmatch(c))}
    if not stem or not cols:
        return pd.DataFrame()
    part = df.loc[df[by] == value, [pair_on, *cols]]
    return part.groupby(pair_on)[list(cols)].mean().rename(columns=cols)


def _plan_components(base_ft: pd.DataFrame, arm_ft: pd.DataFrame, common: list, m_ft: int):
    """The paired components from the per-fine-tuning-seed values where both arms have every one of the ``m_ft``
    fine-tuning seeds for each of the ``common`` pretraining seeds (else None: the caller uses ``_std``)."""
    if base_ft.empty or arm_ft.empty or m_ft < 2 or len(common) < 2:
        return None, None
    seeds = [s for s in base_ft.columns if s in arm_ft.columns]
    if len(seeds) != m_ft or not set(common) <= set(base_ft.index) & set(arm_ft.index):
        return None, None
    diff = arm_ft.loc[common, seeds].to_numpy(dtype=float) - base_ft.loc[common, seeds].to_numpy(dtype=float)
    if not math.isfinite(diff.sum()):
        return None, None
    return stats.paired_components(diff), "finetune seeds (paired)"


def _allocation_columns(c: stats.Components, costs: dict, effect: float, iv: stats.Interval, m_ft: int,
                        power: float, alpha: float, m_max: int, has_within: bool) -> dict:
    """The allocation columns of :func:`plan_table` (NaN where the components or the costs are missing)."""
    c_p, c_ft, c_sh = costs["c_pretrain_s"], costs["c_finetune_s"], costs["c_comparator_s"]
    out = {"m_star": math.nan, "m_opt": None, "n_opt": None, "sd_opt": math.nan, "power_opt": math.nan,
           "cpu_min_opt": math.nan, "pilot_cpu_min_model": math.nan, "n_at_pilot_m": None,
           "cpu_min_at_pilot_m": math.nan, "pilot_mdd": math.nan, "m_at_pilot_mdd": None, "n_at_pilot_mdd": None,
           "cpu_min_at_pilot_mdd": math.nan}
    if not (has_within and math.isfinite(c.between) and c_p > 0 and c_ft > 0 and math.isfinite(c_sh)):
        return out
    a = stats.allocation(c.between, c.within, c_p, c_ft, effect, alpha, power, m_max, c_sh)
    # the pilot's m on the same model as the allocation (the observed sd, unless between was floored at 0)
    n_pilot_m = stats.seeds_for_power(effect, c.unit_sd(m_ft), power, alpha)
    out.update(m_star=a.m_star, m_opt=a.m, n_opt=a.n, sd_opt=a.sd, power_opt=a.power, cpu_min_opt=a.cost / 60,
               pilot_cpu_min_model=stats.design_cost(iv.n, m_ft, c_p, c_ft, c_sh) / 60, n_at_pilot_m=n_pilot_m,
               cpu_min_at_pilot_m=stats.design_cost(n_pilot_m, m_ft, c_p, c_ft, c_sh) / 60,
               pilot_mdd=stats.mdd(c.unit_sd(m_ft), iv.n, alpha, power))
    if math.isfinite(out["pilot_mdd"]):
        same = stats.allocation(c.between, c.within, c_p, c_ft, out["pilot_mdd"], alpha, power, m_max, c_sh)
        out.update(m_at_pilot_mdd=same.m, n_at_pilot_mdd=same.n, cpu_min_at_pilot_mdd=same.cost / 60)
    return out


def _sequential_columns(plan: stats.SequentialPlan | None, effect: float, sd: float, sd_opt: float, alpha: float,
                        delta: float | None) -> dict:
    """The declared sequential rule's power, expected seeds and chance of having stopped by each look at ``effect``
    (:func:`mlmlab.stats.sequential_design`, equivalence stops within ``delta``) with the pilot's per-seed sd and
    with the allocation's; empty without a declared rule."""
    if plan is None or not plan.enabled:
        return {}
    out = {"seq_looks": ",".join(map(str, plan.looks())), "seq_spending": plan.spending}
    for suffix, s in (("", sd), ("_at_m_opt", sd_opt)):
        r = stats.sequential_design(plan.looks(), effect, s, alpha=alpha, kind=plan.spending, delta=delta)
        out[f"seq_power{suffix}"], out[f"seq_expected_seeds{suffix}"] = r.power, r.expected_seeds
        out[f"seq_stop_by_look{suffix}"] = ",".join(f"{p:.2f}" for p in r.stop_by_look)
    return out


def unit_costs(runs: pd.DataFrame, by: str, baseline, metric: str, pair_on: str = "seed",
               all_runs: pd.DataFrame | None = None) -> dict:
    """What one unit of a paired design costs, from the runs' recorded timings (``timings.*``, results.json
    ``timings_s``; seconds, medians over runs so that one slow job does not set the price):

    * ``c_pretrain_s``: one pretraining seed, both arms -- per run, everything but fine-tuning (``total`` less every
      ``finetune*`` timer: data, pretraining, evaluation), the median of the baseline's runs plus that of the arm's;
    * ``c_finetune_s``: one fine-tuning run -- per run, ``timings.finetune`` divided by the fine-tuning runs it did:
      the (task key, fine-tuning seed) pairs of its ``downstream/<key>/seed_<s>/...`` values (task x label budget x
      seed) times its learning rates (``downstream.finetune.lr``; every lr of a grid is fine-tuned); from the config
      (tasks x budgets x seeds x lrs) where no per-seed value was recorded. A job that fine-tuned several label
      budgets gives their mean run, more than a run at the smaller budget costs;
    * ``c_comparator_s``: one random-init run, once per pretraining seed for every arm (cached and shared) -- where
      the metric has a ``random_init/`` row: per pretraining seed, the largest ``timings.finetune_random_init`` per
      run among that seed's runs (``all_runs``; the job that computed the row: the others waited for it or read it
      from the cache), the median over seeds; 0 without one;
    * ``pilot_cpu_min_spent``: the summed ``timings.total`` of ``runs``, in minutes (CPU-minutes for one-core jobs).
    """
    nan = math.nan
    out = {"c_pretrain_s": nan, "c_finetune_s": nan, "c_comparator_s": 0.0, "pilot_cpu_min_spent": nan}
    if "timings.total" not in runs.columns or runs.empty:
        return out
    ft_timers = [c for c in runs.columns if c.startswith("timings.finetune")]
    enc = runs["timings.total"] - runs[ft_timers].fillna(0).sum(axis=1)
    meds = [enc[runs[by] == v].median() for v in (baseline, *sorted(set(runs[by]) - {baseline}, key=str))]
    out["c_pretrain_s"] = float(sum(meds)) if len(meds) == 2 else nan
    out["pilot_cpu_min_spent"] = float(runs["timings.total"].sum()) / 60
    if "timings.finetune" in runs.columns:
        out["c_finetune_s"] = float((runs["timings.finetune"] / _runs_done(runs, "downstream")).median())
    head, _, rest = metric.partition("/")
    src = runs if all_runs is None else all_runs
    if head in ("downstream", "gain") and f"random_init/{rest}" in src.columns \
            and "timings.finetune_random_init" in src.columns:
        per_run = src["timings.finetune_random_init"] / _runs_done(src, "random_init")
        per_seed = per_run.groupby(src[pair_on]).max().dropna()
        out["c_comparator_s"] = float(per_seed.median()) if len(per_seed) else 0.0
    return out


def _runs_done(runs: pd.DataFrame, prefix: str) -> pd.Series:
    """Per run: the fine-tuning runs its ``<prefix>/<key>/seed_<s>/<name>`` values show (distinct key and seed)
    times its learning rates; the config's count (tasks x budgets x seeds x lrs) where none was recorded. NaN: 0."""
    import re

    pat = re.compile(rf"{re.escape(prefix)}/(.+)/seed_([^/]+)/[^/]+")
    groups: dict[tuple[str, str], list[str]] = {}
    for c in runs.columns:
        if m := pat.fullmatch(c):
            groups.setdefault((m.group(1), m.group(2)), []).append(c)
    done = sum((runs[cols].notna().any(axis=1).astype(int) for cols in groups.values()),
               pd.Series(0, index=runs.index))

    def count(v) -> int:
        return len(v) if isinstance(v, (list, tuple)) else (0 if v is None or v != v else 1)

    lrs = runs["downstream.finetune.lr"].map(lambda v: count(v) or 1) if "downstream.finetune.lr" in runs else 1
    if "downstream.tasks" in runs and "downstream.seeds" in runs:
        budgets = runs["downstream.max_train_examples"].map(lambda v: max(1, count(v) if isinstance(v, (list, tuple))
                                                                          else 1)) \
            if "downstream.max_train_examples" in runs else 1
        configured = runs["downstream.tasks"].map(count) * budgets * runs["downstream.seeds"].map(count)
        done = done.where(done > 0, configured)
    return (done * lrs).where(done > 0)


def _finetune_seeds(df: pd.DataFrame) -> int:
    col = "downstream.seeds"
    if col in df.columns and len(df):
        v = df[col].dropna()
        if len(v):
            return len(v.iloc[0]) if isinstance(v.iloc[0], (list, tuple)) else 1
    return 1
