"""Training FLOPs from model shapes, and budgets (`trainer.budget.tokens` / `trainer.budget.flops`) turned into steps.

Counts are matmul FLOPs (2 per multiply-add), the convention of Kaplan et al. and of ``torch.utils.flop_counter``;
layer norms, softmax, GELU and embedding lookups are ignored (a few percent at these shapes). A training step is
forward + backward = 3 x forward. The MLM head is sparse: its transform and decoder run only on predicted positions, so
the head's cost scales with the prediction rate (``tests/test_flops.py`` checks the formula against FlopCounterMode).
"""

from __future__ import annotations

import math


def encoder_forward_flops(batch: int, seq: int, hidden: int, layers: int, intermediate: int) -> float:
    """Forward FLOPs of the encoder stack for ``batch`` sequences of ``seq`` tokens."""
    tokens = batch * seq
    dense = 2 * tokens * (4 * hidden * hidden + 2 * hidden * intermediate)  # Q, K, V, attention output; FFN in and out
    attention = 2 * 2 * batch * seq * seq * hidden  # Q K^T and attention x V
    return float(layers * (dense + attention))


def mlm_head_forward_flops(n_predicted: float, hidden: int, vocab: int) -> float:
    """Transform (hidden x hidden) + tied decoder (hidden x vocab) on the predicted positions only."""
    return float(2 * n_predicted * (hidden * hidden + hidden * vocab))


def mlm_step_flops(model, vocab: int, batch: int, seq: int, predict_frac: float) -> float:
    """FLOPs of one MLM training step (fwd + bwd) with ``predict_frac`` of the positions predicted."""
    enc = encoder_forward_flops(batch, seq, model.hidden_size, model.num_layers, model.intermediate_size)
    head = mlm_head_forward_flops(predict_frac * batch * seq, model.hidden_size, vocab)
    return 3.0 * (enc + head)


def mean_predict_rate(schedule, mask_cfg, total_steps: int) -> float:
    """Average predicted fraction over a run of ``total_steps`` (the schedule's mean, or predict_rate if set)."""
    if mask_cfg.predict_rate is not None:
        return float(mask_cfg.predict_rate)
    n = max(1, min(total_steps, 1000))
    return sum(schedule(int(i * total_steps / n), total_steps) for i in range(n)) / n


def steps_for_budget(cfg, vocab: int, schedule, candidate_frac: float) -> tuple[int, dict]:
    """``trainer.max_steps`` unless ``trainer.budget.tokens`` or ``.flops`` is set; returns (steps, accounting)."""
    t, d = cfg.trainer, cfg.data
    tokens_per_step = d.batch_size * d.max_seq_len * t.accumulate_grad_batches
    b = t.budget
    if b.tokens is None and b.flops is None:
        steps = t.max_steps
    elif b.tokens is not None:
        steps = math.floor(b.tokens / tokens_per_step)
        if steps < 1:
            raise ValueError(f"trainer.budget.tokens={b.tokens:g} is smaller than one step "
                             f"({tokens_per_step} tokens = data.batch_size x data.max_seq_len x accumulate_grad_batches)")
    else:
        steps = 1000
        for _ in range(3):  # the mean rate of a schedule depends on the run length: iterate to a fixed point
            steps = math.floor(b.flops / _per_step(cfg, vocab, schedule, candidate_frac, steps))
            if steps < 1:
                raise ValueError(f"trainer.budget.flops={b.flops:g} is smaller than one step "
                                 f"({_per_step(cfg, vocab, schedule, candidate_frac, 1):.3g} FLOPs)")
    per_step = _per_step(cfg, vocab, schedule, candidate_frac, steps)
    return steps, {"steps": steps, "tokens": steps * tokens_per_step, "flops_per_step": per_step,
                   "flops": steps * per_step}


def _per_step(cfg, vocab: int, schedule, candidate_frac: float, steps: int) -> float:
    rate = mean_predict_rate(schedule, cfg.mask, steps) * candidate_frac
    return mlm_step_flops(cfg.model, vocab, cfg.data.batch_size * cfg.trainer.accumulate_grad_batches,
                          cfg.data.max_seq_len, rate)
