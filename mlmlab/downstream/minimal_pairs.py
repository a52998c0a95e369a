"""Minimal-pairs tasks (BLiMP) wired to the zero-shot scorers of mlmlab.zeroshot: the fixed subsample, the metrics and
the per-pair report."""

from __future__ import annotations

import logging

from mlmlab.data.tasks import TaskSource, TaskSpec

log = logging.getLogger(__name__)


def subsample_pairs(pairs: list[dict], n: int | None) -> list[dict]:
    """The same ``n`` pairs of each paradigm in every run (a seeded draw per paradigm, file order kept); None: all."""
    import random

    if n is None:
        return pairs
    by_par: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        by_par.setdefault(p["paradigm"], []).append(i)
    keep: list[int] = []
    for par, idx in by_par.items():
        keep += idx if len(idx) <= n else sorted(random.Random(f"{par}:0").sample(idx, n))
    return [pairs[i] for i in sorted(keep)]


def zeroshot_task(z, src: TaskSource, tok, spec: TaskSpec, lm, precision: str,
                  unigram_counts=None) -> tuple[dict[str, float], dict]:
    """A minimal-pairs task (mlmlab.zeroshot): accuracy overall (mean over paradigms), per field and per paradigm
    (``downstream/<task>/acc``, ``.../field/<field>/acc``, ``.../paradigm/<paradigm>/acc``); with ``unigram_counts``
    also the unigram floor (``unigram/<task>/...``). The report keeps the per-pair outcomes as one string
    (``items``: ``1`` right, ``0`` wrong, ``-`` tie, in the order of the subsample) for paired per-item tests.
    ``z``: ``downstream.zeroshot.*``; ``src``: where the task's pairs come from."""
    import time

    from mlmlab import zeroshot as zs

    if lm is None:
        raise ValueError(f"task {spec.name} is scored zero-shot and needs the pretrained language model")
    pairs = subsample_pairs(spec.load(src)["pairs"], z.n_per_paradigm)
    t0 = time.perf_counter()
    kind = zs.lm_kind(lm)
    scores = zs.sentence_scores(lm, tok, [p["good"] for p in pairs] + [p["bad"] for p in pairs], z.pll,
                                z.batch_size, precision)
    right = zs.judge(scores[: len(pairs)], scores[len(pairs):], pairs)
    summary = zs.summarize(pairs, right)
    seconds = time.perf_counter() - t0
    scorer = ("summed next-token log-probability (causal LM)" if kind == "clm" else
              f"pseudo-log-likelihood, {z.pll}" + (" (ELECTRA: the generator)" if hasattr(lm, "generator") else ""))
    metrics = _zeroshot_keys(f"downstream/{spec.name}", summary)
    report = {"kind": "minimal_pairs", "scorer": scorer, "n_per_paradigm": z.n_per_paradigm, "pairs": len(pairs),
              "ties": summary["ties"], "unk_pairs": zs.unk_pairs(tok, pairs), "acc": summary["acc"],
              "fields": summary["fields"], "paradigms": summary["paradigms"], "seconds": seconds,
              "source": spec.load(src).get("source"),
              "predictions": {"items": "".join("-" if r is None else str(r) for r in right),
                              "pair_ids": [[p["paradigm"], p["pair_id"]] for p in pairs]}}
    if unigram_counts is not None:
        uni = zs.unigram_scores(unigram_counts, tok, [p["good"] for p in pairs] + [p["bad"] for p in pairs])
        u_right = zs.judge(uni[: len(pairs)], uni[len(pairs):], pairs)
        u = zs.summarize(pairs, u_right)
        metrics.update(_zeroshot_keys(f"unigram/{spec.name}", u))
        report["unigram"] = {"acc": u["acc"], "fields": u["fields"], "vs_unigram": zs.mcnemar(right, u_right)}
        report["predictions"]["unigram_items"] = "".join("-" if r is None else str(r) for r in u_right)
    log.info("zero-shot %s: acc %.4f over %d pairs (%d ties, %d with [UNK]) in %.1f s", spec.name, summary["acc"],
             len(pairs), summary["ties"], report["unk_pairs"], seconds)
    return metrics, report


def _zeroshot_keys(prefix: str, summary: dict) -> dict[str, float]:
    from mlmlab.zeroshot import slug

    out = {f"{prefix}/acc": summary["acc"]}
    out.update({f"{prefix}/field/{slug(k)}/acc": v for k, v in summary["fields"].items()})
    out.update({f"{prefix}/paradigm/{k}/acc": v for k, v in summary["paradigms"].items()})
    return out
