"""Plots of a sweep: a metric against an axis with 95% bands over seeds, label-budget curves, training curves."""

from __future__ import annotations

import pandas as pd

from mlmlab.runs import NoRunsError
from mlmlab.tables import DEFAULT_METRIC, _columns, aggregate


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
