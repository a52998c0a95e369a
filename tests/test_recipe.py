"""The learning-rate recipe: ``optim.warmup_frac`` sets the warmup as a share of the run, then the linear decay."""

import pytest

from mlmlab.lit.optim import lr_factor, warmup_steps

OPTIM = {"warmup_steps": 7, "warmup_frac": 0.1}


def test_warmup_frac_is_a_share_of_the_run_and_overrides_warmup_steps():
    assert warmup_steps(OPTIM, 100) == 10
    assert warmup_steps(OPTIM, 1234) == 123  # rounded
    assert warmup_steps({**OPTIM, "warmup_frac": None}, 100) == 7
    assert warmup_steps({"warmup_steps": 7}, 100) == 7


@pytest.mark.parametrize(("step", "factor"), [(0, 0.1), (4, 0.5), (9, 1.0), (10, 1.0), (55, 0.5), (99, 1 / 90)])
def test_linear_schedule_with_warmup_frac(step, factor):
    total = 100
    assert lr_factor(step, warmup_steps(OPTIM, total), total, "linear") == pytest.approx(factor, abs=1e-12)
