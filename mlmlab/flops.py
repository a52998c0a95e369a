"""Training FLOPs from model shapes, and budgets (`trainer.budget.tokens` / `trainer.budget.flops`) turned into steps.

Counts are matmul FLOPs (2 per multiply-add), the convention of Kaplan et al. and of ``torch.utils.flop_counter``;
layer norms, softmax, GELU, sampling and embedding lookups are ignored (a few percent at these shapes). A training step
is forward + backward = 3 x forward, per objective (``tests/test_flops.py`` and ``tests/test_objectives.py`` check
each against FlopCounterMode):

- mlm: encoder + the sparse MLM head (transform + decoder on the predicted positions only);
- electra: generator (embedding projection, its narrower stack, its sparse head on the masked positions) + discriminator
  encoder + RTD head on the real non-special tokens;
- clm: encoder + the LM head on every position whose next token is real. Causal attention is counted as full attention:
  that is what the CPU kernels and FlopCounterMode compute (a flash kernel on a GPU skips the masked half).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


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


def electra_step_flops(model, objective, vocab: int, batch: int, seq: int, predict_frac: float,
                       candidate_frac: float) -> float:
    """FLOPs of one ELECTRA step: generator on ``predict_frac`` masked positions, RTD head on ``candidate_frac``."""
    from mlmlab.models.electra import generator_shape

    h = model.hidden_size
    g = generator_shape(h, model.num_heads, model.intermediate_size, model.num_layers, objective.generator_size,
                        objective.generator_layers)
    tokens = batch * seq
    disc = encoder_forward_flops(batch, seq, h, model.num_layers, model.intermediate_size)
    rtd = 2 * candidate_frac * tokens * (h * h + h)
    gen = encoder_forward_flops(batch, seq, g["hidden_size"], g["num_layers"], g["intermediate_size"])
    project = 2 * tokens * h * g["hidden_size"] if g["hidden_size"] != h else 0
    n_pred = predict_frac * tokens  # the generator's head: transform (g_hidden -> h) + tied decoder (h -> vocab)
    gen_head = 2 * n_pred * (g["hidden_size"] * h + h * vocab)
    return 3.0 * (disc + rtd + gen + project + gen_head)


def clm_step_flops(model, vocab: int, batch: int, seq: int, token_frac: float) -> float:
    """FLOPs of one causal-LM step: the head on the ``token_frac`` of the ``seq - 1`` next-token positions."""
    enc = encoder_forward_flops(batch, seq, model.hidden_size, model.num_layers, model.intermediate_size)
    head = mlm_head_forward_flops(token_frac * batch * (seq - 1), model.hidden_size, vocab)
    return 3.0 * (enc + head)


@dataclass
class StepCost:
    """What one optimizer step computes: ``objective.*`` and ``model.*`` (the shapes), the tokens of a step (``batch``
    = data.batch_size x accumulation x data-parallel processes, ``seq`` = data.max_seq_len), and the share of positions
    each head sees -- the predicted share from the rate ``schedule`` over the run (or ``predict_rate``),
    ``candidate_frac`` (real non-special tokens: what masking can select), ``token_frac`` (real next-token targets)."""
    model: Any
    objective: Any
    vocab: int
    batch: int
    seq: int
    schedule: Any
    predict_rate: float | None
    candidate_frac: float
    token_frac: float = 1.0

    def flops(self, steps: int) -> float:
        """FLOPs of one step of a run of ``steps`` steps (the mean rate of a schedule depends on the run's length)."""
        predict = mean_predict_rate(self.schedule, self.predict_rate, steps) * self.candidate_frac
        b, s, name = self.batch, self.seq, self.objective.name
        if name == "electra":
            return electra_step_flops(self.model, self.objective, self.vocab, b, s, predict, self.candidate_frac)
        if name == "clm":
            return clm_step_flops(self.model, self.vocab, b, s, self.token_frac)
        return mlm_step_flops(self.model, self.vocab, b, s, predict)  # (objective=none never gets here: no steps)


def mean_predict_rate(schedule, predict_rate: float | None, total_steps: int) -> float:
    """Average predicted fraction over a run of ``total_steps`` (the schedule's mean, or ``mask.predict_rate`` if
    set)."""
    if predict_rate is not None:
        return float(predict_rate)
    n = max(1, min(total_steps, 1000))
    return sum(schedule(int(i * total_steps / n), total_steps) for i in range(n)) / n


def world_size(t) -> int:
    """Data-parallel processes a Trainer built from ``trainer.*`` will run (each one a batch per micro-step)."""
    d = t.devices
    if isinstance(d, str) and d.strip().lstrip("-").isdigit():
        d = int(d)
    if isinstance(d, int) and d > 0:
        n = d
    elif isinstance(d, int) or d == "auto":  # -1 / "auto": every visible GPU when running on GPUs, else one process
        import torch

        n = torch.cuda.device_count() if t.accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available() else 1
    else:  # a list of device indices
        n = len(d)
    return max(1, n) * t.num_nodes


MAX_PLANNED_STEPS = 10**8  # more is a budget typed wrong (1e30 FLOPs): refused (mlmlab.config._check_budget_size)


def steps_for_budget(t, cost: StepCost, steps: int | None = None) -> tuple[int, dict]:
    """``trainer.max_steps`` (of ``trainer.*``, ``t``) unless ``trainer.budget.tokens`` or ``.flops`` is set, or
    ``steps`` is given (a seconds budget's calibrated count); returns (steps, accounting)."""
    if cost.objective.name == "none":
        return 0, {"steps": 0, "tokens": 0, "flops_per_step": 0.0, "flops": 0.0}
    tokens_per_step = cost.batch * cost.seq
    b = t.budget
    if steps is not None:
        pass
    elif b.tokens is None and b.flops is None:
        steps = t.max_steps
    elif b.tokens is not None:
        steps = math.floor(b.tokens / tokens_per_step)
        if steps < 1:
            raise ValueError(f"trainer.budget.tokens={b.tokens:g} is smaller than one step ({tokens_per_step} tokens = "
                             "data.batch_size x data.max_seq_len x accumulate_grad_batches x devices)")
    else:
        steps = 1000
        for _ in range(3):  # the mean rate of a schedule depends on the run length: iterate to a fixed point
            steps = math.floor(b.flops / cost.flops(steps))
            if steps < 1:
                raise ValueError(f"trainer.budget.flops={b.flops:g} is smaller than one step of objective="
                                 f"{cost.objective.name} ({cost.flops(1):.3g} FLOPs)")
    if steps > MAX_PLANNED_STEPS:
        what = next((f"trainer.budget.{k}={getattr(b, k):g}" for k in ("tokens", "flops", "seconds")
                     if getattr(b, k) is not None), f"trainer.max_steps={steps}")
        raise ValueError(f"{what} plans {steps:.3g} optimizer steps; allowed: at most {MAX_PLANNED_STEPS:.0e}")
    per_step = cost.flops(steps)
    return steps, {"steps": steps, "tokens": steps * tokens_per_step, "flops_per_step": per_step,
                   "flops": steps * per_step, "world_size": world_size(t)}


def step_cost(t, d, model, objective, mask, vocab: int, schedule, candidate_frac: float,
              token_frac: float = 1.0) -> StepCost:
    """The :class:`StepCost` of a job from its groups (``trainer``, ``data``, ``model``, ``objective``, ``mask``)."""
    return StepCost(model, objective, vocab, d.batch_size * t.accumulate_grad_batches * world_size(t), d.max_seq_len,
                    schedule, mask.predict_rate, candidate_frac, token_frac)
