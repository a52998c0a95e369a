"""Task examples as model inputs: windows over long texts, sentence pairs, word-level labels, collation, length-bucketed
batches."""

from __future__ import annotations

import math

import torch

from mlmlab.data.tasks import TaskSpec
from mlmlab.data.tokenizer import CLS, PAD, SEP

IGNORE = -100


def windows(n: int, body: int, stride: int) -> list[tuple[int, int]]:
    """[start, end) spans of at most ``body`` tokens covering ``range(n)``, consecutive spans overlapping by
    ``stride`` tokens (the last one ends at ``n``)."""
    if n <= body:
        return [(0, n)]
    step = max(1, body - stride)
    starts = list(range(0, n - body, step)) + [n - body]
    return [(s, s + body) for s in starts]


def encode_examples(tok, examples: list[dict], max_seq_len: int, stride: int = 0) -> list[dict]:
    """``[CLS] text [SEP]`` windows (``[CLS] a [SEP] b [SEP]`` for pairs, truncated). Each item has ``doc``: the index
    of its example, so window logits can be averaged back."""
    a = tok.encode_batch([e["text"] for e in examples], add_special_tokens=False)
    b = tok.encode_batch([e["text_b"] for e in examples], add_special_tokens=False) if "text_b" in examples[0] else None
    out = []
    for i, e in enumerate(examples):
        ids_a = a[i].ids
        if b is None:
            for s, t in windows(len(ids_a), max_seq_len - 2, stride):
                out.append({"input_ids": [CLS] + ids_a[s:t] + [SEP], "token_type_ids": None, "label": int(e["label"]),
                            "doc": i})
            continue
        ids_a, ids_b, budget = list(ids_a), list(b[i].ids), max_seq_len - 3
        while len(ids_a) + len(ids_b) > budget:  # truncate the longer side first, as BERT does
            (ids_a if len(ids_a) >= len(ids_b) else ids_b).pop()
        ids = [CLS] + ids_a + [SEP] + ids_b + [SEP]
        types = [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
        out.append({"input_ids": ids, "token_type_ids": types, "label": int(e["label"]), "doc": i})
    return out


def encode_tokens(tok, examples: list[dict], max_seq_len: int, stride: int) -> tuple[list[dict], list[dict]]:
    """NER windows and, per example, where each word is read from: ``(items, index)``; ``index[i]["at"][w]`` is
    ``(item, position)`` of word ``w``'s first sub-token in the window where it is most central, or None for a word
    that produced no token."""
    encs = tok.encode_batch([e["tokens"] for e in examples], is_pretokenized=True, add_special_tokens=False)
    items, index = [], []
    for i, (e, enc) in enumerate(zip(examples, encs)):
        first: dict[int, int] = {}
        for pos, w in enumerate(enc.word_ids):
            if w is not None and w not in first:
                first[w] = pos
        spans = windows(len(enc.ids), max_seq_len - 2, stride)
        at: list = [None] * len(e["tokens"])
        best = [-1.0] * len(e["tokens"])
        for s, t in spans:
            labels = [IGNORE] * (t - s)
            for w, pos in first.items():
                if s <= pos < t:
                    labels[pos - s] = e["tags"][w]
                    centrality = min(pos - s, t - 1 - pos)
                    if centrality > best[w]:
                        best[w], at[w] = centrality, (len(items), pos - s + 1)  # +1: [CLS]
            items.append({"input_ids": [CLS] + enc.ids[s:t] + [SEP], "token_type_ids": None,
                          "labels": [IGNORE] + labels + [IGNORE], "doc": i})
        index.append({"at": at, "tags": e["tags"]})
    return items, index


def collate(batch: list[dict]) -> dict[str, torch.Tensor]:
    n = max(len(x["input_ids"]) for x in batch)
    ids = torch.full((len(batch), n), PAD, dtype=torch.long)
    types = torch.zeros((len(batch), n), dtype=torch.long)
    token_labels = torch.full((len(batch), n), IGNORE, dtype=torch.long) if "labels" in batch[0] else None
    for i, x in enumerate(batch):
        ids[i, : len(x["input_ids"])] = torch.tensor(x["input_ids"])
        if x["token_type_ids"] is not None:
            types[i, : len(x["token_type_ids"])] = torch.tensor(x["token_type_ids"])
        if token_labels is not None:
            token_labels[i, : len(x["labels"])] = torch.tensor(x["labels"])
    out = {"input_ids": ids, "attention_mask": ids != PAD, "token_type_ids": types}
    out["labels"] = token_labels if token_labels is not None else torch.tensor([x["label"] for x in batch])
    return out


class LengthBucketBatches(torch.utils.data.Sampler):
    """Shuffled batches of similar-length items: each epoch, the items are shuffled (by ``generator``), cut into pools
    of ``pool`` batches, each pool sorted by length and cut into batches, and the batches shuffled. Every item is seen
    once per epoch, as with ``shuffle=True``, at a fraction of the padding (SST-2's training phrases run from 1 to 60
    tokens)."""

    def __init__(self, lengths: list[int], batch_size: int, generator: torch.Generator, pool: int = 50):
        self.lengths, self.bs, self.g, self.pool = lengths, batch_size, generator, pool

    def __iter__(self):
        perm = torch.randperm(len(self.lengths), generator=self.g).tolist()
        batches = []
        for i in range(0, len(perm), self.bs * self.pool):
            chunk = sorted(perm[i : i + self.bs * self.pool], key=lambda j: self.lengths[j])
            batches += [chunk[k : k + self.bs] for k in range(0, len(chunk), self.bs)]
        for k in torch.randperm(len(batches), generator=self.g).tolist():
            yield batches[k]

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.bs)


def encode_split(tok, spec: TaskSpec, records: list[dict], f) -> dict:
    if spec.kind == "token":
        items, index = encode_tokens(tok, records, f.max_seq_len, f.stride)
        return {"items": items, "index": index, "n": len(records)}
    items = encode_examples(tok, records, f.max_seq_len, f.stride)
    return {"items": items, "labels": [r["label"] for r in records], "n": len(records)}
