"""Issue 54 item 10: keys a job records but does not read are said (mask.span.* under mask.unit=pmi, mask.pmi.*
under mask.unit=token), and a task whose text the encoder's tokenizer does not fit ([UNK] share) is said."""

import logging

import pytest

from mlmlab.data.tokenizer import CLS, SEP, UNK
from mlmlab.downstream.protocol import UNK_WARN, unk_fraction
from mlmlab.pretraining import dead_mask_keys


@pytest.mark.parametrize("unit,overrides,dead", [
    ("pmi", ["mask.unit=pmi", "mask.span.p=0.3", "mask.pmi.min_count=3"], ["mask.span.p=0.3"]),
    ("token", ["mask.pmi.min_count=3", "+mask.span.max_len=4", "mask.rate=0.3"],
     ["mask.pmi.min_count=3", "+mask.span.max_len=4"]),
    ("span", ["mask.span.p=0.3"], []),
    ("word", [], []),
])
def test_mask_keys_the_unit_does_not_read_are_named(unit, overrides, dead):
    assert dead_mask_keys(overrides, unit) == dead


def test_unk_share_of_a_task_s_inputs(caplog):
    items = [{"input_ids": [CLS, 7, UNK, 9, SEP]}, {"input_ids": [CLS, UNK, SEP]}]
    assert unk_fraction(items) == pytest.approx(2 / 4)  # [CLS] and [SEP] left out
    assert unk_fraction([{"input_ids": [CLS, 5, 6, SEP]}]) == 0.0 and 0 < UNK_WARN < 0.1


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_a_job_records_the_unk_share_and_warns_above_the_threshold(cfg_factory, tmp_path, caplog, monkeypatch):
    """Every fine-tuned task records its training inputs' [UNK] share; above UNK_WARN the job warns (WordPiece falls
    back to characters on the built-in corpus, so the threshold is lowered here to see the warning)."""
    import json

    import mlmlab.downstream.protocol as protocol
    from mlmlab import pretrain_job as train

    monkeypatch.setattr(protocol, "UNK_WARN", -1.0)
    with caplog.at_level(logging.WARNING, logger="mlmlab.downstream.protocol"):
        train(cfg_factory("trainer.max_steps=2", "downstream.tasks=[builtin_sentiment]", "downstream.seeds=[0]",
                          "logger=none", "downstream.finetune.epochs=1", output_dir=tmp_path / "r"))
    rec = json.loads((tmp_path / "r" / "results.json").read_text())
    share = rec["downstream"]["builtin_sentiment"]["unk_frac"]
    assert 0.0 <= share < 0.02  # the task's text is the corpus's language
    assert any(f"{100 * share:.1f}% of the training inputs' tokens are [UNK]" in r.getMessage() for r in caplog.records)
