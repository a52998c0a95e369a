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


def question_table(df: pd.DataFrame, by: str, baseline, metrics: Sequence[str], question: Question | None = None,
                   pair_on: str = "seed", names: dict | None = None) -> pd.DataFrame:
    """One row per (metric, arm) against ``baseline``, paired on ``pair_on``: n seeds, the two means, the difference
    with its t interval over seeds (``low``/``high``), raw and family-adjusted p (Holm), the equivalence test (TOST
    within ``delta``, adjusted alike), the minimal detectable difference at 80% power with the range its sd's 95%
    interval gives, the seeds 80% power needs at ``delta`` (or at the observed difference), each side's gain over
    random init over seeds where the metric has one, the role (primary / family / exploratory) and the verdict."""
    q = question or Question()
    metrics = list(metrics)
    if baseline not in set(df[by]):
        raise ValueError(f"baseline {by}={baseline!r} is not among the runs; present: {sorted(set(df[by]), key=str)}")
    family = q.metrics_family(metrics)
    missing = [m for m in family if m not in metrics]
    if missing:
        raise ValueError(f"the family's metrics {missing} are not among those compared ({metrics}); add them to metric=")
    name = (lambda v: str((names or {}).get(str(v), v)))  # noqa: E731
    rows = []
    for m in metrics:
        base = _per_seed(df, by, baseline, m, pair_on)
        g = gain_column(m)
        base_gain = _per_seed(df, by, baseline, g, pair_on)
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
                         "pays": stats.pays(base_gain.to_numpy()) if len(base_gain) else None})
    t = pd.DataFrame(rows)
    if t.empty:
        return t
    fam = t["role"] != "exploratory"
    t["p_holm"] = math.nan
    t["p_equiv_holm"] = math.nan
    t.loc[fam, "p_holm"] = stats.holm(t.loc[fam, "p"].tolist())
    t.loc[fam, "p_equiv_holm"] = stats.holm(t.loc[fam, "p_equiv"].tolist())
    t["verdict"] = [_word(r, q) for _, r in t.iterrows()]
    return t


def _gain(s: pd.Series) -> stats.Interval | None:
    return stats.mean_interval(s.to_numpy()) if len(s) else None


def _word(r: pd.Series, q: Question) -> str:
    if r["role"] == "exploratory":
        return "exploratory"
    iv = stats.Interval(r["diff"], r["sd"], int(r["n"]), r["high"] - r["diff"], r["p"])
    return stats.verdict(iv, r["p_holm"], r["p_equiv_holm"], arm=r["arm"], baseline=r["baseline"],
                         metric=r["metric"], delta=r["delta"] if r["delta"] == r["delta"] else None, alpha=q.alpha,
                         pays=r["pays"])


def sequential_verdict(df: pd.DataFrame, by: str, baseline, value, metric: str, question: Question,
                       pair_on: str = "seed") -> stats.SequentialResult:
    """The sequential rule on the primary metric: the per-seed differences in seed order (the order rounds ran)."""
    base, arm = (_per_seed(df, by, v, metric, pair_on) for v in (baseline, value))
    common = sorted(set(arm.index) & set(base.index))
    return stats.sequential((arm[common] - base[common]).to_numpy(), question.sequential, question.delta,
                            stats.higher_is_better(metric), question.alpha)


# ---------------------------------------------------------------------------------------------------------- plan


def plan_table(df: pd.DataFrame, by: str, baseline, metric: str, effect: float, pair_on: str = "seed",
               power: float = 0.8, alpha: float = stats.ALPHA) -> pd.DataFrame:
    """From a pilot sweep: per arm, the per-seed paired difference's sd (and its 95% range), its variance components
    (pretraining seed x arm vs fine-tuning noise, from ``<metric>_std`` of each run where the job logged it), and the
    pretraining seeds a paired t needs for ``power`` at a true difference ``effect``: at the observed sd, at the top
    of its 95% range (conservative), and with twice the fine-tuning seeds per arm."""
    std_col = f"{metric}_std" if f"{metric}_std" in df.columns else None
    m_ft = _finetune_seeds(df)
    rows = []
    base = _per_seed(df, by, baseline, metric, pair_on)
    for value in sorted(set(df[by]) - {baseline}, key=str):
        arm = _per_seed(df, by, value, metric, pair_on)
        common = sorted(set(arm.index) & set(base.index))
        d = (arm[common] - base[common]).to_numpy()
        iv = stats.mean_interval(d)
        within = df[df[by].isin([baseline, value])][std_col].dropna().tolist() if std_col and m_ft > 1 else []
        c = stats.components(d, within, m_ft)
        lo, hi = stats.sd_interval(iv.sd, iv.n)
        n_obs = stats.seeds_for_power(effect, iv.sd, power, alpha)
        n_hi = stats.seeds_for_power(effect, hi, power, alpha)
        n_more_ft = stats.seeds_for_power(effect, c.unit_sd(2 * m_ft), power, alpha) if within else None
        rows.append({"arm": value, "pilot_seeds": iv.n, "diff": iv.mean, "sd": iv.sd, "sd_low": lo, "sd_high": hi,
                     "between_sd": math.sqrt(c.between) if c.between == c.between else math.nan,
                     "finetune_sd": math.sqrt(c.within) if within else math.nan, "finetune_seeds": m_ft,
                     "effect": effect, "seeds_for_80": n_obs, "seeds_for_80_at_sd_high": n_hi,
                     f"seeds_for_80_with_{2 * m_ft}_finetune_seeds": n_more_ft})
    return pd.DataFrame(rows).set_index("arm")


def _finetune_seeds(df: pd.DataFrame) -> int:
    col = "downstream.seeds"
    if col in df.columns and len(df):
        v = df[col].dropna()
        if len(v):
            return len(v.iloc[0]) if isinstance(v.iloc[0], (list, tuple)) else 1
    return 1
