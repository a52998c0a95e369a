"""A BERT-style encoder (learned or rotary positions, SDPA attention) with a tied MLM decoder, and the same encoder with a causal
mask as a next-token language model (``objective=clm``).

``norm="post"`` (BERT): LayerNorm after each residual sum. Parameter names follow transformers' ``BertForMaskedLM``
exactly, so ``BertForMLM().state_dict()`` loads into ``BertForMaskedLM`` (and back) with the same logits.
``norm="pre"`` (every budget recipe: cramming, Izsak et al. 2021, DinkyTrain): LayerNorm at the input of each
sub-layer and once after the last layer; the residual stream is never normalised, so gradients reach the lower layers
unscaled and a short, high-lr run leaves the unigram plateau. It is the block of transformers'
``RobertaPreLayerNormForMaskedLM`` (mlmlab.export maps the names). ``tests/test_encoder.py`` checks both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from mlmlab.models.heads import ClassificationHead, MLMHead

IGNORE_INDEX = -100
NORMS = ("post", "pre")
POSITIONS = ("learned", "rope")
ROPE_BASE = 10000.0


@dataclass
class EncoderConfig:
    vocab_size: int
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    norm: str = "post"  # post (BERT) | pre (LayerNorm before each sub-layer + a final LayerNorm)
    # learned (BERT: an absolute position embedding added to the input) | rope (rotary positions on each layer's
    # queries and keys, Su et al. 2021: attention sees relative offsets from the first step; no position embedding)
    position: str = "learned"
    causal: bool = False  # causal self-attention (objective=clm); inputs must be right-padded
    grad_checkpointing: bool = False  # training: keep only each layer's input, recompute the rest in backward

    @classmethod
    def from_model_cfg(cls, model_cfg, vocab_size: int, causal: bool = False) -> EncoderConfig:
        keys = set(cls.__dataclass_fields__) - {"vocab_size", "causal"}
        return cls(vocab_size=vocab_size, causal=causal, **{k: getattr(model_cfg, k) for k in keys})

    def __post_init__(self):
        if self.norm not in NORMS:
            raise ValueError(f"model.norm={self.norm!r} is not known; allowed: {', '.join(NORMS)}")
        if self.position not in POSITIONS:
            raise ValueError(f"model.position={self.position!r} is not known; allowed: {', '.join(POSITIONS)}")

    @property
    def pre_norm(self) -> bool:
        return self.norm == "pre"

    def to_dict(self) -> dict:
        return asdict(self)


class Embeddings(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        # rope: positions enter in the attention (SelfAttention), not here
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size) if c.position == "learned" else None
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(torch.arange(input_ids.shape[1], device=input_ids.device))[None]
        x = x + (self.token_type_embeddings.weight[0] if token_type_ids is None else self.token_type_embeddings(token_type_ids))
        return self.dropout(self.LayerNorm(x))


def rope_tables(t: int, head_dim: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``(t, head_dim)`` of the rotary angles ``pos * ROPE_BASE ** (-2i / head_dim)``, each frequency
    repeated over the two halves of a head (the GPT-NeoX / Llama layout that :func:`apply_rope` rotates)."""
    inv = ROPE_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    ang = torch.arange(t, dtype=torch.float32, device=device)[:, None] * inv[None]
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``(b, heads, t, head_dim)``: each pair (i, i + head_dim/2) by its position's angle, so that
    ``q_m . k_n`` depends on m - n only."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-x2, x1), dim=-1) * sin.to(x.dtype)


class SelfAttention(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.num_heads, self.p_drop = c.num_heads, c.attention_dropout
        self.rope = c.position == "rope"
        if self.rope and (c.hidden_size // c.num_heads) % 2:
            raise ValueError(f"model.position=rope needs an even head size; model.hidden_size={c.hidden_size} / "
                             f"model.num_heads={c.num_heads} is odd")
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """``attn_mask``: a boolean key mask ``(b, 1, 1, t)``, None (attend everywhere) or the string "causal"."""
        b, t, h = x.shape
        q, k, v = (m(x).view(b, t, self.num_heads, h // self.num_heads).transpose(1, 2) for m in (self.query, self.key, self.value))
        if self.rope:
            cos, sin = rope_tables(t, h // self.num_heads, x.device)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        causal = isinstance(attn_mask, str)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else attn_mask, is_causal=causal,
                                           dropout_p=self.p_drop if self.training else 0.0)
        return y.transpose(1, 2).reshape(b, t, h)


class SelfOutput(nn.Module):
    """dense -> dropout -> + residual; post-LN normalises the sum (BERT), pre-LN leaves the residual stream alone."""

    def __init__(self, c: EncoderConfig, d_in: int):
        super().__init__()
        self.dense = nn.Linear(d_in, c.hidden_size)
        self.LayerNorm = None if c.pre_norm else nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.dense(y)) + residual
        return x if self.LayerNorm is None else self.LayerNorm(x)


class Attention(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps) if c.pre_norm else None
        self.self = SelfAttention(c)
        self.output = SelfOutput(c, c.hidden_size)

    def forward(self, x, attn_mask):
        return self.output(self.self(x if self.LayerNorm is None else self.LayerNorm(x), attn_mask), x)


class Intermediate(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps) if c.pre_norm else None
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x):
        return F.gelu(self.dense(x if self.LayerNorm is None else self.LayerNorm(x)))


class Layer(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = SelfOutput(c, c.intermediate_size)

    def forward(self, x, attn_mask):
        x = self.attention(x, attn_mask)
        return self.output(self.intermediate(x), x)


class Stack(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c.num_layers))
        self.grad_checkpointing = c.grad_checkpointing

    def forward(self, x, attn_mask):
        ckpt = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.layer:  # checkpoint() replays dropout with the saved RNG state: same gradients, less memory
            x = checkpoint(layer, x, attn_mask, use_reentrant=False) if ckpt else layer(x, attn_mask)
        return x


class Encoder(nn.Module):
    """Token ids -> contextual hidden states ``(batch, seq, hidden)``."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.config = c
        self.embeddings = Embeddings(c)
        self.encoder = Stack(c)
        # pre-LN: the residual stream is normalised once, after the last layer
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps) if c.pre_norm else None

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        x = self.encoder(self.embeddings(input_ids, token_type_ids), self.attn_mask(attention_mask))
        return x if self.LayerNorm is None else self.LayerNorm(x)

    def attn_mask(self, attention_mask):
        """What the attention layers get. Causal: no padding mask is needed because padding is on the right, so a real
        token never sees a pad (pad positions' outputs are never read)."""
        if self.config.causal:
            return "causal"
        return None if attention_mask is None else attention_mask.bool()[:, None, None, :]


def init_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: N(0, std) weights, zero biases, unit LayerNorm."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class BertForMLM(nn.Module):
    """Encoder + MLM head with the decoder tied to the word embeddings."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.config = c
        self.bert = Encoder(c)
        self.cls = MLMHead(c.hidden_size, c.vocab_size, c.layer_norm_eps)
        init_weights(self, c.initializer_range)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        """Dense logits ``(batch, seq, vocab)`` (for parity checks and inspection)."""
        return self.cls(self.bert(input_ids, attention_mask, token_type_ids))

    def mlm_loss(self, input_ids, attention_mask, labels) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sparse prediction: the head runs only on positions with a label. Returns (loss, logits, targets)."""
        hidden = self.bert(input_ids, attention_mask)
        sel = labels != IGNORE_INDEX
        targets = labels[sel]
        logits = self.cls(hidden[sel])
        loss = F.cross_entropy(logits.float(), targets) if targets.numel() else logits.sum() * 0.0
        return loss, logits, targets


class CausalLM(nn.Module):
    """The encoder with causal attention and the tied LM head predicting the next token (``objective=clm``)."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        if not c.causal:
            raise ValueError("CausalLM needs EncoderConfig(causal=True)")
        self.config = c
        self.bert = Encoder(c)
        self.cls = MLMHead(c.hidden_size, c.vocab_size, c.layer_norm_eps)
        init_weights(self, c.initializer_range)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def clm_loss(self, input_ids, attention_mask, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Next-token cross-entropy over every position whose next token is not padding (the head runs only there)."""
        hidden = self.bert(input_ids, attention_mask)[:, :-1]
        nxt = input_ids[:, 1:].long()
        sel = nxt != pad_id
        targets = nxt[sel]
        logits = self.cls(hidden[sel])
        loss = F.cross_entropy(logits.float(), targets) if targets.numel() else logits.sum() * 0.0
        return loss, logits, targets


class SequenceClassifier(nn.Module):
    def __init__(self, c: EncoderConfig, num_labels: int, dropout: float = 0.1, pooling: str = "mean"):
        super().__init__()
        self.bert = Encoder(c)
        self.head = ClassificationHead(c.hidden_size, num_labels, dropout, pooling)
        init_weights(self, c.initializer_range)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        return self.head(self.bert(input_ids, attention_mask, token_type_ids), attention_mask)


class TokenClassifier(nn.Module):
    """Encoder -> dropout -> a label per token (NER)."""

    def __init__(self, c: EncoderConfig, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.bert = Encoder(c)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(c.hidden_size, num_labels)
        init_weights(self, c.initializer_range)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        return self.classifier(self.dropout(self.bert(input_ids, attention_mask, token_type_ids)))
