"""Allocation (issue 52): pretraining seeds vs fine-tuning seeds per encoder at the least cost for a target power
(mlmlab.stats.allocation), the variance components it takes from a pilot whose arms share their fine-tuning seeds
(stats.paired_components), and the plan the CLI prints from a committed sweep's records (verdicts.plan_table)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from mlmlab import analysis as A
from mlmlab import stats

ROOT = Path(__file__).resolve().parents[1]
FAST_RATES = ROOT / "docs" / "results" / "real_en_fast_rates"


def _sd(between, within, m):
    return math.sqrt(between + 2 * within / m)


def test_allocation_is_the_cheapest_integer_design_and_its_n_is_exact():
    between, within, c_p, c_ft, c_sh = 0.42e-4, 2.30e-4, 550.0, 10.0, 10.0
    a = stats.allocation(between, within, c_p, c_ft, 0.01, c_shared=c_sh, m_max=40)
    assert a.m_star == pytest.approx(math.sqrt(c_p / (c_ft + c_sh / 2) * within / between))
    assert stats.allocation(between, within, c_p, c_ft, 0.01).m_star == pytest.approx(
        math.sqrt(c_p / c_ft * within / between))  # the classic formula without a shared comparator
    # n: the exact noncentral-t seeds at that m (power reached at n, not at n - 1)
    assert a.n == stats.seeds_for_power(0.01, _sd(between, within, a.m))
    assert a.power >= 0.8 > stats.power(0.01, a.sd, a.n - 1)
    # the cost is the least over every m (brute force), and no more than rounding m* alone gives
    costs = {m: stats.design_cost(stats.seeds_for_power(0.01, _sd(between, within, m)), m, c_p, c_ft, c_sh)
             for m in range(1, 41)}
    assert a.cost == min(costs.values()) and costs[a.m] == a.cost
    assert a.cost <= costs[round(a.m_star)]
    assert (round(a.m_star), stats.seeds_for_power(0.01, _sd(between, within, round(a.m_star))),
            costs[round(a.m_star)]) in a.checked
    assert stats.design_cost(3, 5, 100, 2, 1) == 3 * (100 + 5 * 5) and stats.design_cost(None, 5, 1, 1) == math.inf


def test_allocation_edges():
    capped = stats.allocation(0.0, 1e-4, 500, 10, 0.01, m_max=16)  # no between-seed variance: m* is infinite
    assert capped.m_star == math.inf and 1 <= capped.m <= 16
    cheap_ft = stats.allocation(1e-4, 1e-8, 500, 10, 0.01)  # no fine-tuning noise: one fine-tuning seed
    assert cheap_ft.m == 1
    for bad in ((float("nan"), 1e-4, 500, 10), (1e-4, 1e-4, 0, 10), (0.0, 0.0, 500, 10)):
        with pytest.raises(ValueError):
            stats.allocation(*bad, 0.01)


def test_paired_components_recover_between_and_within():
    rng = np.random.default_rng(7)
    n, m, between, within = 4000, 5, 0.5, 2.0
    # a fine-tuning seed shared by the arms: part of its effect cancels in the difference (correlation 0.3)
    shared = rng.normal(0, math.sqrt(0.3 * within), (n, m))
    a = shared + rng.normal(0, math.sqrt(0.7 * within), (n, m))
    b = shared + rng.normal(0, math.sqrt(0.7 * within), (n, m))
    d = rng.normal(0, math.sqrt(between), (n, 1)) + a - b
    c = stats.paired_components(d)
    eff = 0.7 * within  # one run's variance net of what the shared seed cancels
    # standard errors of the two moment estimates (normal data): within from n (m - 1) df, the total from n - 1
    se_w = eff * math.sqrt(2 / (n * (m - 1)))
    total = between + 2 * eff / m
    se_b = math.sqrt((total * math.sqrt(2 / (n - 1))) ** 2 + (2 * se_w / m) ** 2)
    assert abs(c.within - eff) < 4 * se_w and abs(c.between - between) < 4 * se_b
    assert c.unit_sd() == pytest.approx(_sd(c.between, c.within, m))
    with pytest.raises(ValueError):
        stats.paired_components([1.0, 2.0])


def test_plan_of_the_committed_fast_rates_sweep(capsys):
    """The issue's acceptance line: the variance components, the unit costs from the records, the allocation and the
    sequential design's power, checked against what the records say."""
    rc = A.main(["plan", str(FAST_RATES), "by=mask.rate", "baseline=0.15", "effect=0.01"])
    out = capsys.readouterr().out
    assert rc == 0
    for words in ("variance components (finetune seeds (paired))", "between (pretraining seed x arm) 0.42 pt^2",
                  "within (one fine-tuning run) 2.30 pt^2", "unit costs from the records", "allocation for 0.01",
                  "188 CPU-min spent", "sequential rule (pocock spending, looks at"):
        assert words in out, words
    df = A.load_runs(FAST_RATES)
    t = A.plan(df, "mask.rate", 0.15, "downstream/sst2@500/acc", 0.01, question=A.declared_question(df))
    r = t.loc[0.4]
    # the components add up to the observed variance of the per-seed difference at the pilot's 5 fine-tuning seeds
    assert r["between"] + 2 * r["within"] / 5 == pytest.approx(r["sd"] ** 2)
    assert r["pilot_cpu_min_spent"] == pytest.approx(df["timings.total"].sum() / 60)
    # one fine-tuning run: the job's fine-tuning time over its 10 runs (1 task x 2 budgets x 5 seeds x 1 lr)
    assert r["c_finetune_s"] == pytest.approx((df["timings.finetune"] / 10).median())
    assert r["c_pretrain_s"] == pytest.approx(sum(
        (df["timings.total"] - df["timings.finetune"] - df["timings.finetune_random_init"])[df["mask.rate"] == v].median()
        for v in (0.15, 0.4)))
    a = stats.allocation(r["between"], r["within"], r["c_pretrain_s"], r["c_finetune_s"], 0.01,
                         c_shared=r["c_comparator_s"])
    assert (r["m_opt"], r["n_opt"], r["cpu_min_opt"]) == (a.m, a.n, pytest.approx(a.cost / 60))
    assert r["cpu_min_opt"] <= r["cpu_min_at_pilot_m"]  # never dearer than the pilot's m for the same power
    assert 0 < r["seq_power"] < 1 and 2 <= r["seq_expected_seeds"] <= 8
