"""Every interval, test, multiplicity adjustment, power computation and verdict of mlmlab (numpy and scipy only).

The unit of replication is the **pretraining seed**: a comparison of two arms pairs them on the pretraining seed and
its test and interval are over pretraining seeds (a paired t on the per-seed values -- each seed's mean over its
fine-tuning seeds and items --, exact under normality at any number of seeds). Everything finer is conditional on the
encoders that happened to be trained:

* :func:`paired_t` / :func:`mean_interval` -- the t interval and p-value over pretraining seeds (what decides);
* :func:`bootstrap` -- a (hierarchical) percentile bootstrap over pretraining seeds, fine-tuning seeds and items
  (items crossed with seeds and resampled once per replicate, in clusters where they come in groups: BLiMP by
  paradigm). With ``levels=("item",)`` it is the per-item interval *given* the trained encoders: shown, labelled as
  conditional, never a verdict. ``tests/test_stats.py`` measures both by simulation: the t interval over seeds holds
  95% at 3 and 8 seeds; the item-only interval does not, and neither does a percentile bootstrap over 3 seeds;
* :func:`holm` -- Holm's step-down adjustment within a question's family;
* :func:`power`, :func:`seeds_for_power`, :func:`mdd` -- exact power of the paired t from the noncentral t, and the
  minimal detectable difference with the uncertainty of the sd it uses (:func:`mdd_range`);
* :func:`sequential` -- a group-sequential paired t over pretraining seeds added in rounds (Lan-DeMets alpha spending,
  boundaries calibrated on the pivotal null law of the look statistics) that ends a question as soon as it is settled;
* :func:`verdict` -- the fixed rules that turn the numbers into the words the README prints.

Nothing else in mlmlab computes an interval or a p-value.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import integrate, optimize
from scipy import stats as st

ALPHA = 0.05

# --------------------------------------------------------------------------------------------------- t intervals


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` units with its t interval (``half`` = half-width; nan below 2 units) and, for a difference,
    the two-sided t-test p-value against 0."""
    mean: float
    sd: float
    n: int
    half: float
    p: float = float("nan")
    level: float = 0.95

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half


def t_half_width(sd: float, n: int, level: float = 0.95) -> float:
    """Half-width of the t interval of a mean of ``n`` values with sample std ``sd`` (nan below 2 values)."""
    if n < 2 or not math.isfinite(sd):
        return float("nan")
    return float(st.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n))


def mean_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean, sample std (0 for one value), t half-width and the one-sample t-test p against 0 (nan when sd is 0)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return Interval(float("nan"), float("nan"), 0, float("nan"), level=level)
    mean = float(x.mean())
    sd = float(x.std(ddof=1)) if n > 1 else 0.0
    p = float(2 * st.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1)) if n > 1 and sd > 0 else float("nan")
    return Interval(mean, sd, n, t_half_width(sd, n, level) if n > 1 else float("nan"), p, level)


def paired_t(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval:
    """``a - b`` paired element by element (the same pretraining seed, or the same fine-tuning seed): the mean
    difference, its t interval and the paired t-test p (= scipy.stats.ttest_rel)."""
    if len(a) != len(b):
        raise ValueError(f"paired_t: {len(a)} vs {len(b)} values; pair them first")
    return mean_interval(np.asarray(a, dtype=float) - np.asarray(b, dtype=float), level)


def tost_p(values: Sequence[float], delta: float) -> float:
    """Two one-sided t-tests of equivalence within ``±delta``: the larger one-sided p (small = equivalent)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2 or not delta or delta <= 0:
        return float("nan")
    se = x.std(ddof=1) / math.sqrt(n)
    if se == 0:
        return 0.0 if abs(x.mean()) < delta else 1.0
    lower = st.t.sf((x.mean() + delta) / se, n - 1)  # H0: diff <= -delta
    upper = st.t.cdf((x.mean() - delta) / se, n - 1)  # H0: diff >= +delta
    return float(max(lower, upper))


# ------------------------------------------------------------------------------------------------- multiplicity


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control under any dependence); nan stays nan and does
    not count towards the family's size."""
    p = np.asarray(pvalues, dtype=float)
    ok = np.flatnonzero(~np.isnan(p))
    out = np.full(len(p), np.nan)
    m = len(ok)
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return [float(v) for v in out]


# ------------------------------------------------------------------------------------------------------- power


def power(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Exact power of the two-sided one-sample (paired) t-test of ``n`` units at a true mean ``effect`` with unit std
    ``sd``: the noncentral t with noncentrality ``effect * sqrt(n) / sd``."""
    if n < 2 or not sd > 0:
        return float("nan")
    df, nc = n - 1, abs(effect) * math.sqrt(n) / sd
    c = st.t.ppf(1 - alpha / 2, df)
    out = float(st.nct.sf(c, df, nc) + st.nct.cdf(-c, df, nc))
    if math.isfinite(out):
        return out
    if nc > c + 40:  # far beyond the critical value: the miss probability is below 1e-300 in double precision
        return 1.0
    # scipy's nct gives nan far in the tail at 1-2 degrees of freedom: the same probability as an integral over the
    # chi-square law of the variance, P(|Z + nc| > c sqrt(V / df)) (the two agree to 1e-12 where both are finite)
    def given(v: float) -> float:
        s = c * math.sqrt(v / df)
        return (st.norm.sf(s - nc) + st.norm.cdf(-s - nc)) * st.chi2.pdf(v, df)

    return float(integrate.quad(given, 0, np.inf, limit=200)[0])


def seeds_for_power(effect: float, sd: float, target: float = 0.8, alpha: float = ALPHA, n_max: int = 1000) -> int | None:
    """The smallest number of pretraining seeds whose paired t reaches ``target`` power (None above ``n_max``). Power
    rises with n (df and noncentrality both grow): doubling n from 2 until it reaches the target, then bisecting the
    last doubling, finds it in ~2 log2(n) evaluations instead of n (never probing far above the answer, where scipy's
    noncentral t loses accuracy)."""
    if not (sd > 0 and effect):
        return None
    lo, hi = 1, 2  # power(lo) below the target (n < 2: no test); grow hi until power(hi) reaches it
    while not power(effect, sd, hi, alpha) >= target:  # (a nan power counts as below)
        if hi >= n_max:
            return None
        lo, hi = hi, min(2 * hi, n_max)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if power(effect, sd, mid, alpha) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def mdd(sd: float, n: int, alpha: float = ALPHA, target: float = 0.8) -> float:
    """Minimal detectable difference: the true effect the two-sided paired t of ``n`` units detects with ``target``
    power, given the units' std ``sd`` -- solved on the exact noncentral t (the usual (t_a + t_b) sd / sqrt(n) is 5%
    too small at n = 3 and 16% at n = 2)."""
    if n < 2 or not (math.isfinite(sd) and sd > 0):
        return float("nan")
    hi = (st.t.ppf(1 - alpha / 2, n - 1) + st.t.ppf(target, n - 1)) * sd / math.sqrt(n)  # the usual approximation
    while power(hi, sd, n, alpha) < target:  # it is a little small: widen until the bracket holds the root
        hi *= 2
    return float(optimize.brentq(lambda d: power(d, sd, n, alpha) - target, 1e-12 * sd, hi, xtol=1e-12 * hi))


def sd_interval(sd: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """The chi-square confidence interval of a normal std estimated from ``n`` values."""
    if n < 2 or not math.isfinite(sd):
        return float("nan"), float("nan")
    df = n - 1
    return (float(sd * math.sqrt(df / st.chi2.ppf(0.5 + level / 2, df))),
            float(sd * math.sqrt(df / st.chi2.ppf(0.5 - level / 2, df))))


@dataclass(frozen=True)
class MDD:
    """The minimal detectable difference at the observed sd, and at the ends of that sd's 95% interval."""
    value: float
    low: float
    high: float


def mdd_range(sd: float, n: int, alpha: float = ALPHA, target: float = 0.8) -> MDD:
    lo, hi = sd_interval(sd, n)
    return MDD(mdd(sd, n, alpha, target), mdd(lo, n, alpha, target), mdd(hi, n, alpha, target))


@dataclass(frozen=True)
class Components:
    """Variance components of a paired comparison: ``between`` (the per-seed difference's variance that is not
    fine-tuning noise: pretraining seed x arm), ``within`` (one fine-tuning run's variance, pooled), and the
    fine-tuning seeds per arm ``m`` the pilot used."""
    between: float
    within: float
    m: int
    n: int

    def unit_sd(self, m: int | None = None) -> float:
        """The std of one seed's paired difference with ``m`` fine-tuning seeds per arm."""
        m = m or self.m
        return math.sqrt(self.between + 2 * self.within / m)


def components(diffs: Sequence[float], within_sds: Sequence[float] = (), m: int = 1) -> Components:
    """From a pilot: the per-seed paired differences ``diffs`` and the fine-tuning-seed std of each run
    ``within_sds`` (both arms, ``m`` fine-tuning seeds each). Var(diff) = between + 2 within / m (method of moments,
    between floored at 0)."""
    d = np.asarray(diffs, dtype=float)
    total = float(d.var(ddof=1)) if len(d) > 1 else float("nan")
    w = np.asarray([s for s in within_sds if s is not None and math.isfinite(s)], dtype=float)
    within = float(np.mean(w ** 2)) if len(w) and m > 1 else 0.0
    return Components(max(0.0, total - 2 * within / m) if math.isfinite(total) else float("nan"), within, m, len(d))


# --------------------------------------------------------------------------------------------------- bootstrap


def bootstrap(x, clusters: Sequence | None = None, levels: Sequence[str] = ("seed", "finetune", "item"),
              level: float = 0.95, n_resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the grand mean of ``x``, shape (pretraining seeds, fine-tuning seeds, items)
    (a per-item difference between two arms, paired on both seeds). ``levels`` are resampled: pretraining seeds with
    replacement, then fine-tuning seeds within each, and items -- crossed with the seeds (the same test set), so one
    item resample per replicate -- in ``clusters`` (one label per item; BLiMP: its paradigm) where given.
    ``levels=("item",)`` is the interval conditional on the trained encoders. NaN items (ties) are ignored."""
    x = np.asarray(x, dtype=float)
    if x.ndim != 3:
        raise ValueError(f"bootstrap: x has shape {x.shape}; expected (seeds, fine-tuning seeds, items)")
    unknown = set(levels) - {"seed", "finetune", "item"}
    if unknown:
        raise ValueError(f"bootstrap: levels {sorted(unknown)}; allowed: seed, finetune, item")
    rng = np.random.default_rng(seed)
    S, F, n_items = x.shape
    valid = ~np.isnan(x)
    labels = np.arange(n_items) if clusters is None else np.unique(np.asarray(clusters), return_inverse=True)[1]
    k = int(labels.max()) + 1 if n_items else 0
    # per fine-tuned model and cluster: the sum and count of its (non-tie) item values
    cs = np.zeros((S * F, k))
    cc = np.zeros((S * F, k))
    np.add.at(cs.T, labels, np.where(valid, x, 0.0).reshape(S * F, n_items).T)
    np.add.at(cc.T, labels, valid.reshape(S * F, n_items).T.astype(float))
    chunk = max(1, int(2e7 // max(1, k * S * F)))  # resamples per block: bounded memory on large item sets
    reps = []
    for start in range(0, n_resamples, chunk):
        B = min(chunk, n_resamples - start)
        if "item" in levels:
            idx = rng.integers(0, k, size=(B, k))  # clusters drawn with replacement, the same for every model
            sums, counts = cs[:, idx].sum(-1), cc[:, idx].sum(-1)  # (S*F, B)
        else:
            sums, counts = cs.sum(1, keepdims=True), cc.sum(1, keepdims=True)
        m = (sums / np.where(counts > 0, counts, np.nan)).reshape(S, F, -1)
        m = np.broadcast_to(m, (S, F, B)) if m.shape[2] == 1 else m
        b = np.arange(B)
        si = rng.integers(0, S, size=(B, S)) if "seed" in levels else np.broadcast_to(np.arange(S), (B, S))
        fi = (rng.integers(0, F, size=(B, S, F)) if "finetune" in levels
              else np.broadcast_to(np.arange(F), (B, S, F)))
        with np.errstate(all="ignore"):
            reps.append(np.nanmean(m[si[:, :, None], fi, b[:, None, None]], axis=(1, 2)))
    reps = np.concatenate(reps)
    lo, hi = np.nanpercentile(reps, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def mcnemar(a: Sequence[int | None], b: Sequence[int | None]) -> dict:
    """Exact McNemar test of two classifiers on the same items (1 right, 0 wrong, None a tie, dropped): the
    discordant counts ``a_only`` / ``b_only`` under a two-sided binomial test. Conditional on the two models."""
    n10 = sum(1 for x, y in zip(a, b) if x == 1 and y == 0)
    n01 = sum(1 for x, y in zip(a, b) if x == 0 and y == 1)
    n = n10 + n01
    return {"a_only": n10, "b_only": n01, "p": float(st.binomtest(n10, n, 0.5).pvalue) if n else 1.0}


# -------------------------------------------------------------------------------------------------- sequential

SPENDING = ("pocock", "obrien_fleming")


def spent(t: float, alpha: float = ALPHA, kind: str = "pocock") -> float:
    """Lan-DeMets spending functions: the type-I error spent by information fraction ``t`` (0-1)."""
    if kind == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    if kind == "obrien_fleming":
        return 2 * (1 - st.norm.cdf(st.norm.ppf(1 - alpha / 2) / math.sqrt(t))) if t > 0 else 0.0
    raise ValueError(f"spending={kind!r}; allowed: {', '.join(SPENDING)}")


@functools.lru_cache(maxsize=64)
def boundaries(looks: tuple[int, ...], alpha: float = ALPHA, kind: str = "pocock", draws: int = 200_000) -> tuple[float, ...]:
    """Critical |t| at each look (number of pretraining seeds at that look) of a two-sided group-sequential paired t.
    The t statistics of normal data are scale-free, so their joint null law is fixed by the look sizes: it is drawn
    here (seeded, ``draws`` simulated sweeps) and each look's boundary set so that the chance of crossing by that look
    is the spending function's (Lan-DeMets). Exact up to simulation error (about ±0.001 in alpha)."""
    if list(looks) != sorted(set(looks)) or looks[0] < 2:
        raise ValueError(f"looks={looks}: increasing seed counts, the first >= 2")
    rng = np.random.default_rng(12345)
    z = rng.standard_normal((draws, looks[-1]))
    alive = np.ones(draws, dtype=bool)
    out, done = [], 0.0
    for n in looks:
        x = z[:, :n]
        t = np.abs(x.mean(1) / (x.std(1, ddof=1) / math.sqrt(n)))
        target = spent(n / looks[-1], alpha, kind) - done  # the share of all sweeps that should first cross here
        k = int(round(target * draws))
        cand = np.sort(t[alive])[::-1]
        c = float(cand[k - 1]) if 0 < k <= len(cand) else float("inf")
        out.append(c)
        crossed = alive & (t >= c)
        done += crossed.sum() / draws
        alive &= ~crossed
    return tuple(out)


@dataclass
class SequentialPlan:
    """``analysis.sequential`` of a sweep: pretraining seeds added ``round`` at a time up to ``max_seeds`` (null: no
    sequential rule, the sweep's seeds as listed); the first look at ``first`` seeds (default: ``round``, at least
    2); ``spending``: the Lan-DeMets alpha-spending function."""
    max_seeds: int | None = None
    round: int = 2
    first: int | None = None
    spending: str = "pocock"

    def __post_init__(self):
        if self.spending not in SPENDING:
            raise ValueError(f"analysis.sequential.spending={self.spending!r}; allowed: {', '.join(SPENDING)}")
        if self.max_seeds is None:
            return
        if self.round < 1 or self.max_seeds < 2 or (self.first or 2) < 2 or (self.first or 0) > self.max_seeds:
            raise ValueError(f"analysis.sequential: round={self.round}, max_seeds={self.max_seeds}, "
                             f"first={self.first}; need round >= 1, 2 <= first <= max_seeds")

    @property
    def enabled(self) -> bool:
        return self.max_seeds is not None

    def looks(self) -> tuple[int, ...]:
        if self.max_seeds is None:
            raise ValueError("analysis.sequential.max_seeds is null: no sequential rule declared")
        first = self.first or max(2, self.round)
        seq = list(range(first, self.max_seeds + 1, self.round))
        return tuple(seq if seq[-1] == self.max_seeds else [*seq, self.max_seeds])


@dataclass(frozen=True)
class SequentialResult:
    verdict: str  # "better" | "worse" | "equivalent" | "continue" | "inconclusive"
    look: int  # 1-based look at which it ended (or the current one)
    n: int
    interval: Interval  # the look's interval, at the look's nominal level
    boundary: float


def sequential(diffs: Sequence[float], plan: SequentialPlan, delta: float | None = None,
               higher_is_better: bool = True, alpha: float = ALPHA) -> SequentialResult:
    """Run the group-sequential paired t over ``diffs`` (arm minus baseline per pretraining seed, in the order the
    seeds were run) and return the first decision: ``better`` / ``worse`` (the look's interval excludes 0, the
    boundary at that look), ``equivalent`` (the look's interval lies within ``±delta``), ``continue`` (the data end
    before the last look) or ``inconclusive`` (the last look reached undecided)."""
    looks = plan.looks()
    bounds = boundaries(looks, alpha, plan.spending)
    d = np.asarray(diffs, dtype=float)
    result = None
    for k, (n, c) in enumerate(zip(looks, bounds), start=1):
        if len(d) < n:
            break
        x = d[:n]
        sd = float(x.std(ddof=1))
        mean = float(x.mean())
        half = c * sd / math.sqrt(n)
        level = 1 - 2 * float(st.t.sf(c, n - 1)) if math.isfinite(c) else 1.0
        iv = Interval(mean, sd, n, half, float(2 * st.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1)) if sd > 0 else 0.0,
                      level)
        result = SequentialResult("continue", k, n, iv, c)
        if iv.low > 0 or iv.high < 0:
            up = iv.low > 0
            return SequentialResult("better" if up == higher_is_better else "worse", k, n, iv, c)
        if delta and -delta < iv.low and iv.high < delta:
            return SequentialResult("equivalent", k, n, iv, c)
        if k == len(looks):
            return SequentialResult("inconclusive", k, n, iv, c)
    if result is None:
        return SequentialResult("continue", 0, len(d), mean_interval(d), float("nan"))
    return result


# ----------------------------------------------------------------------------------------------------- verdicts


@dataclass
class Question:
    """``analysis:`` of a sweep file (the schema of the ``analysis`` config group, and of a report table's question):
    what the sweep asks, declared before it runs -- the primary metric the verdict is on, the family of metrics
    adjusted together with it (Holm; the primary is always in it; every other metric is exploratory), the equivalence
    margin on the primary metric's scale (0.01 = 1 point of accuracy), alpha, and optionally the sequential rule."""
    primary: str | None = None
    family: list[str] = field(default_factory=list)
    delta: float | None = None
    alpha: float = ALPHA
    sequential: SequentialPlan = field(default_factory=SequentialPlan)

    def __post_init__(self):
        if self.delta is not None and not self.delta > 0:
            raise ValueError(f"analysis.delta={self.delta}; allowed: a margin > 0 (or null)")
        if not 0 < self.alpha < 1:
            raise ValueError(f"analysis.alpha={self.alpha}; allowed: (0, 1)")
        if self.family and self.primary is None:
            raise ValueError("analysis.family is set without analysis.primary; declare the primary metric")
        for key, m in [("primary", self.primary), *(("family", f) for f in self.family)]:
            if m is not None and "/" not in str(m):
                raise ValueError(f"analysis.{key}={m!r} is not a metric key; allowed: split/name keys such as "
                                 "downstream/sst2/acc or val/mlm_loss_r15")
        if self.sequential is None or isinstance(self.sequential, dict):
            self.sequential = SequentialPlan(**(self.sequential or {}))

    def metrics_family(self, asked: Sequence[str]) -> list[str]:
        """The family: the primary and the declared family; with nothing declared, every metric asked."""
        if self.primary is None:
            return list(asked)
        return list(dict.fromkeys([self.primary, *self.family]))



def higher_is_better(metric: str) -> bool:
    """A loss, perplexity or error is better lower; every other metric higher."""
    name = metric.rsplit("/", 1)[-1].lower()
    return not any(w in name for w in ("loss", "ppl", "perplexity", "error"))


@dataclass(frozen=True)
class Verdict:
    """A comparison's decision by the fixed rules of :func:`verdict`, with what it rests on."""
    word: str  # "<arm> better" | "<baseline> better" | "equivalent within ±delta" | "inconclusive" | "not in a regime..."
    diff: Interval
    p: float
    p_adj: float
    p_equiv: float
    n: int


NOT_PAYING = "not in a regime where pretraining pays"


def verdict(diff: Interval, p_adj: float, p_equiv_adj: float = float("nan"), arm: str = "arm",
            baseline: str = "baseline", metric: str = "", delta: float | None = None, alpha: float = ALPHA,
            pays: bool | None = True) -> str:
    """The verdict of one comparison on pretraining seeds, from its family-adjusted p-values:
    ``pays`` False (the baseline arm does not beat random init on this metric) -> "not in a regime where pretraining
    pays"; Holm-adjusted paired-t p < alpha -> "<the better arm> better"; Holm-adjusted equivalence (TOST) p < alpha
    -> "equivalent within ±delta"; otherwise "inconclusive at <n> seeds"."""
    if pays is False:
        return NOT_PAYING
    if diff.n >= 2 and p_adj < alpha:
        up = diff.mean > 0
        return f"{arm if up == higher_is_better(metric) else baseline} better"
    if delta and diff.n >= 2 and p_equiv_adj < alpha:
        return f"equivalent within ±{delta:g}"
    return f"inconclusive at {diff.n} seeds"


def pays(gains: Sequence[float], level: float = 0.95) -> bool | None:
    """Whether an arm beats random init over its pretraining seeds: the t interval of its per-seed gains lies above 0
    (None below 2 seeds)."""
    iv = mean_interval(gains, level)
    return None if iv.n < 2 else bool(iv.low > 0)
