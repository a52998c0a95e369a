"""ELECTRA replaced-token detection (Clark et al., 2020): a small MLM generator and the discriminator being studied.

- The discriminator is an ordinary :class:`~mlmlab.models.encoder.Encoder` (so downstream fine-tuning loads its state
  dict exactly like an MLM encoder's) plus an :class:`~mlmlab.models.heads.RTDHead`.
- The generator has no embeddings of its own: it reads the discriminator's embedding module (token, position and type
  embeddings and their LayerNorm: ELECTRA's tied embeddings, one tensor each), projects them to its narrower width when
  it is smaller, and its MLM decoder is tied to the same word-embedding matrix.
- Replacements are sampled from the generator's softmax at the masked positions with a caller-supplied
  ``torch.Generator`` (Gumbel-max or multinomial, never special tokens), under ``no_grad``: no gradient flows from the
  discriminator's loss into the generator through the sampling. A sample equal to the original token counts as
  "original" in the discriminator's target.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from mlmlab.models.encoder import IGNORE_INDEX, Encoder, EncoderConfig, Stack, init_weights
from mlmlab.models.heads import MLMHead, RTDHead

SAMPLINGS = ("gumbel", "multinomial")


def generator_shape(hidden: int, heads: int, intermediate: int, layers: int, size: float,
                    gen_layers: int | None = None) -> dict[str, int]:
    """ELECTRA's generator: hidden, FFN width and heads scaled by ``size``; the discriminator's depth unless set."""
    return {"hidden_size": max(1, round(hidden * size)), "num_heads": max(1, round(heads * size)),
            "intermediate_size": max(1, round(intermediate * size)), "num_layers": gen_layers or layers}


@dataclass
class RTDOutput:
    loss: torch.Tensor  # gen_mlm_loss + disc_weight * disc_loss
    gen_loss: torch.Tensor
    disc_loss: torch.Tensor
    gen_logits: torch.Tensor  # (n_masked, vocab)
    gen_targets: torch.Tensor  # (n_masked,)
    corrupted_ids: torch.Tensor  # the discriminator's input (b, t)
    disc_positions: torch.Tensor  # bool (b, t): real, non-special tokens the discriminator is scored on
    disc_targets: torch.Tensor  # float (n_positions,): 1 = replaced (differs from the original)
    disc_logits: torch.Tensor  # (n_positions,)


class Generator(nn.Module):
    """Projection from the shared embedding width (if narrower) -> transformer stack -> MLM head tied to the shared
    word embeddings. Takes embedded inputs, not ids: the embeddings belong to the discriminator."""

    def __init__(self, gc: EncoderConfig, embedding_size: int):
        super().__init__()
        self.config = gc
        self.embeddings_project = (nn.Linear(embedding_size, gc.hidden_size) if gc.hidden_size != embedding_size
                                   else nn.Identity())
        self.encoder = Stack(gc)
        self.LayerNorm = nn.LayerNorm(gc.hidden_size, eps=gc.layer_norm_eps) if gc.pre_norm else None  # as Encoder
        self.cls = MLMHead(embedding_size, gc.vocab_size, gc.layer_norm_eps, d_in=gc.hidden_size)

    def forward(self, embedded: torch.Tensor, attn_mask) -> torch.Tensor:
        x = self.encoder(self.embeddings_project(embedded), attn_mask)
        return x if self.LayerNorm is None else self.LayerNorm(x)


class ElectraForPretraining(nn.Module):
    def __init__(self, c: EncoderConfig, generator_size: float = 0.25, generator_layers: int | None = None,
                 special_ids: tuple[int, ...] = ()):
        super().__init__()
        self.config = c
        self.discriminator = Encoder(c)
        self.rtd = RTDHead(c.hidden_size)
        gc = replace(c, **generator_shape(c.hidden_size, c.num_heads, c.intermediate_size, c.num_layers,
                                          generator_size, generator_layers))
        self.generator = Generator(gc, c.hidden_size)
        init_weights(self, c.initializer_range)
        self.generator.cls.predictions.decoder.weight = self.discriminator.embeddings.word_embeddings.weight
        banned = torch.zeros(c.vocab_size, dtype=torch.bool)
        banned[list(special_ids)] = True
        self.register_buffer("banned", banned, persistent=False)  # never sampled as replacements

    @property
    def embeddings(self):
        return self.discriminator.embeddings

    def generator_logits(self, masked_ids, attention_mask, labels) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sparse: the generator's head runs only on the predicted positions. Returns (logits, targets, selected)."""
        hidden = self.generator(self.embeddings(masked_ids, None), self.discriminator.attn_mask(attention_mask))
        sel = labels != IGNORE_INDEX
        return self.generator.cls(hidden[sel]), labels[sel], sel

    @torch.no_grad()
    def sample(self, logits: torch.Tensor, temperature: float, generator: torch.Generator | None,
               method: str = "gumbel") -> torch.Tensor:
        """Draw one token per row from softmax(logits / temperature), special tokens excluded."""
        z = (logits.detach().float() / temperature).masked_fill(self.banned, float("-inf"))
        if method == "gumbel":
            u = torch.rand(z.shape, generator=generator, device=z.device).clamp_(min=torch.finfo(torch.float32).tiny)
            return (z - torch.log(-torch.log(u))).argmax(-1)
        if method == "multinomial":
            return torch.multinomial(torch.softmax(z, -1), 1, generator=generator).squeeze(-1)
        raise ValueError(f"sampling={method!r}; allowed: {', '.join(SAMPLINGS)}")

    def forward(self, masked_ids, labels, original_ids, attention_mask, special_tokens_mask, *, disc_weight: float = 50.0,
                temperature: float = 1.0, generator: torch.Generator | None = None,
                sampling: str = "gumbel") -> RTDOutput:
        gen_logits, gen_targets, sel = self.generator_logits(masked_ids, attention_mask, labels)
        gen_loss = F.cross_entropy(gen_logits.float(), gen_targets) if gen_targets.numel() else gen_logits.sum() * 0.0
        corrupted = original_ids.long().clone()
        corrupted[sel] = self.sample(gen_logits, temperature, generator, sampling)
        positions = attention_mask.bool() & ~special_tokens_mask.bool()
        targets = (corrupted != original_ids.long())[positions].float()
        hidden = self.discriminator(corrupted, attention_mask)
        disc_logits = self.rtd(hidden[positions])
        disc_loss = (F.binary_cross_entropy_with_logits(disc_logits.float(), targets) if targets.numel()
                     else disc_logits.sum() * 0.0)
        return RTDOutput(gen_loss + disc_weight * disc_loss, gen_loss, disc_loss, gen_logits, gen_targets, corrupted,
                         positions, targets, disc_logits)


def rtd_metrics(out: RTDOutput) -> dict[str, torch.Tensor]:
    """Generator accuracy, discriminator accuracy overall / on replaced / on original tokens, replaced fraction."""
    with torch.no_grad():
        gen_acc = ((out.gen_logits.argmax(-1) == out.gen_targets).float().mean() if out.gen_targets.numel()
                   else out.gen_loss.new_zeros(()))
        pred = (out.disc_logits > 0).float()
        right = (pred == out.disc_targets).float()
        rep = out.disc_targets.bool()
        n_rep, n_orig = rep.sum(), (~rep).sum()
        return {
            "gen_mlm_loss": out.gen_loss.detach(), "gen_acc": gen_acc, "disc_loss": out.disc_loss.detach(),
            "disc_acc": right.mean() if right.numel() else gen_acc.new_zeros(()),
            "disc_acc_replaced": (right * rep).sum() / n_rep.clamp(min=1),
            "disc_acc_original": (right * ~rep).sum() / n_orig.clamp(min=1),
            "replaced_frac": n_rep / (n_rep + n_orig).clamp(min=1),
        }
