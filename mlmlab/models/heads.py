"""Heads on top of the encoder: the (sparse) MLM head, ELECTRA's replaced-token-detection head and a sequence
classification head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PredictionHeadTransform(nn.Module):
    """dense (d_in -> hidden) + GELU + LayerNorm. ``d_in`` differs from ``hidden_size`` only for ELECTRA's generator,
    whose head maps its narrow hidden states to the (shared) embedding width."""

    def __init__(self, hidden_size: int, eps: float, d_in: int | None = None):
        super().__init__()
        self.dense = nn.Linear(d_in or hidden_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class LMPredictionHead(nn.Module):
    """transform -> decoder whose weight is the (tied) word-embedding matrix, plus a per-token bias."""

    def __init__(self, hidden_size: int, vocab_size: int, eps: float, d_in: int | None = None):
        super().__init__()
        self.transform = PredictionHeadTransform(hidden_size, eps, d_in)
        self.decoder = nn.Linear(hidden_size, vocab_size)
        self.bias = self.decoder.bias  # one parameter under both names, as in BertForMaskedLM

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))


class MLMHead(nn.Module):
    """Named like transformers' ``BertOnlyMLMHead`` so state dicts line up (``cls.predictions.*``)."""

    def __init__(self, hidden_size: int, vocab_size: int, eps: float, d_in: int | None = None):
        super().__init__()
        self.predictions = LMPredictionHead(hidden_size, vocab_size, eps, d_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predictions(x)


class RTDHead(nn.Module):
    """ELECTRA's discriminator head: dense + GELU + a single logit per token ("was this token replaced?")."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.dense(x))).squeeze(-1)


POOLINGS = ("mean", "cls", "last")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """``(batch, seq, hidden)`` -> ``(batch, hidden)``: [CLS], the last real token, or the mean over real tokens."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":
        last = (attention_mask.long().sum(1) - 1).clamp(min=0) if attention_mask is not None else None
        return hidden[:, -1] if last is None else hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    if attention_mask is None:
        return hidden.mean(1)
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


class ClassificationHead(nn.Module):
    """Pooled vector ([CLS], or the mean over real tokens) -> dropout -> dense+tanh -> dropout -> logits.

    Mean pooling is the default: an MLM-pretrained encoder never trains its [CLS] output, so with few labelled
    examples and few steps the mean over tokens transfers the pretrained word representations far better. ``last`` reads
    the last real token (GPT-style, for a causal encoder: the only position that has seen the whole input)."""

    def __init__(self, hidden_size: int, num_labels: int, dropout: float, pooling: str = "mean"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r}; allowed: {', '.join(POOLINGS)}")
        self.pooling = pooling
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.out_proj = nn.Linear(hidden_size, num_labels)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.dropout(pool(hidden, attention_mask, self.pooling))
        x = self.dropout(torch.tanh(self.dense(x)))
        return self.out_proj(x)
