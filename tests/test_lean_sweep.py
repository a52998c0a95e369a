"""Lean sweeps (downstream.only_declared, issue 52): a job whose config declares its question (analysis.primary)
fine-tunes only the label budgets a declared metric reads, and the random-init comparator only where the regime gate
reads it (the primary metric's task and budget); results.json downstream.skipped says what was left out and why;
downstream.only_declared=false restores everything; skip_completed reruns a lean record whose question changed."""

from __future__ import annotations

import json

import pytest

from mlmlab import pretrain_job as train
from mlmlab.config import DownstreamConfig
from mlmlab.job import completed_metrics

TASK = "builtin_sentiment"
JOB = ["downstream.tasks=[builtin_sentiment]", "downstream.max_train_examples=[16,32]",
       "downstream.random_init_baseline=true", "downstream.seeds=[0]", "logger=none",
       f"analysis.primary=downstream/{TASK}@16/acc"]


def test_a_declared_question_fine_tunes_only_the_budgets_it_reads(cfg_factory, tmp_path):
    out = tmp_path / "lean"
    cfg = cfg_factory(*JOB, "skip_completed=true", output_dir=out)
    m = train(cfg)
    assert {f"downstream/{TASK}@16/acc", f"random_init/{TASK}@16/acc", f"gain/{TASK}@16/acc"} <= set(m)
    assert not [k for k in m if "@32" in k]  # neither the encoder nor random init at the budget nobody reads
    assert m["downstream/score"] == m[f"downstream/{TASK}@16/acc"]
    r = json.loads((out / "results.json").read_text())
    assert set(r["downstream"]) == {f"{TASK}@16", "skipped"}
    skipped = r["downstream"]["skipped"]
    assert skipped["budgets"] == [32] and "only_declared=false" in skipped["why"]
    assert set(r["downstream_random_init"]) <= {f"{TASK}@16", "reused_from"}
    # skip_completed: the same question reuses the record; one that reads the skipped budget runs the job again
    assert completed_metrics(cfg) == r["metrics"]
    wider = cfg_factory(*JOB, "skip_completed=true", f"analysis.family=[downstream/{TASK}@32/acc]", output_dir=out)
    assert completed_metrics(wider) is None


def test_only_declared_false_fine_tunes_every_budget(cfg_factory, tmp_path):
    out = tmp_path / "all"
    m = train(cfg_factory(*JOB, "downstream.only_declared=false", output_dir=out))
    for n in (16, 32):
        assert {f"downstream/{TASK}@{n}/acc", f"random_init/{TASK}@{n}/acc", f"gain/{TASK}@{n}/acc"} <= set(m)
    assert "skipped" not in json.loads((out / "results.json").read_text())["downstream"]


def test_the_comparator_runs_where_the_gate_reads_it_and_the_key_is_checked():
    ds = DownstreamConfig(tasks=["sst2", "blimp"], max_train_examples=[500, 4000], random_init_baseline=True)
    # the family reads 4,000 labels: both budgets fine-tuned, random init only at the primary's 500
    d = ds.declared("downstream/sst2@500/acc", ["downstream/sst2@4000/acc", "val/mlm_loss_r15"])
    assert d.encoder.max_train_examples == [500, 4000]
    assert (d.comparator.tasks, d.comparator.max_train_examples) == (["sst2"], [500])
    assert list(d.skipped) == ["random_init"]
    # a family metric that reads the comparator itself keeps it at its budget
    assert ds.declared("downstream/sst2@500/acc", ["gain/sst2@4000/acc"]).comparator.max_train_examples == [500, 4000]
    # a question that names no label budget or no task leaves everything; so does no question, or the opt-out
    for primary in ("downstream/score", "val/mlm_loss_r15", None):
        d = ds.declared(primary, [])
        assert d.encoder is ds and d.comparator is ds and d.skipped is None
    assert DownstreamConfig(only_declared=False).declared("downstream/sst2@500/acc").skipped is None
    with pytest.raises(ValueError, match="downstream.only_declared='yes'; allowed: true"):
        DownstreamConfig(only_declared="yes")  # (composed, Hydra's bool type rejects it first)
