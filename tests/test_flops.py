"""The FLOP formula against torch's FlopCounterMode, and budgets that turn into steps."""

import pytest
import torch
from omegaconf import OmegaConf
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from mlmlab import pretrain_job as train
from mlmlab.config import ConfigError, validate
from mlmlab.flops import mlm_step_flops
from mlmlab.models.encoder import BertForMLM, EncoderConfig


@pytest.mark.parametrize("vocab,predict_frac", [(512, 0.15), (4096, 0.4)])
def test_formula_matches_flop_counter(vocab, predict_frac):
    shape = OmegaConf.create({"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 256})
    model = BertForMLM(EncoderConfig(vocab_size=vocab, **shape, max_position_embeddings=128, dropout=0.0,
                                     attention_dropout=0.0))
    b, s = 4, 64
    ids = torch.randint(5, vocab, (b, s))
    labels = torch.full((b, s), -100)
    n_pred = int(predict_frac * b * s)
    labels.view(-1)[torch.randperm(b * s)[:n_pred]] = ids.view(-1)[:n_pred]
    # the math SDPA backend decomposes attention into bmm, which FlopCounterMode counts (the fused CPU kernel is not)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        loss, _, _ = model.mlm_loss(ids, torch.ones_like(ids, dtype=torch.bool), labels)
        loss.backward()
    counted = fc.get_total_flops()
    predicted = mlm_step_flops(shape, vocab, b, s, n_pred / (b * s))
    assert abs(predicted - counted) / counted < 1e-3, (predicted, counted)


def test_token_and_flop_budgets_set_the_steps(cfg_factory):
    quick = ["downstream.tasks=[]", "logger=none", "callbacks.checkpoint=false", "trainer.val_check_interval=5"]
    m = train(cfg_factory("trainer.budget.tokens=7000", *quick))  # debug=fast: batch 16 x seq 64 = 1024 tokens/step
    assert m["train/steps"] == 6 and m["budget/tokens"] == 6 * 1024
    m1 = train(cfg_factory("trainer.budget.flops=2e10", *quick))
    m2 = train(cfg_factory("trainer.budget.flops=2e10", "mask.rate=0.4", *quick))
    assert m1["budget/flops"] <= 2e10 and m2["budget/flops"] <= 2e10
    assert m2["train/steps"] < m1["train/steps"]  # more predicted positions: a costlier head, fewer steps


def test_bad_budgets_rejected(cfg_factory):
    with pytest.raises(ConfigError, match="at most one"):
        validate(cfg_factory("trainer.budget.tokens=1e6", "trainer.budget.flops=1e12"))
    with pytest.raises(ConfigError, match="trainer.budget.flops"):
        validate(cfg_factory("trainer.budget.flops=-1"))
    with pytest.raises(ConfigError, match="smaller than one step"):
        train(cfg_factory("trainer.budget.tokens=10", "logger=none"))
