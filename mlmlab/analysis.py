"""The analysis CLI and the notebooks' one import: load a sweep (mlmlab.runs), tables and verdicts over seeds
(mlmlab.tables), plots (mlmlab.plots).

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

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from mlmlab.cli import BOOL, Opt
from mlmlab.cli import run as cli_run

# the notebooks' and scripts' names (``from mlmlab import analysis as A``: A.load_runs, A.plot_metric, A.question ...)
from mlmlab.plots import plot_history, plot_label_budget, plot_metric  # noqa: F401
from mlmlab.runs import NoRunsError, load_history, load_predictions, load_runs, read_wandb_offline, wandb_run_dirs  # noqa: F401, E501
from mlmlab.tables import (  # noqa: F401
    DEFAULT_METRIC,
    _columns,
    aggregate,
    compare,
    compare_items,
    declared_question,
    label_budget_curve,
    plan,
    question,
    select,
)

log = logging.getLogger(__name__)


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
    "ignore": Opt("config keys declared irrelevant to the comparison (a key, or a prefix: downstream.finetune); "
                  "runs that differ in any other key outside by and pair_on are refused", many=True),
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




def _plan_main(a) -> int:
    try:
        df = load_runs([a.source, *(a.also or [])])
        declared = declared_question(df)
        metric = a.metric or declared.primary or DEFAULT_METRIC
        table = plan(df, a.by, _cli_value(a.baseline, df[_columns(df, a.by)[0]]), metric, a.effect, a.pair_on,
                     a.power, declared)
    except (NoRunsError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
        print(f"plan from the pilot {a.source}: {metric}, {a.by} against {a.baseline}, a true difference of "
              f"{a.effect:g} at {a.power:.0%} power (two-sided paired t over pretraining seeds, alpha "
              f"{declared.alpha:g})")
        print(table.T.to_string())
    for arm, r in table.iterrows():
        print(f"\n{a.by}={arm} against {a.baseline}:")
        print("\n".join(f"  {line}" for line in _plan_lines(r, a.effect, a.power)))
    return 0


def _plan_lines(r: pd.Series, effect: float, power: float) -> list[str]:
    """One arm's plan in words (:func:`mlmlab.verdicts.plan_table`'s columns); variances in points squared (1 pt =
    0.01 of the metric: a point of accuracy)."""
    pt2 = lambda v: f"{v * 1e4:.2f} pt^2"  # noqa: E731
    m = int(r["finetune_seeds"])
    out = [f"variance components ({r['components_from']}): between (pretraining seed x arm) {pt2(r['between'])}, "
           f"within (one fine-tuning run) {pt2(r['within'])}; a seed's difference at m fine-tuning seeds per encoder "
           f"has variance between + 2 within / m ({pt2(r['sd'] ** 2)} at the pilot's m = {m})"]
    if r["c_pretrain_s"] == r["c_pretrain_s"]:
        out.append(f"unit costs from the records (medians over runs): a pretraining seed, both arms (all but "
                   f"fine-tuning) {r['c_pretrain_s']:.0f} s; a fine-tuning run {r['c_finetune_s']:.1f} s"
                   + (f"; a random-init run {r['c_comparator_s']:.1f} s, once per pretraining seed"
                      if r["c_comparator_s"] else ""))
    if r["m_opt"] is None or r["m_opt"] != r["m_opt"]:
        out.append("allocation: needs the fine-tuning variance and the runs' timings (results.json timings_s)")
    else:
        out.append(f"allocation for {effect:g} at {power:.0%} power: m* = {r['m_star']:.1f} -> {int(r['m_opt'])} "
                   f"fine-tuning seeds per encoder and {_count(r['n_opt'])} pretraining seeds (power "
                   f"{r['power_opt']:.2f}): {r['cpu_min_opt']:.0f} CPU-min")
        out.append(f"the pilot's design, {r['pilot_seeds']} seeds x {m} fine-tuning seeds: {r['pilot_cpu_min_spent']:.0f} "
                   f"CPU-min spent (the records' timings), {r['pilot_cpu_min_model']:.0f} at these unit costs; at {m} "
                   f"fine-tuning seeds {effect:g} needs {_count(r['n_at_pilot_m'])} seeds: "
                   f"{r['cpu_min_at_pilot_m']:.0f} CPU-min")
        if r["m_at_pilot_mdd"] is not None and r["m_at_pilot_mdd"] == r["m_at_pilot_mdd"]:
            out.append(f"the pilot's minimal detectable difference, {r['pilot_mdd']:.4g}, costs "
                       f"{r['cpu_min_at_pilot_mdd']:.0f} CPU-min at {_count(r['n_at_pilot_mdd'])} seeds x "
                       f"{int(r['m_at_pilot_mdd'])} fine-tuning seeds")
    if "seq_power" in r.index and isinstance(r.get("seq_looks"), str):
        out.append(f"sequential rule ({r['seq_spending']} spending, looks at {r['seq_looks']} seeds) at {effect:g}: "
                   f"power {r['seq_power']:.2f}, expected seeds {r['seq_expected_seeds']:.1f} (stopped by each look: "
                   f"{r['seq_stop_by_look']}) at the pilot's {m} fine-tuning seeds"
                   + (f"; power {r['seq_power_at_m_opt']:.2f}, expected seeds {r['seq_expected_seeds_at_m_opt']:.1f} at "
                      f"{int(r['m_opt'])}" if r["m_opt"] is not None and r["m_opt"] == r["m_opt"] else ""))
    return out


def _count(n) -> str:
    return "more than 1000" if n is None or n != n else str(int(n))


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
        failed = df[~df["status"].isin(["ok", "running"])]
        running = list(dict.fromkeys([*df.attrs.get("running", []), *df.loc[df["status"] == "running", "run_dir"]]))
        if running:  # a sweep still running: its live jobs are neither results nor failures
            print(f"{len(running)} running run(s), left out: {', '.join(Path(d).name for d in running)}")
        if len(failed):
            print(f"{len(failed)} failed run(s):")
            for _, r in failed.iterrows():
                print(f"  {r['run_dir']}: {r.get('error', r['status'])}")
        if not (df["status"] == "ok").any():
            return 0
        _columns(df, [*a.by, *a.metric])  # dict-valued and "a - b" columns added to df itself, before any filtering
        table = aggregate(df[df["status"] == "ok"], a.by, a.metric)
        comparison = None
        if a.baseline is not None:
            base = _cli_value(a.baseline, df[a.by[0]])
            declared = declared_question(df, a.primary, a.family, a.delta)
            metrics = list(dict.fromkeys([*a.metric, *declared.metrics_family(a.metric)]))
            ok = df[df["status"] == "ok"]
            others = sorted(set(ok[a.by[0]]) - {base}, key=str)
            if not others:  # only the baseline has finished (a sweep in its first round)
                raise ValueError(f"no finished run of an arm besides the baseline {a.by[0]}={a.baseline} yet "
                                 f"({len(ok)} finished, {len(running)} running); nothing to compare")
            comparison = question(df, a.by[0], base, metrics, declared, pair_on=a.pair_on, ignore=a.ignore or ())
            for metric, runs in comparison.attrs.get("missing", {}).items():  # each would drop a seed unnamed
                print(f"warning: {len(runs)} finished run(s) lack {metric}, left out of its pairs: {', '.join(runs)}",
                      file=sys.stderr)
    except (NoRunsError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 160, "display.max_columns", 50, "display.float_format", "{:.4f}".format):
        left_out = [f"{df.attrs[k]} {what}" for k, what in (("n_skipped", "unreadable"), ("n_failed", "failed"),
                                                             ("n_running", "running")) if df.attrs.get(k)]
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
                          f"{r.look} ({r.n} seeds; {r.interval.mean:+.4f}, repeated {1 - declared.alpha:.0%} CI "
                          f"[{r.interval.low:+.4f}, {r.interval.high:+.4f}] at level {r.interval.level:.4f}; "
                          f"stagewise-ordering p {r.p_stagewise:.3g}, repeated p {r.p_repeated:.3g})")
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
