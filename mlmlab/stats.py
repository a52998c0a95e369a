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
  boundaries calibrated on the pivotal null law of the look statistics) that ends a question as soon as it is settled,
  with its sequential inference (the repeated confidence interval, the stagewise-ordering and repeated p-values) and,
  by :func:`sequential_design`, its power and expected seeds through the same boundaries;
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
CHANCE_MARGIN = 0.02  # the regime gate's default margin above the constant predictor (2 points of accuracy)

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


MULTIPLICITY = ("holm", "gatekeeping")


def adjust(p: Sequence[float], p_equiv: Sequence[float], primary: Sequence[bool], method: str = "holm",
           alpha: float = ALPHA) -> tuple[list[float], list[float]]:
    """Adjust every hypothesis of one question together (all arms x all baselines x the primary and family metrics):
    ``p`` (difference) and ``p_equiv`` (equivalence, nan where no margin) per hypothesis, ``primary`` whether it is on
    the primary metric. ``holm``: one Holm step-down over all of them (differences and equivalences each their own
    family of the same hypotheses). ``gatekeeping`` (serial): the primary hypotheses are Holm-adjusted among
    themselves at ``alpha``; the family's are tested (Holm among themselves) only if every primary hypothesis was
    decided (difference or equivalence adjusted p < alpha), else their adjusted p is 1. Both control the
    family-wise error over the question."""
    if method not in MULTIPLICITY:
        raise ValueError(f"multiplicity={method!r}; allowed: {', '.join(MULTIPLICITY)}")
    p, pe, prim = (np.asarray(x, dtype=float) for x in (p, p_equiv, primary))
    if method == "holm":
        return holm(p), holm(pe)
    out_p, out_e = np.full(len(p), np.nan), np.full(len(p), np.nan)
    first, rest = np.flatnonzero(prim.astype(bool)), np.flatnonzero(~prim.astype(bool))
    out_p[first], out_e[first] = holm(p[first]), holm(pe[first])
    decided = all((out_p[i] < alpha) or (out_e[i] < alpha) for i in first)
    if decided:
        out_p[rest], out_e[rest] = holm(p[rest]), holm(pe[rest])
    else:
        out_p[rest] = np.where(np.isnan(p[rest]), np.nan, 1.0)
        out_e[rest] = np.where(np.isnan(pe[rest]), np.nan, 1.0)
    return [float(v) for v in out_p], [float(v) for v in out_e]


# ------------------------------------------------------------------------------------------------------- power


def power(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Exact power of the two-sided one-sample (paired) t-test of ``n`` units at a true mean ``effect`` with unit std
    ``sd``: the noncentral t with noncentrality ``effect * sqrt(n) / sd``. Fixed-n: one look at ``n`` seeds. A
    question run by the sequential rule has the power of :func:`sequential_design` (the same at a single look, lower
    with several)."""
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


def paired_components(diffs) -> Components:
    """From a pilot whose two arms share their fine-tuning seeds: ``diffs``, shape (pretraining seeds, fine-tuning
    seeds), the arm minus the baseline at each fine-tuning seed of each pretraining seed. ``within`` = half the mean
    over pretraining seeds of the variance over fine-tuning seeds of these differences (one fine-tuning run's
    variance, net of what a shared fine-tuning seed cancels); ``between`` = Var(row means) - 2 within / m, floored at
    0 -- the same decomposition as :func:`components`, Var(diff) = between + 2 within / m."""
    d = np.asarray(diffs, dtype=float)
    if d.ndim != 2:
        raise ValueError(f"paired_components: diffs has shape {d.shape}; expected (pretraining seeds, fine-tuning seeds)")
    n, m = d.shape
    total = float(d.mean(1).var(ddof=1)) if n > 1 else float("nan")
    within = float(d.var(1, ddof=1).mean()) / 2 if m > 1 else 0.0
    return Components(max(0.0, total - 2 * within / m) if math.isfinite(total) else float("nan"), within, m, n)


def design_cost(n: int | None, m: int, c_pretrain: float, c_ft: float, c_shared: float = 0.0) -> float:
    """What a paired design costs: ``n`` pretraining seeds, each ``c_pretrain`` (both arms' encoders) plus ``m``
    fine-tuning seeds per encoder at ``c_ft`` a run, and ``m`` runs of ``c_shared`` once per pretraining seed (the
    random-init comparator, shared by the arms). inf when ``n`` is None (no n reaches the power)."""
    return math.inf if n is None else n * (c_pretrain + m * (2 * c_ft + c_shared))


@dataclass(frozen=True)
class Allocation:
    """The cost-optimal paired design for a target power at ``effect``: ``m`` fine-tuning seeds per encoder (the
    continuous optimum ``m_star`` rounded and checked against its neighbours), ``n`` pretraining seeds (None: above
    ``n_max`` at every m checked), the per-seed difference's ``sd`` at that m, the exact ``power`` at (n, m), the
    ``cost`` (:func:`design_cost`, the costs' unit) and each candidate checked as (m, n, cost)."""
    m_star: float
    m: int
    n: int | None
    sd: float
    power: float
    cost: float
    effect: float
    checked: tuple[tuple[int, int | None, float], ...] = ()


def allocation(between: float, within: float, c_pretrain: float, c_ft: float, effect: float, alpha: float = ALPHA,
               target: float = 0.8, m_max: int = 64, c_shared: float = 0.0, n_max: int = 1000) -> Allocation:
    """Pretraining seeds vs fine-tuning seeds per encoder at the least cost for ``target`` power at a true
    difference ``effect``, from the variance components of a pilot (``between``: pretraining seed x arm; ``within``:
    one fine-tuning run -- :func:`components`) and the unit costs (``c_pretrain``: one pretraining seed, both arms;
    ``c_ft``: one fine-tuning run; ``c_shared``: one run of the comparator, once per pretraining seed). A seed's
    difference has variance between + 2 within / m and costs c_pretrain + m (2 c_ft + c_shared); their product is
    least at the classic m* = sqrt(c_pretrain / (c_ft + c_shared / 2) * within / between) (inf when between is 0:
    capped at ``m_max``). Rounding m* is not enough -- n is an integer, so the cost steps and a neighbour of m* can
    be cheaper --: every m in 1..``m_max`` is given its exact n (:func:`seeds_for_power`, noncentral t) and the
    cheapest is kept (ties: fewer fine-tuning seeds); ``checked`` holds the integers around m* (floor - 1 .. ceil + 1)
    and the one kept."""
    if not (math.isfinite(between) and between >= 0 and math.isfinite(within) and within >= 0):
        raise ValueError(f"allocation: between={between}, within={within}; need finite variances >= 0")
    if not (c_pretrain > 0 and c_ft > 0 and c_shared >= 0):
        raise ValueError(f"allocation: costs c_pretrain={c_pretrain}, c_ft={c_ft}, c_shared={c_shared}; need > 0")
    if between == 0 and within == 0:
        raise ValueError("allocation: between and within are both 0; no variance to plan for")
    ratio = c_pretrain / (c_ft + c_shared / 2)
    m_star = math.inf if between == 0 else math.sqrt(ratio * within / between)
    k = min(max(m_star, 1.0), float(m_max))
    rows = []
    for m in range(1, m_max + 1):
        sd = math.sqrt(between + 2 * within / m)
        n = seeds_for_power(effect, sd, target, alpha, n_max)
        rows.append((m, n, design_cost(n, m, c_pretrain, c_ft, c_shared)))
    best = min(rows, key=lambda r: (r[2], r[0]))
    m, n, cost = best
    sd = math.sqrt(between + 2 * within / m)
    near = [r for r in rows if math.floor(k) - 1 <= r[0] <= math.ceil(k) + 1 or r == best]
    return Allocation(m_star, m, n, sd, power(effect, sd, n, alpha) if n else float("nan"), cost, effect, tuple(near))


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


@functools.lru_cache(maxsize=4)  # 20 bytes per draw and look: 16 MB for 4 looks at 200,000 draws
def _null_looks(looks: tuple[int, ...], draws: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The null law of the look statistics, drawn once per look sizes: |t| of the paired t at each look of ``draws``
    simulated sweeps of normal per-seed differences (seeded: :func:`boundaries`, :func:`stagewise_p` and
    :func:`repeated_p` read the same draws), shape (looks, draws); each look's draws in decreasing |t| (``order``);
    and minus those |t| in that order (ascending, for ``searchsorted``). The t statistics of normal data are
    scale-free, so this law is fixed by the look sizes."""
    if list(looks) != sorted(set(looks)) or looks[0] < 2:
        raise ValueError(f"looks={looks}: increasing seed counts, the first >= 2")
    rng = np.random.default_rng(12345)
    z = rng.standard_normal((draws, looks[-1]))
    t = np.empty((len(looks), draws))
    for j, n in enumerate(looks):
        x = z[:, :n]
        t[j] = np.abs(x.mean(1) / (x.std(1, ddof=1) / math.sqrt(n)))
    order = np.argsort(-t, axis=1, kind="stable").astype(np.int32)
    neg = -np.take_along_axis(t, order, axis=1)
    for a in (t, order, neg):
        a.flags.writeable = False
    return t, order, neg


def _crossings(looks: tuple[int, ...], alpha: float, kind: str, draws: int) -> tuple[tuple[float, ...], np.ndarray]:
    """The boundaries at ``alpha`` and, per null draw, the look (0-based) at which it first crosses them (``len(looks)``
    if never). At each look the boundary is the k-th largest |t| among the draws that have not crossed yet, k the
    spending function's share of all draws less what earlier looks spent; found in a prefix of that look's draws in
    decreasing |t| (at most the draws already crossed lie above it), so a boundary costs O(k), not O(draws)."""
    t, order, _ = _null_looks(looks, draws)
    never = len(looks)
    first = np.full(draws, never, dtype=np.int16)
    out, done, crossed = [], 0.0, 0
    for j, n in enumerate(looks):
        k = int(round((spent(n / looks[-1], alpha, kind) - done) * draws))  # the draws that should first cross here
        c = float("inf")
        if 0 < k <= draws - crossed:
            top = order[j, :k + crossed]
            alive = first[top] == never
            i = int(np.searchsorted(np.cumsum(alive), k))  # the k-th draw not crossed yet
            c = float(t[j, top[i]])
            hit = top[:i + 1][alive[:i + 1]]  # |t| >= c among the alive (a continuous law: no ties)
            first[hit] = j
            crossed += len(hit)
            done += len(hit) / draws
        out.append(c)
    return tuple(out), first


@functools.lru_cache(maxsize=4096)
def boundaries(looks: tuple[int, ...], alpha: float = ALPHA, kind: str = "pocock", draws: int = 200_000) -> tuple[float, ...]:
    """Critical |t| at each look (number of pretraining seeds at that look) of a two-sided group-sequential paired t.
    The t statistics of normal data are scale-free, so their joint null law is fixed by the look sizes: it is drawn
    once (:func:`_null_looks`, seeded, ``draws`` simulated sweeps) and each look's boundary set so that the chance of
    crossing by that look is the spending function's (Lan-DeMets). Exact up to simulation error (about ±0.001 in
    alpha). The interval ``mean ± boundary * sd / sqrt(n)`` at a look is the repeated confidence interval (RCI): the
    intervals of all looks cover the true difference together with probability 1 - alpha."""
    return _crossings(tuple(looks), alpha, kind, draws)[0]


@functools.lru_cache(maxsize=16)
def _null_law(looks: tuple[int, ...], alpha: float, kind: str, draws: int) -> tuple[tuple[float, ...], np.ndarray]:
    """Per look: the count of null draws that crossed at an earlier look, then, along that look's draws in decreasing
    |t|, the running count of those that had not (shape (looks, draws + 1), a leading 0)."""
    _, first = _crossings(looks, alpha, kind, draws)
    _, order, _ = _null_looks(looks, draws)
    before = tuple(int(np.count_nonzero(first < j)) for j in range(len(looks)))
    alive = np.zeros((len(looks), draws + 1), dtype=np.int32)
    for j in range(len(looks)):
        np.cumsum(first[order[j]] >= j, out=alive[j, 1:])
    alive.flags.writeable = False
    return before, alive


def stagewise_p(looks: Sequence[int], look: int, t, alpha: float = ALPHA, kind: str = "pocock",
                draws: int = 200_000):
    """The two-sided stagewise-ordering p-value of a sweep that ended at ``look`` (1-based) with paired t ``t`` (a
    number or an array): P_null(crossing the boundaries at ``alpha`` at an earlier look) + P_null(not crossed before
    ``look`` and |T_look| >= |t|), read off the same seeded null draws as :func:`boundaries`. It is at most ``alpha``
    exactly when the rule crossed at that look (up to 1/draws), and at the last look at least what the earlier looks
    spent. Defined where the sweep stopped by crossing or reached its last look; an equivalence stop is not ranked
    by this ordering (the boundaries ignore it) and a sweep still running has no final p."""
    looks = tuple(int(n) for n in looks)
    _, _, neg = _null_looks(looks, draws)
    before, alive = _null_law(looks, alpha, kind, draws)
    j = look - 1
    a = np.abs(np.asarray(t, dtype=float))
    count = np.searchsorted(neg[j], -a, side="right")  # the draws with |T_look| >= |t|
    p = (before[j] + alive[j, count]) / draws
    p = np.where(np.isnan(a), np.nan, p)
    return float(p) if p.ndim == 0 else p


_ALPHA_GRID = np.linspace(math.log(1e-7), 0.0, 481)  # log alpha: the nodes of repeated_p's table (ratio 1.034)


@functools.lru_cache(maxsize=16)
def _repeated_table(looks: tuple[int, ...], kind: str, draws: int) -> np.ndarray:
    """The boundary at each look (rows) for each alpha of ``_ALPHA_GRID`` (columns), non-increasing in alpha."""
    c = np.array([_crossings(looks, float(math.exp(x)), kind, draws)[0] for x in _ALPHA_GRID]).T
    c = np.minimum.accumulate(c, axis=1)  # monotone as it should be (a simulated law may wiggle by a draw)
    c.flags.writeable = False
    return c


def repeated_p(looks: Sequence[int], look: int, t, kind: str = "pocock", draws: int = 200_000, bisect: bool = False):
    """The repeated p-value at ``look`` (1-based) of a paired t ``t`` (a number or an array): the smallest alpha at
    which the repeated confidence interval at that look, ``mean ± boundaries(looks, alpha)[look - 1] * sd /
    sqrt(n)``, excludes 0. Valid at any look, whether or not the sweep stopped there (the RCIs of all looks hold
    together). The boundary falls as alpha grows; it is tabulated once per looks and spending at 481 alphas from 1e-7
    to 1 (log-spaced, cached; 0.1-0.6 s once) and the p interpolated in log alpha between the two nodes around |t|
    (within 0.5% of the bisection above p = 0.01, 2% below it: less than the simulation error of the boundaries
    themselves; ``bisect=True``: bisection over log alpha on the boundary itself, to 1e-6, about 10 ms a value). 1
    where no alpha <= 1 excludes 0; 1e-7 is the smallest value it reports."""
    looks = tuple(int(n) for n in looks)
    a = np.abs(np.asarray(t, dtype=float))
    if bisect:
        p = np.vectorize(lambda v: _repeated_bisect(looks, look, float(v), kind, draws), otypes=[float])(a)
        return float(p) if p.ndim == 0 else p
    c = _repeated_table(looks, kind, draws)[look - 1]
    i = np.searchsorted(-c, -a, side="left")  # the first node whose boundary is <= |t|
    lo, hi = np.maximum(i - 1, 0), np.minimum(i, len(c) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.where(np.isfinite(c[lo]) & (i > 0), (c[lo] - a) / (c[lo] - c[hi]), 1.0)
    p = np.exp(_ALPHA_GRID[lo] + np.clip(w, 0.0, 1.0) * (_ALPHA_GRID[hi] - _ALPHA_GRID[lo]))
    p = np.where(i >= len(c), 1.0, np.where(np.isnan(a), np.nan, p))
    return float(p) if p.ndim == 0 else p


def _repeated_bisect(looks: tuple[int, ...], look: int, a: float, kind: str, draws: int, tol: float = 1e-6) -> float:
    if math.isnan(a):
        return float("nan")

    def excludes(log_alpha: float) -> bool:
        return _crossings(looks, math.exp(log_alpha), kind, draws)[0][look - 1] <= a

    lo, hi = float(_ALPHA_GRID[0]), 0.0
    if not excludes(hi):
        return 1.0
    if excludes(lo):
        return math.exp(lo)
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if excludes(mid) else (mid, hi)
    return math.exp(hi)


@dataclass
class SequentialPlan:
    """``analysis.sequential`` of a sweep: pretraining seeds added ``round`` at a time up to ``max_seeds`` (null: no
    sequential rule, the sweep's seeds as listed); the first look at ``first`` seeds (default: ``round``) but never
    below ``min_seeds`` (capped at ``max_seeds``): a look at 2 seeds has a boundary of |t| ~ 35 under Pocock
    spending, so it practically never stops, yet spends alpha. ``spending``: the Lan-DeMets alpha-spending function.
    Records written before ``min_seeds`` existed ran with ``min_seeds=2`` (:func:`mlmlab.tables.declared_question`
    rebuilds that plan for them). ``replan``: a sweep folder whose ``sequential.json`` declares another plan is refused
    unless true, which records the change there (:func:`mlmlab.rounds.check_plan`); not part of the plan itself."""
    max_seeds: int | None = None
    round: int = 2
    first: int | None = None
    spending: str = "pocock"
    min_seeds: int = 4
    replan: bool = False  # true: re-run a sweep folder under a plan other than its sequential.json's, recorded there

    def __post_init__(self):
        if self.spending not in SPENDING:
            raise ValueError(f"analysis.sequential.spending={self.spending!r}; allowed: {', '.join(SPENDING)}")
        if not (isinstance(self.min_seeds, int) and self.min_seeds >= 2):
            raise ValueError(f"analysis.sequential.min_seeds={self.min_seeds}; allowed: an integer >= 2 (a t needs "
                             "2 seeds; 4 by default)")
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
        first = min(max(self.first or self.round, self.min_seeds), self.max_seeds)
        seq = list(range(first, self.max_seeds + 1, self.round))
        return tuple(seq if seq[-1] == self.max_seeds else [*seq, self.max_seeds])


@dataclass(frozen=True)
class SequentialResult:
    """Where the group-sequential rule stands on one arm: the ``verdict``, the ``look`` (1-based) and seeds ``n`` it
    ended at (or the current look), ``interval`` -- the repeated confidence interval (RCI) at that look,
    ``mean ± boundary * sd / sqrt(n)``, whose ``level`` is its nominal per-look level and whose ``p`` is the
    stagewise-ordering p (never a fixed-n p) --, the look's critical |t| ``boundary``, its paired t ``t`` (signed),
    ``p_stagewise`` (:func:`stagewise_p`; nan while the sweep continues or where it stopped for equivalence),
    ``p_repeated`` (:func:`repeated_p`: the smallest alpha whose RCI at this look excludes 0) and the plan's
    ``looks``."""
    verdict: str  # "better" | "worse" | "equivalent" | "continue" | "inconclusive"
    look: int  # 1-based look at which it ended (or the current one)
    n: int
    interval: Interval  # the repeated confidence interval at the look
    boundary: float
    t: float = float("nan")
    p_stagewise: float = float("nan")
    p_repeated: float = float("nan")
    looks: tuple[int, ...] = ()


def sequential(diffs: Sequence[float], plan: SequentialPlan, delta: float | None = None,
               higher_is_better: bool = True, alpha: float = ALPHA) -> SequentialResult:
    """Run the group-sequential paired t over ``diffs`` (arm minus baseline per pretraining seed, in the order the
    seeds were run) and return the first decision: ``better`` / ``worse`` (the repeated confidence interval at the
    look excludes 0: |t| >= the look's boundary), ``equivalent`` (the RCI lies within ``±delta``), ``continue`` (the
    data end before the last look) or ``inconclusive`` (the last look reached undecided). What a decision reports is
    sequential inference at ``alpha``: the RCI at the look it stopped, the stagewise-ordering p (final: defined at a
    crossing or at the last look) and the repeated p; the fixed-n t interval and p of the same seeds are not valid
    after looking, and are not returned."""
    looks = plan.looks()
    bounds = boundaries(looks, alpha, plan.spending)
    d = np.asarray(diffs, dtype=float)

    def at(k: int, verdict: str) -> SequentialResult:
        n, c = looks[k - 1], bounds[k - 1]
        x = d[:n]
        sd, mean = float(x.std(ddof=1)), float(x.mean())
        with np.errstate(divide="ignore", invalid="ignore"):
            t = float(np.float64(mean) / (sd / math.sqrt(n))) if mean or sd else 0.0
        final = verdict in ("better", "worse", "inconclusive")
        p_sw = stagewise_p(looks, k, t, alpha, plan.spending) if final else float("nan")
        level = 1 - 2 * float(st.t.sf(c, n - 1)) if math.isfinite(c) else 1.0
        iv = Interval(mean, sd, n, c * sd / math.sqrt(n), p_sw, level)
        p_rep = repeated_p(looks, k, t, plan.spending)
        if (p_rep <= alpha) != (abs(t) >= c):  # the table's interpolation on the wrong side of alpha: bisect
            p_rep = repeated_p(looks, k, t, plan.spending, bisect=True)
        return SequentialResult(verdict, k, n, iv, c, t, p_sw, p_rep, looks)

    last = 0
    for k, (n, c) in enumerate(zip(looks, bounds), start=1):
        if len(d) < n:
            break
        last = k
        x = d[:n]
        mean, half = float(x.mean()), c * float(x.std(ddof=1)) / math.sqrt(n)
        if mean - half > 0 or mean + half < 0:
            return at(k, "better" if (mean - half > 0) == higher_is_better else "worse")
        if delta and -delta < mean - half and mean + half < delta:
            return at(k, "equivalent")
        if k == len(looks):
            return at(k, "inconclusive")
    if last == 0:  # fewer seeds than the first look: nothing to infer yet
        iv = mean_interval(d)
        return SequentialResult("continue", 0, len(d), Interval(iv.mean, iv.sd, iv.n, float("nan")), float("nan"),
                                looks=looks)
    return at(last, "continue")


@dataclass(frozen=True)
class SequentialDesign:
    """The operating characteristics of a group-sequential rule at a true mean difference ``effect`` with per-seed
    sd ``sd``: ``power`` (the chance of a correct-sign better/worse decision; at ``effect`` 0, of any such call: the
    type-I error), ``expected_seeds`` (the mean number of pretraining seeds per arm the sweep runs), ``stop_by_look``
    (the chance it has stopped with a decision by each look; the last entry is the chance of any decision)."""
    power: float
    expected_seeds: float
    stop_by_look: tuple[float, ...]
    looks: tuple[int, ...]
    effect: float
    sd: float


def sequential_design(looks: Sequence[int], effect: float, sd: float, alpha: float = ALPHA, kind: str = "pocock",
                      draws: int = 20_000, seed: int = 0, delta: float | None = None) -> SequentialDesign:
    """Power and expected seeds of the group-sequential paired t (:func:`sequential`) at ``looks``, by seeded
    simulation of ``draws`` sweeps of normal per-seed differences (mean ``effect``, sd ``sd``) through the same
    boundaries (:func:`boundaries`); equivalence stops within ``±delta`` only where ``delta`` is given (they end a
    sweep early and can only lower the power). Its fixed-n counterpart is :func:`power`, the noncentral t of one
    look at ``n`` seeds: at a single look the two agree (up to Monte-Carlo error); with several looks the rule's
    power is lower than the fixed-n power at the last look's seeds (early looks spend part of alpha, and at a few
    seeds the t boundaries are steep: 0.51 against 0.68 at 1 sd with looks at 4, 6, 8 seeds, Pocock), and it runs
    fewer seeds on average where the effect is large. Planning a sequential question reads this, not
    :func:`power`, :func:`mdd` or :func:`seeds_for_power`. Monte-Carlo error: about
    sqrt(p (1 - p) / draws) (0.003 at 20,000 draws)."""
    looks = tuple(int(n) for n in looks)
    if not (math.isfinite(sd) and sd > 0 and math.isfinite(effect)):
        return SequentialDesign(float("nan"), float("nan"), (float("nan"),) * len(looks), looks, effect, sd)
    bounds = boundaries(looks, alpha, kind)
    x = np.random.default_rng(seed).normal(effect, sd, (draws, looks[-1]))
    code = np.zeros(draws, dtype=np.int8)  # 0 running, +1 an RCI above 0, -1 below, 2 equivalent
    stop = np.full(draws, len(looks))  # the look (0-based) it stopped at with a decision
    for j, (n, c) in enumerate(zip(looks, bounds)):
        m, s = x[:, :n].mean(1), x[:, :n].std(1, ddof=1)
        half = c * s / math.sqrt(n)
        run = code == 0
        up, down = run & (m - half > 0), run & (m + half < 0)
        eq = run & ~up & ~down & ((-delta < m - half) & (m + half < delta) if delta else False)
        code[up], code[down], code[eq] = 1, -1, 2
        stop[up | down | eq] = j
    power = np.mean(code == np.sign(effect)) if effect else np.mean(np.abs(code) == 1)
    n_run = np.asarray([*looks, looks[-1]])[stop]
    by_look = tuple(float(np.mean(stop <= j)) for j in range(len(looks)))
    return SequentialDesign(float(power), float(n_run.mean()), by_look, looks, effect, sd)


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
    multiplicity: str = "holm"  # holm: every hypothesis of the question together; gatekeeping: primary first
    chance_margin: float = CHANCE_MARGIN  # the gate: baseline and comparator above the constant predictor by this

    def __post_init__(self):
        if self.delta is not None and not self.delta > 0:
            raise ValueError(f"analysis.delta={self.delta}; allowed: a margin > 0 (or null)")
        if self.multiplicity not in MULTIPLICITY:
            raise ValueError(f"analysis.multiplicity={self.multiplicity!r}; allowed: {', '.join(MULTIPLICITY)}")
        if not (isinstance(self.chance_margin, (int, float)) and 0 <= self.chance_margin < 1):
            raise ValueError(f"analysis.chance_margin={self.chance_margin}; allowed: [0, 1) on the primary metric's "
                             "scale (0.02 = 2 points of accuracy)")
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
            pays: bool | None = True, reading: str | None = None) -> str:
    """The verdict of one comparison on pretraining seeds, from its question-adjusted p-values. The regime gate
    (:func:`gate`) comes first: ``reading`` "degenerate" -> "degenerate comparator at this label budget"; "hurts" ->
    "pretraining hurts here"; "not_paying" (or ``pays`` False) -> "not in a regime where pretraining pays";
    "arm_below" -> "<arm> did not learn (below random init)". Then the comparison: adjusted paired-t p < alpha ->
    "<the better arm> better"; adjusted equivalence (TOST) p < alpha -> "equivalent within ±delta"; otherwise
    "inconclusive at <n> seeds"."""
    if reading == "degenerate":
        return GATE_DEGENERATE
    if reading == "hurts":
        return GATE_HURTS
    if reading == "not_paying" or pays is False:
        return NOT_PAYING
    if reading == "arm_below":
        return f"{arm} did not learn (below random init)"
    if diff.n >= 2 and p_adj < alpha:
        up = diff.mean > 0
        return f"{arm if up == higher_is_better(metric) else baseline} better"
    if delta and diff.n >= 2 and p_equiv_adj < alpha:
        return f"equivalent within ±{delta:g}"
    return f"inconclusive at {diff.n} seeds"


def pays(gains: Sequence[float], threshold: float = 0.0, level: float = 0.95) -> bool | None:
    """**The** rule that says pretraining pays (the findings' regime gate and the time-to-pay tables both use it): the
    t interval over pretraining seeds of the per-seed gains over the comparator (random init, or the start of a
    continued pretraining) lies above ``threshold`` (None below 2 seeds). Each seed's own interval over its
    fine-tuning seeds is conditional on that encoder: shown as a description, never part of the rule."""
    iv = mean_interval(gains, level)
    return None if iv.n < 2 else bool(iv.low > threshold)


def hurts(gains: Sequence[float], level: float = 0.95) -> bool:
    """Pretraining hurts: the t interval over pretraining seeds of the per-seed gains lies below 0."""
    iv = mean_interval(gains, level)
    return iv.n >= 2 and bool(iv.high < 0)


def constant_predictor(counts: dict, metric: str) -> float:
    """The best score a constant predictor reaches on an evaluation set whose labels occur ``counts`` times (label ->
    count): accuracy = the majority class's share; macro-F1 = max over classes c of 2 p_c / (1 + p_c) / K (F1 of the
    predicted class, 0 for the other K - 1); an entity F1 (token tasks) = 0. ``metric``: acc | f1 | entity_f1 | ..."""
    name = metric.rsplit("/", 1)[-1]
    if name in ("entity_f1", "span_f1", "seqeval_f1"):
        return 0.0
    n = float(sum(counts.values()))
    if not n:
        return float("nan")
    share = max(counts.values()) / n
    if name == "acc":
        return share
    if name == "f1":
        return 2 * share / (1 + share) / len(counts)
    return float("nan")


GATE_DEGENERATE = "degenerate comparator at this label budget"
GATE_HURTS = "pretraining hurts here"
@dataclass(frozen=True)
class Floor:
    """One chance-floor check: ``what`` (the baseline arm or the comparator) on ``metric`` scores ``value`` (its mean
    over pretraining seeds) against the constant predictor's ``floor``; it passes at ``floor + margin`` or above."""
    what: str
    metric: str
    value: float
    floor: float
    margin: float

    @property
    def passed(self) -> bool:
        return bool(self.value >= self.floor + self.margin) if math.isfinite(self.floor) else True


def gate(baseline_gains: Sequence[float], arm_gains: Sequence[float] = (), floors: Sequence[Floor] = ()) -> str | None:
    """The regime gate of one comparison, on the metric the question is decided on, in this order:

    1. the baseline arm or the comparator (random init / the start) does not beat the constant (majority-class)
       predictor by the declared margin on the metric (and on macro-F1 where the task has one): ``"degenerate"``;
    2. the baseline's gains over the comparator lie below 0 over pretraining seeds: ``"hurts"``;
    3. the baseline does not pay (:func:`pays`; fewer than 2 seeds: unknown, treated as not paying): ``"not_paying"``;
    4. the arm's gains lie below 0 (:func:`hurts`): ``"arm_below"`` -- the arm did not learn, so a difference from
       the baseline says nothing about masking;
    otherwise None: the comparison decides. ``baseline_gains`` empty: no comparator recorded, no gate (None)."""
    if not len(baseline_gains):
        return None
    if any(not f.passed for f in floors):
        return "degenerate"
    if hurts(baseline_gains):
        return "hurts"
    if not pays(baseline_gains):
        return "not_paying"
    if len(arm_gains) and hurts(arm_gains):
        return "arm_below"
    return None
