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


@pytest.mark.parametrize(("step", "factor"), [(0, 0.1), (9, 1.0), (50, 1.0), (79, 1.0), (80, 1.0), (90, 0.5),
                                              (99, 0.05), (120, 0.0)])
def test_wsd_schedule_is_flat_then_decays_over_its_last_share(step, factor):
    """optim.schedule=wsd: warmup, the peak lr held, then linear to 0 over the last optim.decay_frac of the run."""
    total = 100
    assert lr_factor(step, warmup_steps(OPTIM, total), total, "wsd", decay_frac=0.2) == pytest.approx(factor, abs=1e-12)


def test_wsd_schedule_is_validated_and_drives_the_optimizer(cfg_factory):
    from mlmlab.config import ConfigError, validate

    with pytest.raises(ConfigError, match=r"optim.decay_frac=0.0 must be in \(0, 1\]"):
        validate(cfg_factory("optim.schedule=wsd", "optim.decay_frac=0.0"))
    with pytest.raises(ValueError, match="needs decay_frac"):
        lr_factor(50, 0, 100, "wsd")
    import torch
    from omegaconf import OmegaConf

    from mlmlab.lit.optim import adamw_from_cfg

    o = OmegaConf.to_container(cfg_factory("optim.schedule=wsd", "optim.decay_frac=0.5", "optim.warmup_steps=0").optim)
    sched = adamw_from_cfg(torch.nn.Linear(2, 2), o, total=10)["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(10):
        lrs.append(sched.get_last_lr()[0] / o["lr"])
        sched.optimizer.step()
        sched.step()
    assert lrs == pytest.approx([1, 1, 1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2])
