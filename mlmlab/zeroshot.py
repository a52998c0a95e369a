"""Zero-shot evaluation on minimal pairs (BLiMP): a pair is right when the model scores ``good`` above ``bad``.

Scorers (pure torch + a ``tokenizers`` tokenizer; no Lightning):
- masked LMs (``objective=mlm``, and ELECTRA through its generator): the pseudo-log-likelihood of Salazar et al. (2020),
  each token masked in turn and its log-probability summed. ``within_word_l2r`` (the default, Kauf & Ivanova 2023):
  when token ``i`` is scored, the later sub-tokens of the same word are masked too, which removes PLL's bias towards
  words split into many pieces; ``original``: only token ``i`` is masked. All masked copies of a sentence go through
  the model in the same batch (copies of many sentences are batched together, by length), and the MLM head runs only
  on the scored positions.
- causal LMs (``objective=clm``): the summed next-token log-probability of ``[CLS] sentence [SEP]`` (the end marker
  included, as the sentence's end is part of what makes it grammatical).
- the unigram floor: the summed log-probability of the tokens under the training corpus's add-one-smoothed unigram
  distribution (no context at all; it prefers shorter sentences and frequent words).

Identical sentences in a pair are a tie: neither right nor wrong (excluded from the denominator, counted). A pair
whose tokenization holds ``[UNK]`` in either sentence is scored as usual and counted. Accuracy is reported per
paradigm, per field (mean over its paradigms) and overall (mean over paradigms, the convention of BLiMP's paper).
"""

from __future__ import annotations

import math
from collections import defaultdict
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from mlmlab.data.tokenizer import CLS, MASK, PAD, SEP, UNK
from mlmlab.stats import mcnemar  # noqa: F401  (re-exported: zeroshot's callers pair scorers with it)

PLL_VARIANTS = ("within_word_l2r", "original")


def encode_sentences(tok, sentences: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids (no special tokens) and, per token, its word index (-1 where the tokenizer gives none)."""
    encs = tok.encode_batch(sentences, add_special_tokens=False)
    ids = [list(e.ids) for e in encs]
    words = [[-1 if w is None else int(w) for w in e.word_ids] for e in encs]
    return ids, words


def pll_copies(ids: list[int], words: list[int], variant: str) -> list[tuple[list[int], int]]:
    """The masked copies of ``[CLS] ids [SEP]`` that PLL scores: ``(masked input, scored position)`` per token."""
    if variant not in PLL_VARIANTS:
        raise ValueError(f"unknown PLL variant {variant!r}; allowed: {', '.join(PLL_VARIANTS)}")
    full = [CLS, *ids, SEP]
    out = []
    for i in range(len(ids)):
        x = list(full)
        x[i + 1] = MASK
        if variant == "within_word_l2r" and words[i] >= 0:
            for j in range(i + 1, len(ids)):
                if words[j] == words[i]:
                    x[j + 1] = MASK
        out.append((x, i + 1))
    return out


def _masked_logits(model, input_ids, attention_mask, labels):
    """Logits at the labelled positions (in row-major order) of a masked LM: ``BertForMLM`` or ELECTRA's generator."""
    if hasattr(model, "mlm_loss"):
        _, logits, _ = model.mlm_loss(input_ids, attention_mask, labels)
        return logits
    if hasattr(model, "generator_logits"):
        logits, _, _ = model.generator_logits(input_ids, attention_mask, labels)
        return logits
    raise TypeError(f"{type(model).__name__} is not a masked LM (no mlm_loss / generator_logits)")


@contextmanager
def _eval_mode(model):
    """The model in eval mode for the block (no dropout), its training flag restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _pad(seqs: list[list[int]]) -> torch.Tensor:
    """Right-padded ``(len(seqs), longest)`` id tensor."""
    out = torch.full((len(seqs), max(len(x) for x in seqs)), PAD, dtype=torch.long)
    for k, x in enumerate(seqs):
        out[k, : len(x)] = torch.tensor(x)
    return out


def _autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=str(precision).startswith("bf16"))


@torch.no_grad()
def pll_scores(model, tok, sentences: list[str], variant: str = "within_word_l2r", batch_size: int = 1024,
               precision: str = "32-true") -> list[float]:
    """Pseudo-log-likelihood (nats) of each sentence under a masked LM (module in eval mode for the call)."""
    ids, words = encode_sentences(tok, sentences)
    rows: list[tuple[list[int], int, int, int]] = []  # (masked input, position, target, sentence)
    for s, (x, w) in enumerate(zip(ids, words)):
        for masked, pos in pll_copies(x, w, variant):
            rows.append((masked, pos, x[pos - 1], s))
    order = sorted(range(len(rows)), key=lambda r: len(rows[r][0]))
    scores = torch.zeros(len(sentences), dtype=torch.float64)
    with _eval_mode(model):
        for b in range(0, len(order), batch_size):
            idx = order[b : b + batch_size]
            inp = _pad([rows[r][0] for r in idx])
            labels = torch.full_like(inp, -100)
            for k, r in enumerate(idx):
                labels[k, rows[r][1]] = rows[r][2]
            with _autocast(precision):
                logits = _masked_logits(model, inp, inp != PAD, labels)
            targets = labels[labels != -100]  # one label per row, so row order = label order
            lp = F.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None])[:, 0].double()
            scores.index_add_(0, torch.tensor([rows[r][3] for r in idx]), lp)
    return scores.tolist()


@torch.no_grad()
def clm_scores(model, tok, sentences: list[str], batch_size: int = 256, precision: str = "32-true") -> list[float]:
    """Summed next-token log-probability (nats) of ``[CLS] sentence [SEP]`` under a causal LM (``CausalLM``)."""
    ids, _ = encode_sentences(tok, sentences)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    scores = torch.zeros(len(sentences), dtype=torch.float64)
    with _eval_mode(model):
        for b in range(0, len(order), batch_size):
            idx = order[b : b + batch_size]
            inp = _pad([[CLS, *ids[i], SEP] for i in idx])
            with _autocast(precision):
                hidden = model.bert(inp, inp != PAD)[:, :-1]
                nxt = inp[:, 1:]
                sel = nxt != PAD
                logits = model.cls(hidden[sel])
            lp = F.log_softmax(logits.float(), dim=-1).gather(1, nxt[sel][:, None])[:, 0].double()
            row = torch.arange(len(idx))[:, None].expand_as(sel)[sel]
            scores[torch.tensor(idx)] = torch.zeros(len(idx), dtype=torch.float64).index_add_(0, row, lp)
    return scores.tolist()


def unigram_scores(counts: torch.Tensor, tok, sentences: list[str]) -> list[float]:
    """The floor: summed log-probability of the tokens under the add-one-smoothed unigram distribution of ``counts``."""
    c = counts.double()
    logq = ((c + 1) / (c.sum() + len(c))).log()
    ids, _ = encode_sentences(tok, sentences)
    return [float(logq[torch.tensor(x, dtype=torch.long)].sum()) if x else 0.0 for x in ids]


def lm_kind(model) -> str:
    """``pll`` for a masked LM (``BertForMLM``, ELECTRA's generator), ``clm`` for a causal LM."""
    if hasattr(model, "clm_loss"):
        return "clm"
    if hasattr(model, "mlm_loss") or hasattr(model, "generator_logits"):
        return "pll"
    raise TypeError(f"{type(model).__name__} cannot score sentences (not a masked or causal LM)")


def sentence_scores(model, tok, sentences: list[str], variant: str, batch_size: int, precision: str) -> list[float]:
    if lm_kind(model) == "clm":
        return clm_scores(model, tok, sentences, max(1, batch_size // 4), precision)
    return pll_scores(model, tok, sentences, variant, batch_size, precision)


def judge(good: list[float], bad: list[float], pairs: list[dict]) -> list[int | None]:
    """Per pair: 1 right (good scored higher), 0 wrong, None a tie (identical sentences, or equal scores)."""
    out: list[int | None] = []
    for g, b, p in zip(good, bad, pairs):
        if p["good"] == p["bad"] or g == b:
            out.append(None)
        else:
            out.append(int(g > b))
    return out


def unk_pairs(tok, pairs: list[dict]) -> int:
    """How many pairs have ``[UNK]`` in the tokenization of either sentence."""
    good, _ = encode_sentences(tok, [p["good"] for p in pairs])
    bad, _ = encode_sentences(tok, [p["bad"] for p in pairs])
    return sum(UNK in g or UNK in b for g, b in zip(good, bad))


def summarize(pairs: list[dict], right: list[int | None]) -> dict:
    """Accuracy per paradigm, per field (mean over its paradigms), overall (mean over paradigms); ties counted."""
    by_par: dict[str, list[int]] = defaultdict(list)
    field_of: dict[str, str] = {}
    ties = 0
    for p, r in zip(pairs, right):
        field_of[p["paradigm"]] = p["field"]
        if r is None:
            ties += 1
        else:
            by_par[p["paradigm"]].append(r)
    paradigms = {k: sum(v) / len(v) for k, v in sorted(by_par.items()) if v}
    fields: dict[str, list[float]] = defaultdict(list)
    for k, v in paradigms.items():
        fields[field_of[k]].append(v)
    return {"acc": sum(paradigms.values()) / len(paradigms) if paradigms else math.nan,
            "fields": {k: sum(v) / len(v) for k, v in sorted(fields.items())},
            "paradigms": paradigms, "pairs": len(pairs), "ties": ties}


def slug(name: str) -> str:
    """A metric-key-safe field name (BLiMP spells one field ``syntax/semantics``)."""
    return name.replace("/", "-")
