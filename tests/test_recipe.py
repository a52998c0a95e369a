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


# ------------------------------------------------------------------------- layer-wise lr decay (issue 42, item 4)

def test_layer_decay_gives_each_depth_its_lr_and_none_keeps_one_lr():
    """ELECTRA's fine-tuning protocol: the head at lr, layer i of L at lr x d^(L - i), the embeddings at lr x d^(L + 1);
    BERT's no-decay split kept within each depth; the schedule scales every group's own lr."""
    from mlmlab.lit.finetune import FinetuneModule
    from mlmlab.lit.optim import layer_depth

    enc = {"vocab_size": 50, "hidden_size": 16, "num_layers": 3, "num_heads": 2, "intermediate_size": 32,
           "max_position_embeddings": 32, "norm": "pre"}
    m = FinetuneModule(enc, 2, 1e-3, 0.01, 0.0, 10, layer_decay=0.5)
    opt = m.configure_optimizers()["optimizer"]
    lr_of = {id(p): (g["lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}
    for name, p in m.model.named_parameters():
        d = layer_depth(name, 3)
        if name.startswith("bert.embeddings."):
            assert d == 0
        elif ".layer.2." in name:
            assert d == 3
        elif not name.startswith("bert."):
            assert d == 4  # the classifier
        assert lr_of[id(p)][0] == pytest.approx(1e-3 * 0.5 ** (4 - d)), name
        assert lr_of[id(p)][1] == (0.0 if p.ndim < 2 or "LayerNorm" in name.split(".") or d == 0 else 0.01), name
    assert len(lr_of) == sum(1 for _ in m.model.parameters())
    plain_opt = FinetuneModule(enc, 2, 1e-3, 0.01, 0.0, 10).configure_optimizers()["optimizer"]
    assert len(plain_opt.param_groups) == 2 and {g["lr"] for g in plain_opt.param_groups} == {1e-3}
