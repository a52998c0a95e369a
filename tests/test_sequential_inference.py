"""Sequential inference that matches the design (mlmlab.stats, section "sequential"): the repeated confidence interval
(RCI) at the stopping look, the stagewise-ordering and repeated p-values, the design's power and expected seeds
through the same boundaries, and the first look at ``min_seeds``. Tolerances are Monte-Carlo standard errors of the
simulated sweeps (binomial: sqrt(p (1 - p) / R))."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

from mlmlab import rounds, stats
from mlmlab.analysis import declared_question, load_runs
from mlmlab.stats import Question, SequentialPlan

PLAN = SequentialPlan(max_seeds=8, round=2)  # looks at 4, 6, 8 seeds
MANY = SequentialPlan(max_seeds=10, round=1)  # looks at 4, 5, ..., 10 seeds: optional stopping bites harder
PUBLISHED = ROOT / "docs" / "results" / "real_en_fast_rates"


def se(p: float, r: int) -> float:
    return math.sqrt(p * (1 - p) / r)


def published_diffs() -> list[float]:
    """The published sweep's per-seed differences on its primary: arm 0.4 minus 0.15, seeds 0..7 in order."""
    def value(rate, s):
        return json.loads((PUBLISHED / f"{rate}_s{s}" / "results.json").read_text())["metrics"][
            "downstream/sst2@500/acc"]
    return [value(0.4, s) - value(0.15, s) for s in range(8)]


@pytest.mark.parametrize("plan", [PLAN, MANY], ids=["looks_4_6_8", "looks_4_to_10"])
def test_the_rci_at_the_stopping_look_covers_the_true_difference_and_the_null_rarely_calls_a_winner(plan):
    """2,000 sweeps under the null and 2,000 at a true difference of 1 sd: the interval a decision reports at the look
    it stopped (or the last look) covers the truth in >= 95% of sweeps, and the null calls a winner in <= 5% (both up
    to 3 Monte-Carlo standard errors). The fixed-n t interval at the same looks covers the truth less often under
    the null (optional stopping); computed here beside it, it must fall short of the RCI."""
    from scipy import stats as st

    R = 2000
    for effect in (0.0, 1.0):
        rng = np.random.default_rng(11 if effect else 12)
        covered = naive = called = 0
        for _ in range(R):
            r = stats.sequential(rng.normal(effect, 1.0, plan.max_seeds), plan)
            iv = r.interval
            covered += iv.low <= effect <= iv.high
            fixed = st.t.ppf(0.975, r.n - 1) * iv.sd / math.sqrt(r.n)
            naive += iv.mean - fixed <= effect <= iv.mean + fixed
            called += r.verdict in ("better", "worse")
        assert covered / R >= 0.95 - 3 * se(0.95, R), (effect, covered / R)
        if effect == 0.0:
            assert called / R <= 0.05 + 3 * se(0.05, R), called / R
            assert naive < covered  # the RCI is wider than the fixed-n interval, as it has to be after looking


def test_stagewise_p_is_a_valid_p_and_agrees_with_the_rule():
    """4,000 null sweeps: P(p_stagewise <= u) <= u (up to 3 MC SE) at u = 0.05, 0.2, 0.5; p_stagewise <= alpha exactly
    when the rule crossed (at alpha 0.05 and 0.1); at the last look it is at least what the earlier looks spent."""
    R = 4000
    rng = np.random.default_rng(21)
    data = rng.normal(0.0, 1.0, (R, PLAN.max_seeds))
    for alpha in (0.05, 0.1):
        res = [stats.sequential(d, PLAN, alpha=alpha) for d in data]
        p = np.array([r.p_stagewise for r in res])
        decided = np.array([r.verdict in ("better", "worse") for r in res])
        assert not np.isnan(p).any()  # every null sweep crosses or reaches the last look (no margin declared)
        assert ((p <= alpha) == decided).all()
        for u in (0.05, 0.2, 0.5):
            assert np.mean(p <= u) <= u + 3 * se(u, R), (alpha, u, np.mean(p <= u))
        last = np.array([r.look == len(PLAN.looks()) for r in res])
        spent_before = stats.spent(PLAN.looks()[-2] / PLAN.looks()[-1], alpha)
        assert (p[last] >= spent_before - 1e-4).all()
        assert np.mean(p <= 0.5) >= 0.5 - 4 * se(0.5, R)  # and not a p that is never small (uniform under the null)
    # the look statistic itself: at the first look with no earlier crossing, the p is the t law's own two-sided tail
    t = 2.0
    assert stats.stagewise_p(PLAN.looks(), 1, t) == pytest.approx(2 * stats.st.t.sf(t, 3), abs=0.004)


def test_repeated_p_is_the_smallest_alpha_whose_rci_excludes_zero():
    looks = PLAN.looks()
    ts = np.linspace(1.0, 9.0, 60)
    for look in (1, 2, 3):
        p = stats.repeated_p(looks, look, ts)
        for a in (0.01, 0.05, 0.1, 0.3):
            excludes = ts >= stats.boundaries(looks, a)[look - 1]
            clear = np.abs(np.log(p / a)) > 0.01  # away from the interpolation's tolerance
            assert ((p <= a) == excludes)[clear].all(), (look, a)
        exact = stats.repeated_p(looks, look, ts[::12], bisect=True)
        assert np.allclose(p[::12], exact, rtol=0.02)  # (at p ~ 1e-3 the simulated law itself is coarser than that)
    # a sweep that runs on: no final (stagewise) p yet, but its RCI and repeated p hold at the current look
    r = stats.sequential([0.1, -0.3, 0.2, 0.4, 0.0], PLAN)
    assert r.verdict == "continue" and r.look == 1 and math.isnan(r.p_stagewise)
    assert r.p_repeated == pytest.approx(stats.repeated_p(PLAN.looks(), 1, r.t), rel=1e-9) and r.p_repeated > 0.05
    eq = stats.sequential([0.001, -0.001, 0.0005, -0.0004], PLAN, delta=0.01)
    assert eq.verdict == "equivalent" and math.isnan(eq.p_stagewise) and eq.p_repeated > 0.05


def test_design_power_matches_the_rule_and_a_single_look_is_the_noncentral_t():
    """sequential_design's power and expected seeds against 2,000 sweeps run through sequential() (with and
    without an equivalence margin), within Monte-Carlo error; at a single look its power is power()'s noncentral t;
    with several looks it is lower than the fixed-n power at the last look's seeds."""
    R = 2000
    for effect, delta in ((1.0, None), (0.6, 0.5)):
        d = stats.sequential_design(PLAN.looks(), effect, 1.0, delta=delta)
        rng = np.random.default_rng(31)
        res = [stats.sequential(rng.normal(effect, 1.0, 8), PLAN, delta=delta) for _ in range(R)]
        right = np.mean([r.verdict == "better" for r in res])
        tol = 3 * math.sqrt(d.power * (1 - d.power) * (1 / R + 1 / 20_000))
        assert abs(d.power - right) <= tol, (effect, delta, d.power, right)
        seeds = np.array([r.n for r in res], dtype=float)
        assert abs(d.expected_seeds - seeds.mean()) <= 3 * seeds.std() * math.sqrt(1 / R + 1 / 20_000)
        first = np.mean([r.look == 1 and r.verdict != "inconclusive" for r in res])
        assert abs(d.stop_by_look[0] - first) <= 3 * math.sqrt(first * (1 - first) * (1 / R + 1 / 20_000)) + 1e-3
        assert d.stop_by_look == tuple(sorted(d.stop_by_look)) and d.looks == PLAN.looks()
    assert stats.sequential_design(PLAN.looks(), 1.0, 1.0).power < stats.power(1.0, 1.0, 8) - 0.1
    one = stats.sequential_design((6,), 1.0, 1.0, draws=50_000)
    fixed = stats.power(1.0, 1.0, 6)
    assert abs(one.power - fixed) <= 4 * se(fixed, 50_000), (one.power, fixed)
    assert one.expected_seeds == 6.0 and one.power <= one.stop_by_look[0] <= one.power + 1e-3  # + wrong-sign calls
    null = stats.sequential_design(PLAN.looks(), 0.0, 1.0, draws=50_000)
    assert abs(null.power - 0.05) <= 4 * se(0.05, 50_000)  # at no effect: the type-I error
    assert math.isnan(stats.sequential_design(PLAN.looks(), 1.0, float("nan")).power)


def test_min_seeds_sets_the_first_look_and_old_records_keep_their_looks(cfg_factory):
    from mlmlab.config import ConfigError, validate

    assert SequentialPlan(max_seeds=8, round=2).looks() == (4, 6, 8)
    assert SequentialPlan(max_seeds=8, round=2, min_seeds=2).looks() == (2, 4, 6, 8)
    assert SequentialPlan(max_seeds=3, round=2).looks() == (3,)  # capped at max_seeds
    assert SequentialPlan(max_seeds=8, round=3, first=5).looks() == (5, 8)
    with pytest.raises(ValueError, match=r"analysis.sequential.min_seeds=1; allowed: an integer >= 2"):
        SequentialPlan(max_seeds=8, min_seeds=1)
    with pytest.raises(ConfigError, match="analysis.sequential.min_seeds"):
        validate(cfg_factory("analysis.sequential.max_seeds=8", "analysis.sequential.min_seeds=1"))
    legacy = {"analysis.primary": "downstream/score", "analysis.sequential.max_seeds": 8,
              "analysis.sequential.round": 2, "analysis.sequential.first": None, "analysis.sequential.spending": "pocock"}
    assert declared_question(pd.DataFrame([legacy])).sequential.looks() == (2, 4, 6, 8)
    now = {**legacy, "analysis.sequential.min_seeds": 4}
    assert declared_question(pd.DataFrame([now])).sequential.looks() == (4, 6, 8)
    # the published sweep was run before min_seeds: its records rebuild its looks
    assert declared_question(load_runs(PUBLISHED)).sequential.looks() == (2, 4, 6, 8)


def test_the_published_sweep_reanalysed_gives_its_decision_with_sequential_inference(tmp_path):
    q = declared_question(load_runs(PUBLISHED))
    r = stats.sequential(published_diffs(), q.sequential, q.delta, True, q.alpha)
    s = json.loads((PUBLISHED / "sequential.json").read_text())["arms"][0]
    assert (r.verdict, r.look, r.n) == ("better", 4, 8) and r.boundary == pytest.approx(3.2216, abs=1e-4)
    assert (r.interval.low, r.interval.high) == pytest.approx((s["low"], s["high"]), abs=1e-12)
    assert (r.interval.low, r.interval.high) == pytest.approx((0.0051, 0.0314), abs=1e-4)
    assert r.p_stagewise == pytest.approx(0.042, abs=0.001) and r.interval.p == r.p_stagewise
    assert r.p_repeated == pytest.approx(0.012, abs=0.001)
    assert r.p_stagewise > stats.mean_interval(published_diffs()).p  # not the fixed-n p, which ignores the looks
    # rounds writes and prints them
    p = rounds.plan([], {"mask.rate": ["0.15", "0.4"]}, Question(primary="downstream/sst2@500/acc", delta=0.01,
                                                                  sequential={"max_seeds": 8, "round": 2,
                                                                              "min_seeds": 2}))
    cont = stats.sequential(published_diffs()[:4], q.sequential, q.delta)
    state = rounds.state(p, 3, {1: (4, r)}, 16)
    arm = state["arms"][0]
    assert (arm["t"], arm["p_stagewise"], arm["p_repeated"]) == (r.t, r.p_stagewise, r.p_repeated)
    text = rounds.describe(state)
    assert "repeated 95% CI [+0.0051, +0.0314]" in text
    assert f"stagewise-ordering p = {r.p_stagewise:.3g}" in text and f"repeated p = {r.p_repeated:.3g}" in text
    rounds.write_state(tmp_path, rounds.state(p, 1, {1: (2, cont)}, 8))  # still running: no stagewise p, valid JSON
    arm = json.loads((tmp_path / rounds.STATE).read_text(), parse_constant=lambda c: pytest.fail(c))["arms"][0]
    assert arm["verdict"] == "continue" and arm["p_stagewise"] is None and arm["p_repeated"] > 0
    assert "stagewise-ordering p = -" in rounds.describe(rounds.state(p, 1, {1: (2, cont)}, 8))
