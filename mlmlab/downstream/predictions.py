"""Per-item predictions moved out of the run record into ``<run dir>/predictions/<arm>.json``."""

from __future__ import annotations


def save_predictions(out_dir, record) -> None:
    """Move the per-item predictions out of the run record into ``<run dir>/predictions/<arm>.json`` (arm: pretrained,
    random_init), one entry per task key: the reported split, its truth, the chosen lr and each fine-tuning seed's
    predicted labels (NER: tag ids per word), the probe's, or a zero-shot task's outcomes (``1`` right, ``0`` wrong,
    ``-`` tie per pair). ``mlmlab.analysis`` pairs two such files item by item (McNemar, paired bootstrap)."""
    import json
    from pathlib import Path

    for arm, section in (("pretrained", "downstream"), ("random_init", "downstream_random_init")):
        report = record.data.get(section) or {}
        preds = {k: r.pop("predictions") for k, r in report.items() if isinstance(r, dict) and "predictions" in r}
        if preds:
            d = Path(out_dir) / "predictions"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{arm}.json").write_text(json.dumps(preds, separators=(",", ":")))
