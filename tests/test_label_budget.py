"""Label-budget curves (downstream.max_train_examples=[...]): one score per budget in a job, paired gains per budget,
the budget checked against the task's training split before pretraining, the curve read back by mlmlab.analysis."""

from __future__ import annotations

import pytest

from mlmlab import pretrain_job as train
from mlmlab.analysis import label_budget_curve, load_runs
from mlmlab.analysis import main as analysis_main
from mlmlab.config import ConfigError, validate


def test_label_budget_curve_in_a_job_and_in_the_analysis(cfg_factory, tmp_path, capsys):
    out = tmp_path / "run"
    m = train(cfg_factory("downstream.tasks=[builtin_sentiment]", "downstream.max_train_examples=[16,64]",
                          "downstream.random_init_baseline=true", "downstream.seeds=[0,1]", "logger=none",
                          output_dir=out))
    for n in (16, 64):
        assert {f"downstream/builtin_sentiment@{n}/acc", f"random_init/builtin_sentiment@{n}/acc",
                f"gain/builtin_sentiment@{n}/acc", f"downstream/builtin_sentiment@{n}/seed_1/acc"} <= set(m)
    assert "downstream/builtin_sentiment/acc" not in m
    assert m["downstream/score"] == m["downstream/builtin_sentiment@64/acc"]  # the largest budget
    curve = label_budget_curve(load_runs(out), "builtin_sentiment")
    assert list(curve.index) == [16, 64] and set(curve["unit"]) == {"fine-tuning seeds"}
    assert curve.loc[64, "mean"] == pytest.approx(m["downstream/builtin_sentiment@64/acc"])
    gain = label_budget_curve(load_runs(out), "builtin_sentiment", prefix="gain")
    assert gain.loc[16, "mean"] == pytest.approx(m["gain/builtin_sentiment@16/acc"])
    png = tmp_path / "curve.png"
    assert analysis_main([str(out), "by=seed", "label_budget=builtin_sentiment", f"png={png}"]) == 0
    assert png.stat().st_size > 0 and "by label budget" in capsys.readouterr().out
    assert analysis_main([str(out), "label_budget=builtin_sentiment", "prefix=gain"]) == 0  # no by=


@pytest.mark.parametrize("value", ["[]", "[0,10]", "[10,10]", "0"])
def test_bad_label_budgets_rejected(value, cfg_factory):
    with pytest.raises(ConfigError) as e:
        validate(cfg_factory(f"downstream.max_train_examples={value}"))
    assert "downstream.max_train_examples=" in str(e.value) and "label-budget curve" in str(e.value)


def test_a_budget_larger_than_the_train_split_fails_before_pretraining(cfg_factory, tmp_path):
    with pytest.raises(ConfigError) as e:
        train(cfg_factory("downstream.tasks=[builtin_sentiment]", "downstream.max_train_examples=[16,100000]",
                          "logger=none", output_dir=tmp_path / "big"))
    assert "downstream.max_train_examples: 100000 for task builtin_sentiment is more than its" in str(e.value)
    assert not (tmp_path / "big" / "checkpoints" / "last.ckpt").exists()
