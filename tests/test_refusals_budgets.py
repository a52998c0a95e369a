"""Issue 54, item 5: a budget that contradicts trainer.max_steps on the command line, or plans an absurd number of
steps, is refused before any data work naming the keys; the plan (steps, tokens, FLOPs) is said before training."""

from __future__ import annotations

import json
import logging

import pytest
from conftest import run_cli

from mlmlab import pretrain_job as train
from mlmlab.config import ConfigError, validate


@pytest.mark.parametrize("overrides,message", [
    (["trainer.budget.flops=1e30"], r"trainer.budget.flops=1e\+30 plans .* optimizer steps or more; allowed: at most "
                                    r"1e\+08 steps"),
    (["trainer.budget.tokens=1e20"], r"trainer.budget.tokens=1e\+20 plans .* allowed: at most 1e\+08"),
    (["trainer.max_steps=1000000000"], r"trainer.max_steps=1000000000 plans 1e\+09 optimizer steps or more"),
])
def test_an_absurd_budget_is_refused_at_validation(cfg_factory, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(cfg_factory(*overrides))
    validate(cfg_factory("trainer.budget.flops=1e13"))  # a real budget passes


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_max_steps_beside_a_budget_on_the_command_line_is_refused_before_data(tmp_path, cache_dir):
    p = run_cli(["debug=fast", "logger=none", "trainer.budget.seconds=30", "trainer.max_steps=10",
                 f"hydra.run.dir={tmp_path / 'run'}"], cache_dir, full_error=False)
    assert p.returncode != 0
    assert ("error: trainer.max_steps=10 and trainer.budget.seconds=30 both set the length of training; set one "
            "(a budget replaces trainer.max_steps: add trainer.budget.seconds=null to train the steps)") in p.stderr
    rec = json.loads((tmp_path / "run" / "results.json").read_text())
    assert rec["status"] == "failed" and "data" not in rec  # refused before the corpus was read


def test_the_plan_is_said_before_training(cfg_factory, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="mlmlab.pretraining"):
        train(cfg_factory("trainer.budget.tokens=4096", "downstream=none", "logger=none", output_dir=tmp_path / "r"))
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("pretraining plan"))
    rec = json.loads((tmp_path / "r" / "results.json").read_text())
    steps = rec["budget"]["steps"]
    assert line.startswith(f"pretraining plan (trainer.budget.tokens=4096): {steps} steps, ") and "FLOPs" in line
    assert rec["metrics"]["train/steps"] == steps
