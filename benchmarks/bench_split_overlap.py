"""How much of a task's held-out selection split occurs verbatim in the text it is trained on.

``downstream.score_split=selection`` scores a part held out of train (``mlmlab.data.tasks.hold_out``). A seeded random
tenth, for a task whose training set holds pieces of the same texts -- SST-2's training set is the treebank's phrases,
many of them parts of one sentence -- shares its text with the rest; a task declaring ``phrases: true`` (SST-2) is held
out by sentence instead (``hold_out_sentences``). This counts, over every held-out example with at least
``--min-words`` words, how many occur verbatim inside a training example, for both ways of holding out and for the
task's reported split (GLUE dev for SST-2).

    python benchmarks/bench_split_overlap.py --task sst2          # needs ../shared/data (MLMLAB_DATA_DIR)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from _common import REPO_ROOT, machine, versions, write_result


def overlap(held: list[str], train: list[str], min_words: int) -> dict:
    """Of ``held`` texts with >= ``min_words`` words, how many occur inside some ``train`` text (word boundaries)."""
    corpus = "\n".join(f" {t} " for t in train)
    long = [t for t in held if len(t.split()) >= min_words]
    inside = sum(1 for t in long if f" {t} " in corpus)
    return {"examples": len(held), "at_least_min_words": len(long), "inside_train": inside,
            "share": inside / len(long) if long else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="sst2")
    p.add_argument("--min-words", type=int, default=4)
    p.add_argument("--data-dir", default=os.environ.get("MLMLAB_DATA_DIR", str(REPO_ROOT.parent / "shared" / "data")))
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    sys.path.insert(0, str(REPO_ROOT))
    from mlmlab.config import DownstreamConfig
    from mlmlab.data.tasks import hold_out, hold_out_sentences

    root = Path(a.data_dir) / a.task
    read = lambda f: [json.loads(x) for x in (root / f).read_text().splitlines() if x.strip()]  # noqa: E731
    key = "sentence" if a.task == "sst2" else "text"
    train_rows, reported = read("train.jsonl"), read("validation.jsonl")
    frac = DownstreamConfig().val_fraction
    train, held = hold_out(train_rows, frac)
    by_sentence = hold_out_sentences([{"text": r[key]} for r in train_rows], frac)
    text = lambda rows: [" ".join(str(r.get(key, r.get("text"))).split()) for r in rows]  # noqa: E731
    rows = {"selection (a random tenth of train)": overlap(text(held), text(train), a.min_words),
            "selection (held out by sentence)": overlap(text(by_sentence[1]), text(by_sentence[0]), a.min_words),
            "reported (validation.jsonl)": overlap(text(reported), text(train), a.min_words)}
    payload = {"machine": machine(), "versions": versions(), "task": a.task, "min_words": a.min_words,
               "val_fraction": frac, "rows": rows}
    path = write_result(f"split_overlap_{a.task}", payload, a.out)
    for name, r in rows.items():
        print(f"{name}: {r['inside_train']} of {r['at_least_min_words']} ({r['share']:.1%}) inside a training text")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
