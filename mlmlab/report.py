"""The measured tables of README.md and docs/*.md, generated from the files that measured them (nothing typed by hand).

A generated table sits in a Markdown file between two comments::

    <!-- table: real_en_budget -->
    | ... |
    <!-- /table -->

and ``docs/results/tables.yaml`` says what each name is made of: rows of run records (a job's ``results.json``, copied
into ``docs/results/`` when its numbers are reported), a sweep compared arm against arm (:func:`mlmlab.analysis.compare`,
paired on the pretraining seed), two runs' predictions compared item by item, or one of the benchmark tables of ``benchmarks/report.py`` (``benchmarks/results``)::

    python -m mlmlab.report               # rewrite every generated block of README.md and docs/*.md
    python -m mlmlab.report check=true    # exit 1, naming the block, where a file differs from what its data says

The test suite runs the check, so a table cannot drift from its data, and a number edited by hand fails it.
A repo-level tool (it reads the repo's docs and benchmarks), so it takes the repo root (default: the current
directory, or ``root=``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from mlmlab.cli import BOOL, Opt
from mlmlab.cli import run as cli_run

PROG = "python -m mlmlab.report"
SPEC = Path("docs/results/tables.yaml")
DOCS = ("README.md", "docs/*.md")
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


class ReportError(ValueError):
    """A table spec that names a missing file, an unknown kind or a metric its runs do not have."""


# ----------------------------------------------------------------------------------------------------------- values
def _get(record: dict, key: str):
    """``metric:<key>`` (metrics are keyed with slashes) or a dotted path into the record (``budget.steps``)."""
    if key.startswith("metric:"):
        m = record.get("metrics") or {}
        name = key[len("metric:"):]
        if name not in m:
            raise ReportError(f"metric {name!r} is not in the run's metrics")
        return m[name]
    cur = record
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise ReportError(f"{key!r} is not in the run record")
        cur = cur[part]
    return cur


def _seeds(record: dict, prefix: str, task: str, metric: str) -> dict[str, float]:
    pat = re.compile(rf"{re.escape(prefix)}/{re.escape(task)}/seed_(\w+)/{re.escape(metric)}")
    out = {m.group(1): v for k, v in (record.get("metrics") or {}).items() if (m := pat.fullmatch(k))}
    if not out:
        raise ReportError(f"no {prefix}/{task}/seed_<s>/{metric} in the run's metrics")
    return out


def _mean_ci(values: Sequence[float]) -> tuple[float, float, float]:
    from mlmlab.stats import mean_interval

    iv = mean_interval(values)
    return iv.mean, (iv.sd if iv.n > 1 else float("nan")), iv.half


def _paired(a: dict[str, float], b: dict[str, float]) -> tuple[float, float, float, int]:
    """Mean of a - b over the fine-tuning seeds both have, its t CI half-width, the paired t-test p-value, n.
    Conditional on the one pretraining run: it describes that encoder, it decides nothing."""
    from mlmlab.stats import paired_t

    common = sorted(set(a) & set(b))
    if len(common) < 2:
        raise ReportError(f"fewer than 2 shared fine-tuning seeds to pair ({common})")
    iv = paired_t([a[s] for s in common], [b[s] for s in common])
    return iv.mean, iv.half, iv.p, iv.n


def _fmt(v, fmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if fmt == "p":
        return f"{v:.2g}" if v >= 0.001 else f"{v:.1e}"
    if fmt == "int":
        return f"{int(v):,}"
    if fmt == "millions":
        return f"{v / 1e6:.1f}M"
    return format(v, fmt)


# ------------------------------------------------------------------------------------------------------------ kinds
def _runs_table(spec: dict, base: Path) -> str:
    """Rows of run records; each column one of: ``key`` (a value, ``fmt``), ``ci`` (a task score over fine-tuning seeds,
    mean ± 95% t CI), ``gain`` (pretrained minus random init -- or ``vs: start``, the encoder a continued pretraining
    started from -- paired by fine-tuning seed, in points ± CI; ``p`` for its p-value), ``steps_tokens``, ``reach`` (tokens
    and training minutes until the validation curve's ``key``, default ``val/mlm_loss_r15``, is <= ``threshold``),
    ``loss_at`` (that loss after ``minutes`` of training), ``phase`` (the encoder's phase, :func:`_phase_label`). A row's ``baseline`` names another record whose random-init arm it pairs with (a job
    run with ``downstream.random_init_baseline=false``); a row's fields fill ``{...}`` in a column's keys (a key left
    empty, ``metric:``, prints ``-``); ``stat: std`` gives ± the std over fine-tuning seeds instead of the CI."""
    heads = [c["head"] for c in spec["columns"]]
    rows = []
    for row in spec["rows"]:
        rec = _load(base / row["run"])
        other = _load(base / row["baseline"]) if row.get("baseline") else rec
        cells = []
        for col in spec["columns"]:
            kind = col.get("kind", "key")
            try:
                cells.append(_phase_label(rec, row["run"], base) if kind == "phase" else
                             _cell(kind, col, row, rec, other))
            except ReportError as e:
                raise ReportError(f"{row['run']}, column {col['head']!r}: {e}") from None
        rows.append(cells)
    return _md(heads, rows)


def _cell(kind: str, col: dict, row: dict, rec: dict, other: dict) -> str:
    fill = {k: v for k, v in row.items() if isinstance(v, str)}
    if kind == "label":
        return row["label"]
    if kind == "key":
        key = col["key"].format(**fill)
        return "-" if key.endswith(":") else _fmt(_get(rec, key), col.get("fmt", ""))  # a row may leave a key empty
    if kind == "steps_tokens":
        b = rec.get("budget") or {}
        return f"{b['steps']:,} ({b['tokens'] / 1e6:.1f}M)"
    if kind in ("reach", "loss_at"):  # the record's validation curve (results.json val_curve, mlmlab.phase)
        from mlmlab.phase import loss_at, reach

        curve, key = rec.get("val_curve") or [], col.get("key", "val/mlm_loss_r15")
        if not curve:  # a record from before val_curve: its final loss is in the other columns
            return "- (no curve)"
        if kind == "loss_at":
            v = loss_at(curve, 60 * float(col["minutes"]), key)
            return f"{v:.3f}" if v is not None else f"- ({curve[-1]['train_s'] / 60:.1f} min run)"
        hit = reach(curve, float(col["threshold"]), key)
        if hit is None:
            return f"not in {curve[-1]['tokens'] / 1e6:.1f}M ({curve[-1]['train_s'] / 60:.1f} min)"
        return f"{hit['tokens'] / 1e6:.1f}M, {hit['train_s'] / 60:.1f} min"
    task, metric = col["task"].format(**fill), col.get("metric", "acc")
    if kind == "ci":
        arm = col.get("arm", "downstream").format(**fill)
        src = other if arm in ("random_init", "start") else rec
        values = list(_seeds(src, arm, task, metric).values())
        mean, std, ci = _mean_ci(values)
        mean = (src.get("metrics") or {}).get(f"{arm}/{task}/{metric}", mean)  # the job's own mean where it logged one
        spread = std if col.get("stat") == "std" else ci  # the fine-tuning seeds' spread, or the CI of their mean
        return f"{mean:.3f} ± {spread:.3f}"
    if kind in ("gain", "p"):
        vs = col.get("vs", "random_init")  # or start: continued pretraining against the encoder it started from
        mean, ci, p, _ = _paired(_seeds(rec, "downstream", task, metric), _seeds(other, vs, task, metric))
        if kind == "p":
            return _fmt(p, "p")
        text = f"{100 * mean:+.1f} ± {100 * ci:.1f}"
        return f"**{text}**" if mean - ci > 0 else text  # bold: the CI excludes 0 in favour of pretraining
    raise ReportError(f"column kind {kind!r} is not known; allowed: label, key, steps_tokens, reach, loss_at, phase, ci, "
                      "gain, p")


PHASES = "phases.json"  # docs/results/phases.json: python -m mlmlab.phase <records> write=docs/results/phases.json


def _phase_label(rec: dict, run: str, base: Path) -> str:
    """The phase of a record's encoder (:mod:`mlmlab.phase`): as the job recorded it, else as ``python -m mlmlab.phase
    ... write=docs/results/phases.json`` computed it for a record made before the phase existed (keyed by the record's
    path under docs/results), else "not recorded"."""
    if rec.get("phase"):
        return rec["phase"]["label"]
    f = base / PHASES
    ph = (_load(f) if f.is_file() else {}).get(str(Path(run).as_posix()))
    return ph["label"] if ph else "not recorded"


def _phases(spec: dict, base: Path) -> str:
    """The phases of a compare table's encoders (every record of its ``source`` folders): "past the drop (8 of 8)"."""
    import collections

    sources = spec["source"] if isinstance(spec["source"], list) else [spec["source"]]
    paths = [p for src in sources for p in sorted((base / src).rglob("results.json"))]
    labels = collections.Counter(_phase_label(_load(p), p.relative_to(base).as_posix(), base) for p in paths)
    return "; ".join(f"{k} ({v} of {len(paths)})" for k, v in labels.most_common())


def _stability_table(spec: dict, base: Path) -> str:
    """Does a verdict survive the loss drop? Per question (``rows``: ``question``, ``before`` and ``after``, each
    ``{table, sequential (optional), budget}``: a compare table with a declared question, at an early budget and past
    the drop) and arm: each side's budget, its encoders' phase, the effect on the primary metric with its interval
    over seeds and the verdict (the findings row's, sequential rule included), and what changed."""
    rows = []
    for row in spec["rows"]:
        sides = []
        for side in ("before", "after"):
            s = row[side]
            part, m, scale, dg = _primary_rows({"question": row["question"], "table": s["table"]}, base, _SPECS)
            words = [_say(r, scale, dg) for _, r in part.iterrows()]
            if s.get("sequential"):
                words = [w.rsplit("; ", 1)[0] for w in _sequential_words(s, base, part, words)]
            sides.append(({r["arm"]: (r, w) for (_, r), w in zip(part.iterrows(), words)}, s, scale, dg,
                          _phases(_SPECS[s["table"]], base)))
        (early, s0, sc0, d0, ph0), (late, s1, sc1, d1, ph1) = sides
        for arm in [a for a in late if a in early]:
            (r0, w0), (r1, w1) = early[arm], late[arm]
            same = (r0["diff"] > 0) == (r1["diff"] > 0)
            decided = [w.split(" (")[0].endswith(" better") for w in (w0, w1)]
            change = ("same direction" if same else "reversed") + (
                ", decided at both" if all(decided) else ", decided only past the drop" if decided[1]
                else ", decided only at the early budget" if decided[0] else ", decided at neither")
            rows.append([row["question"], f"{r1['arm']} vs {r1['baseline']}", s0["budget"], ph0, _effect(r0, sc0, d0),
                         w0, s1["budget"], ph1, _effect(r1, sc1, d1), f"**{w1}**", change])
    return _md(["question", "arms", "early budget", "phase", "effect (95% CI over seeds)", "verdict",
                "past the drop", "phase", "effect (95% CI over seeds)", "verdict", "what changed"], rows)


_QUESTIONS: dict[str, object] = {}  # one render of the docs: a compare table's question rows, reused by findings
_SPECS: dict[str, dict] = {}  # the whole tables.yaml of this render: a question may span several compare tables


def _question_rows(spec: dict, base: Path):
    """The runs of a compare-like spec and its question table (:func:`mlmlab.verdicts.question_table`), computed once
    per spec and folder in a process. A spec with ``question_id`` shares its question with every spec of that id
    (one sweep's question asked against two baselines, or at two label budgets): their hypotheses are adjusted
    together (:func:`mlmlab.verdicts.readjust`), by the question's declared ``multiplicity``."""
    from mlmlab.stats import Question
    from mlmlab.verdicts import readjust

    key = _key(spec, base)
    if key not in _QUESTIONS:
        qid = spec.get("question_id")
        group = [s for s in _SPECS.values() if qid and s.get("question_id") == qid] or [spec]
        if spec not in group:
            group.append(spec)
        declared = {json.dumps(s.get("question"), sort_keys=True) for s in group}
        if qid and any(not s.get("question") for s in group):
            raise ReportError(f"question_id {qid!r}: every table of a question declares it (question:)")
        raw = [_question_rows_uncached(s, base) for s in group]
        q = Question(**spec["question"]) if spec.get("question") else None
        if q is not None and len(group) > 1:
            if len({json.dumps({k: v for k, v in json.loads(d).items() if k not in ("primary", "family")},
                               sort_keys=True) for d in declared}) > 1:
                raise ReportError(f"question_id {qid!r}: its tables declare different margins or rules")
            raw = readjust(raw, q)
        elif q is not None:
            raw = readjust(raw, q)
        for s, t in zip(group, raw):
            _QUESTIONS[_key(s, base)] = t
    return _QUESTIONS[key].copy()


def _key(spec: dict, base: Path) -> str:
    return json.dumps([str(base), spec], sort_keys=True, default=str)


_COUNTS: dict[str, dict] = {}


def _question_rows_uncached(spec: dict, base: Path):
    from mlmlab.analysis import _columns, load_runs, question, select
    from mlmlab.runs import label_counts
    from mlmlab.stats import Question
    from mlmlab.verdicts import apply_sequential, sequential_results

    sources = spec["source"] if isinstance(spec["source"], list) else [spec["source"]]
    df = select(load_runs([base / src for src in sources], source_kind="results"), spec.get("where"),
                spec.get("exclude") or [])
    keys = [m["key"] for m in spec["metrics"]]
    for key in keys:
        try:  # "a - b": a less b per run (mlmlab.analysis adds the column)
            _columns(df, key)
        except KeyError as e:
            raise ReportError(f"{spec['source']}: no metric {key!r} in its runs ({e})") from None
    q = spec.get("question")
    declared = Question(**q) if q else Question(primary=keys[0], family=[])  # none declared: all exploratory
    names = {str(k): str(v) for k, v in (spec.get("names") or {}).items()}
    ck = json.dumps(sorted(map(str, df["run_dir"].unique())))
    if ck not in _COUNTS:  # the evaluation sets' labels (the gate's constant predictor), from any record that kept them
        _COUNTS[ck] = label_counts(list(df["run_dir"].unique()), also=[base])
    t = question(df, spec["by"], spec["baseline"], keys, declared, names=names, counts=_COUNTS[ck],
                 ignore=spec.get("ignore") or ())  # keys declared irrelevant to the comparison (tables.yaml ignore:)
    if spec.get("sequential") and q:  # run in rounds: the primary's inference is the sequential rule's
        state = _load(base / spec["sequential"] / "sequential.json")
        results, design = sequential_results(df, spec["by"], spec["baseline"], q["primary"], state, names=names)
        for a in state.get("arms", []):  # what the sweep decided while it ran must be what its records give now
            value = str(a["arm"]).rsplit("=", 1)[-1]
            r = results.get(names.get(value, value))
            if r is None:
                raise ReportError(f"{spec['sequential']}/sequential.json has arm {a['arm']!r}, which no record has")
            if a.get("verdict") != r.verdict or a.get("seeds") != r.n:
                raise ReportError(f"{spec['sequential']}/sequential.json: {a['arm']} {a.get('verdict')} at "
                                  f"{a.get('seeds')} seeds, but its records give {r.verdict} at {r.n}")
        t = apply_sequential(t, results, design)
    if not q:
        t["role"], t["verdict"], t["p_holm"] = "exploratory", "exploratory", float("nan")
    return t


def _compare_table(spec: dict, base: Path) -> str:
    """A sweep's arms against its baseline arm, one row per (metric, arm), paired on the pretraining seed (the unit):
    baseline and arm means over seeds, the difference with its 95% t interval over seeds, raw p (paired t) and, for
    the metrics of the spec's declared ``question`` (primary + family), the p adjusted over the whole question
    (:func:`mlmlab.stats.adjust`: Holm over every hypothesis, or the declared gatekeeping order; a ``question_id``
    shared with other tables pools theirs too) and the verdict by the rules of :func:`mlmlab.stats.verdict` with the
    regime gate first (every other metric: "exploratory"), n pairs, and the minimal detectable difference at 80% power
    (exact noncentral t) with, in brackets, its range over the 95% interval of the sd it uses. ``source`` may list
    several folders (two sweeps compared); ``where`` keeps the runs that match all its keys, ``exclude`` entries leave
    out the runs that match all theirs (:func:`mlmlab.analysis.select`); ``names`` maps arm values to what the table
    prints (a sampler's class path -> ``uniform``); ``sequential: <folder>``: the sweep ran in rounds, and the primary
    metric's rows carry the sequential rule's inference (:func:`_sequential_words`): the repeated CI at the look it
    stopped, the stagewise-ordering p, and the design's power in place of the fixed-n MDD."""
    t = _question_rows(spec, base)
    fmts = {m["key"]: m for m in spec["metrics"]}
    said = {}
    if spec.get("sequential") and spec.get("question"):  # the primary metric's rows: the sequential rule's inference
        primary = t[t["metric"] == spec["question"]["primary"]]
        scale = float(fmts[spec["question"]["primary"]].get("scale", 1))
        said = dict(zip(primary.index, _sequential_words(spec, base, primary,
                                                         [_say(r, scale) for _, r in primary.iterrows()])))
    rows = []
    for i, r in t.iterrows():
        m = fmts[r["metric"]]
        label, scale, fmt = m.get("label", m["key"]), float(m.get("scale", 1)), m.get("fmt", ".3f")
        dg = _digits(fmt)
        rows.append([label, f"{r['baseline']} → {r['arm']}", _fmt(scale * r["baseline_mean"], fmt),
                     _fmt(scale * r["arm_mean"], fmt), _effect(r, scale, dg), _p_cell(r),
                     _fmt(r["p_holm"], "p"), str(int(r["n"])), _power_cell(r, scale, dg),
                     said.get(i, _say(r, scale, dg))])
    return _md(["metric", f"`{spec['by']}`", "baseline", "arm", "arm - baseline (95% CI over seeds)", "p",
                "p (adjusted over the question)", "seeds", "min. detectable (80% power) [sd range]", "verdict"], rows)


def _sequential(r) -> bool:
    """Whether a question row carries a sequential rule's inference (:func:`mlmlab.verdicts.apply_sequential`)."""
    v = r.get("seq_verdict") if hasattr(r, "get") else None
    return isinstance(v, str)


def _p_cell(r) -> str:
    return f"{_fmt(r['p'], 'p')} (stagewise)" if _sequential(r) else _fmt(r["p"], "p")


def _power_cell(r, scale: float, dg: int) -> str:
    """The fixed-n minimal detectable difference [sd range]; for a sequential row, the design's power from its own
    boundaries at the margin and at the observed effect (a fixed-n MDD does not describe a sequential design)."""
    if not _sequential(r):
        return _mdd_range(r, scale, dg)
    pm, po = r.get("power_margin"), r.get("power_observed")
    margin = f"±{scale * r['delta']:g}" if r.get("delta") == r.get("delta") and r.get("delta") else "the margin"
    return f"design power {_fmt(pm, '.2f')} at {margin}, {_fmt(po, '.2f')} at the observed effect"


def _findings_table(spec: dict, base: Path, tables: dict) -> str:
    """The README's findings: per question (a ``compare`` table with a declared ``question``), each arm on the
    primary metric -- each arm's gain over random init over seeds (does pretraining pay there, and did the arm
    learn?), the difference with its 95% t interval over seeds (a sequential sweep: the repeated CI at the look it
    stopped), raw / adjusted p (sequential: the stagewise-ordering p), seeds, the minimal detectable difference [sd
    range] and the seeds 80% power needs at the margin (sequential: the design's power), when the question was
    declared, and the verdict by the fixed rules."""
    if spec.get("compact"):
        return _findings_compact(spec, base, tables)
    rows = []
    for row in spec["rows"]:
        part, m, scale, dg = _primary_rows(row, base, tables)
        over_name = row.get("gain_over") or "random init"
        words = [_say(r, scale, dg, over_name) for _, r in part.iterrows()]
        if row.get("sequential"):
            words = _sequential_words(row, base, part, words)
        over = f" over {row['gain_over']}" if row.get("gain_over") else ""  # continued pretraining: over its start
        for (_, r), word in zip(part.iterrows(), words):
            gains = "; ".join(f"{r[side]}: {_interval(r[side + '_gain'], scale, dg)}" for side in ("baseline", "arm"))
            gains += over
            seq = _sequential(r)
            rows.append([row["question"], f"`{row['sweep']}`", m.get("label", m["key"]), gains,
                         f"{r['arm']} - {r['baseline']}: {_effect(r, scale, dg)}",
                         f"{_p_cell(r)} / {_fmt(r['p_holm'], 'p')}", str(int(r["n"])),
                         _power_cell(r, scale, dg),
                         "-" if seq else f"{_count(r['seeds_80'])} [{_count(r['seeds_80_high'])}]",
                         _declared(row, base), f"**{word}**"])
    return _md(["question", "sweep", "primary metric", "each arm's gain over random init, or as said (95% CI over seeds)",
                "effect (95% CI over seeds)", "p / adjusted p (over the question)", "seeds",
                "min. detectable [sd range]", "seeds for 80% power at the margin [at the sd's upper 95% bound]",
                "declared", "verdict"], rows)


def _primary_rows(row: dict, base: Path, tables: dict):
    """A findings row's question table on its primary metric: (rows, the metric's spec, scale, digits)."""
    t_spec = tables.get(row["table"])
    if t_spec is None or not t_spec.get("question"):
        raise ReportError(f"findings row {row['question']!r}: table {row['table']!r} is not a compare table "
                          "with a declared question")
    t = _question_rows(t_spec, base)
    primary = t_spec["question"]["primary"]
    m = next(x for x in t_spec["metrics"] if x["key"] == primary)
    return t[t["metric"] == primary], m, float(m.get("scale", 1)), _digits(m.get("fmt", ".3f"))


def _findings_compact(spec: dict, base: Path, tables: dict) -> str:
    """``compact: true``: one row per question (the README's front door) -- the primary metric, the baseline arm's gain
    over random init, each arm's effect with its adjusted p (a sequential sweep: the repeated CI and the
    stagewise-ordering p), when the question was declared relative to its data, and the verdict (once, where every
    arm has the same)."""
    rows = []
    for row in spec["rows"]:
        part, m, scale, dg = _primary_rows(row, base, tables)
        effects = "; ".join(f"{r['arm']}: {_effect(r, scale, dg)}"
                            + (f", stagewise p {_fmt(r['p'], 'p')}" if _sequential(r) else "")
                            + f", adjusted p {_fmt(r['p_holm'], 'p')}" for _, r in part.iterrows())
        words = [_say(r, scale, dg, row.get("gain_over") or "random init") for _, r in part.iterrows()]
        if row.get("sequential"):  # a sweep run in rounds: its arms were decided by the sequential rule
            words = _sequential_words(row, base, part, words)
        verdict = words[0] if len(set(words)) == 1 else "; ".join(f"{r['arm']}: {w}" for (_, r), w in
                                                                     zip(part.iterrows(), words))
        first = part.iloc[0]
        over = f" over {row['gain_over']}" if row.get("gain_over") else ""  # continued pretraining: over its start
        rows.append([row["question"], f"`{row['sweep']}`", f"{m.get('label', m['key'])}, {int(first['n'])} seeds",
                     f"{first['baseline']}: {_interval(first['baseline_gain'], scale, dg)}{over}", effects,
                     _declared(row, base), f"**{verdict}**"])
    return _md(["question", "sweep", "primary metric", "baseline's gain over random init (or as said)",
                "effect vs the baseline (95% CI over seeds; adjusted over the question)", "declared", "verdict"], rows)


def _declared(row: dict, base: Path) -> str:
    """When the question of a findings row was declared relative to its data (:mod:`mlmlab.provenance`, from the
    committed ``docs/results/provenance.json``), the declared arms that have no records, and (a row's
    ``selected_on``) what was selected on the split that reports the verdict, until it is re-run on the selection
    split."""
    try:
        from mlmlab import provenance
    except ImportError:
        return "-"
    p = provenance.for_row(provenance.load(base.parent.parent), row)
    text = provenance.cell(p) if p is not None else "not recorded"
    if row.get("selected_on"):  # a recipe, lr or protocol chosen on the split that reports this verdict
        text += f"; selected on the evaluation split ({row['selected_on']})"
    return text


def _sequential_words(row: dict, base: Path, part, words: list[str]) -> list[str]:
    """A findings row of a sequential sweep (``sequential: <folder under docs/results>``): each arm's verdict is the
    one its question-adjusted stagewise-ordering p gives (the regime gate first), with where the rule stopped (look
    and seeds) -- and, where the adjustment over the question undoes the rule's own decision, both -- and its cost
    (:func:`_cost`), from the jobs' records."""
    folder = base / row["sequential"]
    s = _load(folder / "sequential.json")
    out = []
    for (_, r), w in zip(part.iterrows(), words):
        if not _sequential(r):
            raise ReportError(f"{folder}/sequential.json has no arm {r['arm']!r}")
        where = f"sequential rule stopped at look {int(r['look'])} of {int(r['looks'])}, {int(r['n'])} seeds"
        gated = not (w.endswith(" better") or w.startswith(("equivalent", "inconclusive")))
        if gated or r["seq_verdict"] in ("continue", "inconclusive"):
            out.append(f"{w} ({where}: {r['seq_verdict']})")
        elif w.startswith("inconclusive"):
            out.append(f"{w} ({where}: {r['seq_verdict']} at the rule's own level, not after adjusting over the "
                       "question)")
        else:
            out.append(f"{w} ({where})")
    return [f"{w}; {_cost(folder, s)}" for w in out]


def _cost(folder: Path, state: dict) -> str:
    """What a sequential sweep's answer cost, from its records: the wall time from the first job's start to the last
    job's end (rounds run in separate sessions count the time between them), the jobs' own minutes summed (each job
    holds one core), and the same for the fixed design the rule replaced (every arm at the plan's ``max_seeds``, at
    the mean minutes of a job of this sweep)."""
    import datetime

    stamp = lambda t: datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S%z").timestamp()  # noqa: E731
    recs = [_load(f) for f in sorted(folder.rglob("results.json"))]
    minutes = (max(stamp(r["finished_at"]) for r in recs) - min(stamp(r["started_at"]) for r in recs)) / 60
    job_min = [(stamp(r["finished_at"]) - stamp(r["started_at"])) / 60 for r in recs]
    text = f"{len(recs)} jobs in {minutes // 60:.0f} h {minutes % 60:02.0f} min, {sum(job_min):.0f} job-minutes"
    arms, max_seeds = len(state.get("arms", [])) + 1, (state.get("plan") or {}).get("max_seeds")
    if max_seeds and arms > 1:  # the fixed design: every arm (and the baseline) at max_seeds
        n = arms * int(max_seeds)
        text += f" (fixed design: {n} jobs, ~{n * sum(job_min) / len(job_min):.0f})"
    return text


def _interval(g, scale: float, dg: int) -> str:
    """An interval over seeds (:class:`mlmlab.stats.Interval`) as ``+1.2 [+0.3, +2.1]`` in the table's units."""
    return "-" if g is None or g.n < 2 else _bracket(g.mean, g.low, g.high, scale, dg)


def _effect(r, scale: float, dg: int) -> str:
    """A question row's difference with its interval over seeds (a sequential row: the repeated CI at its look)."""
    text = _bracket(r["diff"], r["low"], r["high"], scale, dg)
    if _sequential(r):
        text += f" (repeated CI, look {int(r['look'])} of {int(r['looks'])})"
    return text


def _mdd_range(r, scale: float, dg: int) -> str:
    """A question row's minimal detectable difference with its range over the sd's 95% interval."""
    return _bracket(r["mdd"], r["mdd_low"], r["mdd_high"], scale, dg, sign=False)


def _bracket(value: float, low: float, high: float, scale: float, dg: int, sign: bool = True) -> str:
    """``+1.2 [+0.3, +2.1]`` (``sign``) or ``1.2 [0.3, 2.1]``, scaled, ``-`` for a missing number."""
    f = f"{'+' if sign else ''}.{dg}f"
    return f"{_fmt(scale * value, f)} [{_fmt(scale * low, f)}, {_fmt(scale * high, f)}]"


def _say(r, scale: float, dg: int = 1, over: str = "random init") -> str:
    """The verdict in the table's units (a margin of 1 point, not 0.01), with the numbers the regime gate read: the
    arm's gain interval where it did not learn, the failing floor where the comparator is degenerate, the baseline's
    gain where pretraining hurts."""
    v = str(r["verdict"])
    if v.startswith("equivalent"):
        return f"equivalent within ±{scale * r['delta']:g}"
    if v.endswith("did not learn (below random init)"):
        return f"{r['arm']} did not learn ({_interval(r['arm_gain'], scale, dg)} below {over})"
    if v == "pretraining hurts here":
        return f"pretraining hurts here ({r['baseline']}: {_interval(r['baseline_gain'], scale, dg)} below {over})"
    if v.startswith("degenerate comparator"):
        bad = [f for f in (r.get("floors") or []) if not f.passed]
        what = "; ".join(f"{f.what} {f.metric.rsplit('/', 1)[-1]} {_fmt(scale * f.value, f'.{dg}f')} vs "
                         f"{_fmt(scale * f.floor, f'.{dg}f')} for a constant predictor" for f in bad[:2])
        return f"{v} ({what})" if what else v
    return v


def _count(v) -> str:
    return "> 1000" if v is None or v != v else str(int(v))


def _digits(fmt: str) -> int:
    m = re.search(r"\.(\d+)f", fmt)
    return int(m.group(1)) if m else 3


def _items_table(spec: dict, base: Path) -> str:
    """Per-item paired comparisons of two runs' predictions (:func:`mlmlab.analysis.compare_items`: paired bootstrap CI
    over items, exact McNemar per fine-tuning seed, the minimal detectable difference), one row per pair x task x
    protocol. ``pooled: true`` adds, per ``group`` of pairs (a pair's optional ``group`` key: one arm against the
    baseline, say), a row per task and protocol that pools the group's pairs item by item: every (pretraining run,
    fine-tuning seed) of the fine-tuned tasks, every pretraining run's probe and zero-shot outcomes; ``pooled: only``
    gives just those rows (a compact table for a sweep of several arms)."""
    from mlmlab.analysis import compare_items, load_predictions

    pooled = spec.get("pooled", False)
    if pooled not in (True, False, "only"):
        raise ReportError(f"items table: pooled={pooled!r}; allowed: true, false, only")
    rows, pools = [], {}
    for pair in spec["pairs"]:
        a, b = load_predictions(base / pair["a"]), load_predictions(base / pair["b"])
        if pooled != "only":
            rows += _item_rows(pair["label"], compare_items(a, b))
        group = pools.setdefault(pair.get("group"), ({}, {}))
        for pool, pred in zip(group, (a, b)):
            for task, p in pred.items():
                q = pool.setdefault(task, {"truth": p.get("truth")})
                if "seeds" in p:  # fine-tuned: every (pretraining run, fine-tuning seed) one row of outcomes
                    q.setdefault("seeds", {}).update({f"{pair['label']}/{k}": v for k, v in p["seeds"].items()})
                if "probe" in p:  # probe and zero-shot: every pretraining run one row, in pair order on both sides
                    q.setdefault("probe_runs", []).append(p["probe"])
                if "items" in p:
                    q.setdefault("items_runs", []).append(p["items"])
                    q.setdefault("pair_ids", p.get("pair_ids"))  # BLiMP's paradigms: the bootstrap's clusters
    if pooled:
        for group, (pool_a, pool_b) in pools.items():
            rows += _item_rows("pooled" if group is None else f"{group}, pooled", compare_items(pool_a, pool_b))
    return _md(["pair", "task", "protocol", "items", "a", "b",
                "a - b (95% bootstrap CI over items, given these encoders)", "McNemar p", "min. detectable"], rows)


def _pvalues(text: str) -> str:
    ps = [float(x) for x in text.split(", ") if x]
    return text if len(ps) <= 3 else f"{sum(p < 0.05 for p in ps)} of {len(ps)} < 0.05"


def _item_rows(label: str, t) -> list[list[str]]:
    out = []
    for (task, proto), r in t.iterrows():
        out.append([label, task, proto, f"{int(r['n_items']):,}" + (f" x {int(r['runs_paired'])}" if
                                                                     r["runs_paired"] > 1 else ""),
                    f"{r['a']:.3f}", f"{r['b']:.3f}",
                    f"{100 * r['diff']:+.1f} [{100 * r['ci_low']:+.1f}, {100 * r['ci_high']:+.1f}]",
                    _pvalues(r["mcnemar_p"]),
                    f"{100 * r['mdd']:.1f}"])
    return out


def load_bench_module(root: Path, filename: str, name: str):
    """A script of ``<root>/benchmarks`` (not a package) loaded as a module, with its folder importable meanwhile (the
    scripts import their sibling ``_common``)."""
    bench_dir = root / "benchmarks"
    sys.path.insert(0, str(bench_dir))
    try:
        mod_spec = importlib.util.spec_from_file_location(name, bench_dir / filename)
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(bench_dir))
    return mod


def _bench_table(spec: dict, root: Path) -> str:
    """One of ``benchmarks/report.py``'s tables (``bench: masking|step|data|e2e``) from ``benchmarks/results``, with the
    line saying where it was measured."""
    bench_dir = root / "benchmarks"
    name = spec["bench"]
    known = ("masking", "step", "data", "e2e", "time_to_pay", "electra_reference", "matmul", "step_profile",
             "split_overlap")
    if name not in known:
        raise ReportError(f"bench: {name!r} is not known; allowed: {', '.join(known)}")
    mod = load_bench_module(root, "report.py", "mlmlab_bench_report")
    files = spec.get("files") or [spec.get("file", f"bench_{name}")]
    loaded = [mod.load(bench_dir / "results", f) for f in files]
    missing = [f for f, p in zip(files, loaded) if p is None]
    if missing:
        raise ReportError(f"benchmarks/results/{missing[0]}.json does not exist")
    kw = {k: spec[k] for k in ("summary", "recipes", "labels", "steps", "targets") if spec.get(k)}  # (time_to_pay's, electra's)
    body = getattr(mod, name)(loaded if len(loaded) > 1 else loaded[0], **kw)
    if len(loaded) == 1:
        return f"{body}\n\nMeasured on: {mod.where(loaded[0])}"
    # the machine and versions once, each commit once, the dates as a range
    parts = [mod.where(p).split("; ") for p in loaded]  # machine; versions; commit <c>; date
    machines = "; ".join(dict.fromkeys("; ".join(x[:-2]) for x in parts))
    commits = ", ".join(dict.fromkeys(x[-2].removeprefix("commit ") for x in parts))
    dates = sorted(str(p.get("created_at", "?")) for p in loaded)
    return (f"{body}\n\nMeasured on: {machines}; commit{'s' if ',' in commits else ''} {commits}; "
            f"{dates[0]} to {dates[-1]}")


KINDS = {"runs": _runs_table, "compare": _compare_table, "items": _items_table, "bench": None, "findings": None,
         "stability": _stability_table}


# --------------------------------------------------------------------------------------------------------- plumbing
def _load(path: Path) -> dict:
    if not path.is_file():
        raise ReportError(f"{path} does not exist")
    return json.loads(path.read_text())


def _md(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def load_spec(root: Path) -> dict:
    import yaml

    path = root / SPEC
    if not path.is_file():
        raise ReportError(f"{path} does not exist (run from the repo root, or give root=)")
    spec = yaml.safe_load(path.read_text()) or {}
    for name, t in spec.items():
        if t.get("kind") not in KINDS:
            raise ReportError(f"{SPEC}: table {name!r} has kind={t.get('kind')!r}; allowed: {', '.join(KINDS)}")
    return spec


def render(name: str, spec: dict, root: Path) -> str:
    if _SPECS != spec:  # a question spanning several tables finds them here
        _SPECS.clear()
        _SPECS.update(spec)
    t = spec[name]
    base = root / SPEC.parent
    try:
        if t["kind"] == "bench":
            body = _bench_table(t, root)
        elif t["kind"] == "findings":
            body = _findings_table(t, base, spec)
        else:
            body = KINDS[t["kind"]](t, base)
    except (KeyError, ReportError) as e:
        raise ReportError(f"table {name!r}: {e}") from None
    return body + ("\n\n" + t["note"].strip() if t.get("note") else "")


NOT_MEASURED = "<!-- not measured -->"


def untracked_tables(root: Path) -> list[str]:
    """Markdown tables outside a generated block that are not marked as holding no measurement (``<!-- not measured
    -->`` on the line above): a table typed by hand, with no record behind it. ``file:line`` each."""
    out = []
    for path in sorted({p for pat in DOCS for p in root.glob(pat)}):
        text = BLOCK.sub(lambda m: m.group(1) + "\n" * m.group("body").count("\n") + m.group(4), path.read_text())
        lines = text.splitlines()
        for i, line in enumerate(lines):
            starts = line.lstrip().startswith("|") and (i == 0 or not lines[i - 1].lstrip().startswith("|"))
            is_table = starts and i + 1 < len(lines) and re.match(r"^\s*\|\s*:?-{3,}", lines[i + 1])
            if is_table and (i == 0 or lines[i - 1].strip() != NOT_MEASURED):
                out.append(f"{path.relative_to(root)}:{i + 1}")
    return out


START = re.compile(r"<!-- table: (?P<name>[\w.-]+) -->")


def _unclosed_block(text: str) -> tuple[str, int] | None:
    """The first ``<!-- table: name -->`` with no ``<!-- /table -->`` before the next start marker or the end of the
    file: (name, line), or None."""
    starts = list(START.finditer(text))
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        if "<!-- /table -->" not in text[m.end():end]:
            return m.group("name"), text.count("\n", 0, m.start()) + 1
    return None


def update(root: Path, check: bool = False) -> list[str]:
    """Rewrite (or, with ``check``, compare) every generated block; returns the ``file: block`` names that changed
    (or differ), and with ``check`` every table typed by hand (:func:`untracked_tables`). A block whose name has no
    spec is an error, and so is a spec no file uses."""
    spec = load_spec(root)
    _QUESTIONS.clear()  # the records may have changed since the last render in this process
    _COUNTS.clear()
    used, changed = set(), []
    files = sorted({p for pat in DOCS for p in root.glob(pat)})
    for path in files:
        text, rel = path.read_text(), path.relative_to(root)
        unclosed = _unclosed_block(text)
        if unclosed:
            raise ReportError(f"{rel}:{unclosed[1]}: block {unclosed[0]!r} has no end marker <!-- /table --> before "
                              "the next block or the end of the file")

        def sub(m: re.Match, rel: Path = rel) -> str:
            name = m.group("name")
            if name not in spec:
                raise ReportError(f"{rel}: block {name!r} has no entry in {SPEC}")
            used.add(name)
            body = render(name, spec, root) + "\n"
            if body != m.group("body"):
                changed.append(f"{rel}: {name}")
            return m.group(1) + body + m.group(4)

        new = BLOCK.sub(sub, text)
        if new != text and not check:
            path.write_text(new)
    unused = sorted(set(spec) - used)
    if unused:
        raise ReportError(f"{SPEC}: no file has a block for {', '.join(unused)}")
    if check:
        changed += [f"{where}: a table typed by hand (no record; generate it, or mark a table of no measurements "
                    f"with {NOT_MEASURED} on the line above)" for where in untracked_tables(root)]
    return changed


OPTIONS = {
    "check": Opt("compare only: exit 1 when a block differs from its data", False, BOOL),
    "root": Opt("the repo root (README.md, docs/, benchmarks/)", "."),
}


def _main(a) -> int:
    root = Path(a.root)
    try:
        changed = update(root, check=a.check)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for c in changed:
        print(("differs from its data: " if a.check else "rewrote: ") + c)
    if a.check and changed:
        print(f"run `{PROG}` to regenerate", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate (or check) the generated tables (``key=value`` arguments, :mod:`mlmlab.cli`)."""
    return cli_run(_main, argv, OPTIONS, PROG)


if __name__ == "__main__":
    sys.exit(main())
