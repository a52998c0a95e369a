"""The phase of an encoder: where its fixed-mask MLM loss (``val/mlm_loss_r15``) stands against the unigram and bigram
references of the same masks (``val/unigram_loss_r15``, ``val/bigram_loss_r15``: :mod:`mlmlab.data.ngram`), by a
declared rule with the margin ``eval.phase_margin`` (nats, default 0.1):

- ``lexical``: not below the unigram reference by the margin -- the model has not yet used its context;
- ``bigram``: below the unigram reference by the margin, not below the bigram reference by it -- it uses the context
  about as well as the left neighbour alone tells;
- ``past the drop``: below the bigram reference by the margin -- it uses more context than the neighbouring token.

Language models fit unigram, then short n-gram statistics, before they refine longer contexts (Chang et al., TACL
2024, "Characterizing learning curves during language model pre-training"); MLMs then leave that plateau in a sudden
loss drop as syntactic attention structure appears (Chen et al., ICLR 2024, "Sudden drops in the loss"). Chen et al.
place the drop by that internal structure (attention heads' parse accuracy), which needs a parsed corpus and probes
of the attention; the loss against the two n-gram references is the declared, model-agnostic proxy read here. A job
records ``phase: {label, mlm_loss, unigram, bigram, margin, metric}`` in results.json and ``phase`` in its W&B summary.

For records made before the phase existed::

    python -m mlmlab.phase <run dir | results.json | sweep dir> [also=[...]] [margin=0.1] [data_dir=...] [cache_dir=...]

prints each run's phase, reading the references from the record when it has them and recomputing them (cached) from
the record's data, tokenizer and eval config otherwise -- the corpus must be on this machine (``data_dir``, default
env ``MLMLAB_DATA_DIR``: a recorded path that is not here is looked for under it). :func:`phase_of_record` is the same
for a loaded record (the report may call it).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from mlmlab.cli import Opt
from mlmlab.cli import run as cli_run

log = logging.getLogger(__name__)

PHASES = ("lexical", "bigram", "past the drop")
DEFAULT_MARGIN = 0.1  # eval.phase_margin's default (mlmlab.config.EvalConfig), for records from before the key


def phase(mlm_loss: float, unigram: float, bigram: float, margin: float = DEFAULT_MARGIN) -> str:
    """The declared phase rule (module docstring): ``"lexical"`` unless ``mlm_loss < unigram - margin``; then
    ``"past the drop"`` if ``mlm_loss < bigram - margin``, else ``"bigram"``. ValueError on a non-finite loss or a
    negative margin."""
    values = {"mlm_loss": mlm_loss, "unigram": unigram, "bigram": bigram, "margin": margin}
    bad = {k: v for k, v in values.items() if not isinstance(v, (int, float)) or not math.isfinite(v)}
    if bad or margin < 0:
        raise ValueError(f"phase needs finite losses and a margin >= 0; got {bad or {'margin': margin}}")
    if mlm_loss >= unigram - margin:
        return "lexical"
    return "past the drop" if mlm_loss < bigram - margin else "bigram"


def phase_record(mlm_loss: float, unigram: float, bigram: float, margin: float, metric: str) -> dict:
    """results.json ``phase``: the label and what it was read from (``metric``: the MLM loss's key)."""
    return {"label": phase(mlm_loss, unigram, bigram, margin), "mlm_loss": float(mlm_loss), "unigram": float(unigram),
            "bigram": float(bigram), "margin": float(margin), "metric": metric}


def reference_metrics(reference: dict, suffix: str) -> dict[str, float]:
    """The references as metrics beside ``val/mlm_loss_<suffix>``: ``val/unigram_loss_<suffix>``,
    ``val/bigram_loss_<suffix>``."""
    return {f"val/unigram_loss_{suffix}": float(reference["unigram"]),
            f"val/bigram_loss_{suffix}": float(reference["bigram"])}


def record_phase(reference: dict, suffix: str, metrics: dict[str, float], margin: float, record, run=None) -> dict:
    """A job's references and phase, once evaluation is done: ``reference`` (:func:`mlmlab.data.ngram.cached_reference`)
    recorded as results.json ``data.ngram_reference``, its metrics returned (:func:`reference_metrics`), and -- where
    the job has ``val/mlm_loss_<suffix>`` (objective=mlm, none) -- ``phase`` recorded, logged and put in the W&B
    summary (``run``)."""
    out = reference_metrics(reference, suffix)
    record.data.setdefault("data", {})["ngram_reference"] = {k: v for k, v in reference.items() if k != "built"} | {
        "reused": not reference.get("built", False)}
    key = f"val/mlm_loss_{suffix}"
    loss = metrics.get(key)
    if loss is None or not all(math.isfinite(float(v)) for v in (loss, *out.values())):
        return out
    rec = phase_record(loss, out[f"val/unigram_loss_{suffix}"], out[f"val/bigram_loss_{suffix}"], margin, key)
    record.set(phase=rec)
    log.info("phase: %s (%s %.4f; unigram %.4f, bigram %.4f nats; eval.phase_margin=%g)", rec["label"], key, loss,
             rec["unigram"], rec["bigram"], margin)
    if run is not None:
        try:
            run.summary["phase"] = rec["label"]
        except Exception as e:  # W&B is never the only copy
            log.error("W&B summary failed (%s: %s); results.json has the phase", type(e).__name__, e)
    return out


# -------------------------------------------------------------------------------------------- the validation curve


def reach(curve: list[dict], threshold: float, key: str = "val/mlm_loss_r15") -> dict | None:
    """Where a job's validation curve (results.json ``val_curve``) first reaches ``key <= threshold``: ``{step,
    tokens, train_s}`` interpolated linearly between that pass and the one before it (from step 0 at the first), or
    None where it never does. ``train_s``: seconds of training, validation left out (mlmlab.lit.calibrate)."""
    prev = None
    for row in curve:
        if key not in row or not math.isfinite(row[key]):
            continue
        if row[key] <= threshold:
            if prev is None or prev[key] == row[key]:
                return {k: row[k] for k in ("step", "tokens", "train_s")}
            f = (prev[key] - threshold) / (prev[key] - row[key])
            return {k: prev[k] + f * (row[k] - prev[k]) for k in ("step", "tokens", "train_s")}
        prev = row
    return None


def loss_at(curve: list[dict], seconds: float, key: str = "val/mlm_loss_r15") -> float | None:
    """The validation curve's ``key`` after ``seconds`` of training, interpolated linearly between the passes around
    it; None before the first pass or after the last (the job did not train that long)."""
    rows = [r for r in curve if key in r and math.isfinite(r[key])]
    for a, b in zip(rows, rows[1:]):
        if a["train_s"] <= seconds <= b["train_s"]:
            span = b["train_s"] - a["train_s"]
            return a[key] if span <= 0 else a[key] + (seconds - a["train_s"]) / span * (b[key] - a[key])
    return rows[0][key] if rows and rows[0]["train_s"] == seconds else None


# ------------------------------------------------------------------------------------------------- existing records


def _typed(cls, node: dict):
    """A recorded group as its current owner's dataclass (keys the schema no longer has left out)."""
    from dataclasses import fields

    from omegaconf import OmegaConf

    known = {f.name for f in fields(cls)}
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls),
                                               {k: v for k, v in (node or {}).items() if k in known}))


def _rebase(path: str | None, data_dir: str | None) -> str | None:
    """A recorded file that is not on this machine: the same tail of its path under ``data_dir``, if there."""
    if path is None or data_dir is None or Path(path).expanduser().exists():
        return path
    parts = Path(path).parts
    for i in range(1, len(parts)):
        q = Path(data_dir).expanduser().joinpath(*parts[i:])
        if q.exists():
            return str(q)
    return path


def recompute_reference(config: dict, data_dir: str | None = None, cache_dir: str | None = None) -> dict:
    """The n-gram references (:func:`mlmlab.data.ngram.cached_reference`) of a recorded job's config: its corpus,
    tokenizer and fixed evaluation masks rebuilt (all cached under ``cache_dir``; default env ``MLMLAB_CACHE_DIR``,
    else ``~/.cache/mlmlab``). ValueError where they cannot be: a job that started from ``init.*`` (its tokenizer is
    the start's)."""
    from types import SimpleNamespace

    from mlmlab.build import eval_masks
    from mlmlab.config import EvalConfig, eval_units
    from mlmlab.data.corpus import get_blocks
    from mlmlab.data.ngram import cached_reference
    from mlmlab.data.schema import DataConfig, TokenizerConfig
    from mlmlab.data.vocab_stats import make_sampler_context
    from mlmlab.masking.replacement import UniformSampler

    init = config.get("init") or {}
    if init.get("checkpoint") or init.get("pretrain"):
        raise ValueError("the job started from init.* (its tokenizer is the start's); rerun it to get its phase")
    if (config.get("objective") or {}).get("name") == "clm":
        raise ValueError("objective=clm has no fixed-mask MLM loss")
    data_dir = data_dir or os.environ.get("MLMLAB_DATA_DIR")
    cache_dir = cache_dir or os.environ.get("MLMLAB_CACHE_DIR") or "~/.cache/mlmlab"
    raw = dict(config["data"])
    raw["path"], raw["val_path"] = _rebase(raw.get("path"), data_dir), _rebase(raw.get("val_path"), data_dir)
    raw["mix"] = [{**s, **{k: _rebase(s.get(k), data_dir) for k in ("path", "val_path") if s.get(k)}}
                  for s in raw.get("mix") or []]
    d, t, e = _typed(DataConfig, raw), _typed(TokenizerConfig, config["tokenizer"]), _typed(EvalConfig, config["eval"])
    tok, blocks = get_blocks(d, t, cache_dir, {})
    val = {k: v[: d.max_val_blocks] for k, v in blocks["validation"].items()}
    ctx = make_sampler_context(d, t, SimpleNamespace(cache_dir=cache_dir, data_dir=data_dir), tok, blocks)
    unit = eval_units(e)[0]
    fixed = eval_masks(val, e, ctx, unit)
    return cached_reference(d, t, cache_dir, tok, blocks["train"], fixed, e, unit, ctx, UniformSampler(ctx).probs)


def phase_of_record(record: dict, margin: float | None = None, data_dir: str | None = None,
                    cache_dir: str | None = None) -> dict:
    """The ``phase`` of a results.json record (a dict): as recorded when it has one at this ``margin`` (None: the
    record's ``eval.phase_margin``, else 0.1); else from its metrics, with the references recomputed
    (:func:`recompute_reference`) when the record lacks them. ``source`` says which. ValueError where it has no
    fixed-mask MLM loss or the references cannot be recomputed."""
    from mlmlab.build import eval_suffix

    config = record.get("config") or {}
    ev = config.get("eval") or {}
    margin = float(ev.get("phase_margin", DEFAULT_MARGIN) if margin is None else margin)
    if record.get("phase") and float(record["phase"]["margin"]) == margin:
        return {**record["phase"], "source": "recorded"}
    suffix = eval_suffix(float(ev.get("rate", 0.15)), (ev.get("units") or ["token"])[0])
    metrics = record.get("metrics") or {}
    key = f"val/mlm_loss_{suffix}"
    if key not in metrics:
        raise ValueError(f"the record has no {key} (status {record.get('status')!r}, objective "
                         f"{(config.get('objective') or {}).get('name')!r})")
    names = (f"val/unigram_loss_{suffix}", f"val/bigram_loss_{suffix}")
    if all(n in metrics for n in names):
        unigram, bigram, source = metrics[names[0]], metrics[names[1]], "record's references"
    else:
        ref = recompute_reference(config, data_dir, cache_dir)
        unigram, bigram = ref["unigram"], ref["bigram"]
        source = f"references {'recomputed' if ref.get('built') else 'from the cache'} ({ref['cache']})"
    return {**phase_record(metrics[key], unigram, bigram, margin, key), "source": source}


def _records(source: str) -> list[Path]:
    p = Path(source).expanduser()
    if p.is_file():
        return [p]
    if (p / "results.json").is_file():
        return [p / "results.json"]
    found = sorted(p.rglob("results.json")) if p.is_dir() else []
    if not found:
        raise FileNotFoundError(f"{source}: no results.json there (a run dir, a results.json or a sweep dir)")
    return found


PROG = "python -m mlmlab.phase"
OPTIONS = {
    "source": Opt("a run dir, its results.json, or a sweep dir (every results.json under it; also the first bare "
                  "argument)", required=True),
    "also": Opt("further sources", many=True),
    "margin": Opt("eval.phase_margin in nats (default: each record's, else 0.1)", type=float),
    "data_dir": Opt("where the recorded corpora are looked for when their paths are not here (default env "
                    "MLMLAB_DATA_DIR)"),
    "cache_dir": Opt("the cache of tokenizers, blocks and references (default env MLMLAB_CACHE_DIR, else "
                     "~/.cache/mlmlab)"),
    "write": Opt("also merge each phase into this JSON file, keyed by the record's path relative to the file's folder "
                 "(docs/results/phases.json: what mlmlab.report reads for published records made before the phase)"),
}


def _main(a) -> int:
    if a.margin is not None and not (math.isfinite(a.margin) and a.margin >= 0):
        print(f"{PROG}: margin={a.margin:g} must be a finite number of nats >= 0", file=sys.stderr)
        return 2
    failed = 0
    out = Path(a.write) if a.write else None
    written = json.loads(out.read_text()) if out is not None and out.is_file() else {}
    for source in [a.source, *(a.also or [])]:
        try:
            paths = _records(source)
        except FileNotFoundError as e:
            print(f"{PROG}: {e}", file=sys.stderr)
            return 2
        for path in paths:
            try:
                ph = phase_of_record(json.loads(path.read_text()), a.margin, a.data_dir, a.cache_dir)
            except Exception as e:  # one record that cannot be read never hides the others
                failed += 1
                print(f"{path}: no phase ({type(e).__name__}: {e})")
                continue
            print(f"{path}: {ph['label']} ({ph['metric']} {ph['mlm_loss']:.4f}, unigram {ph['unigram']:.4f}, "
                  f"bigram {ph['bigram']:.4f}, margin {ph['margin']:g}; {ph['source']})")
            if out is not None:
                rel = os.path.relpath(path.resolve(), out.resolve().parent)
                written[rel] = {k: v for k, v in ph.items() if k != "source"} | {
                    "source": "recorded" if ph["source"] == "recorded" else "python -m mlmlab.phase"}
    if out is not None:
        out.write_text(json.dumps(dict(sorted(written.items())), indent=1) + "\n")
        print(f"wrote {out} ({len(written)} records)")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli_run(_main, argv, OPTIONS, PROG, positional="source")


if __name__ == "__main__":
    raise SystemExit(main())
