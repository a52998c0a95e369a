"""Corpus loading, tokenization and packing, each cached by a hash of the config that produced it.

Packing: the documents of a split are tokenized once, joined into one stream with ``[SEP]`` between documents, and cut
into blocks ``[CLS] <max_seq_len - 2 tokens> [SEP]``. Each block carries its ``special_tokens_mask`` and ``word_ids``
(index of the word a token belongs to, counted from 0 in each block; -1 on special tokens and padding), computed here
once rather than per batch.

Words are the tokenizer's pre-tokenizer words (English: "##" pieces share their word), or, with
``tokenizer.word_segmenter=jieba``, words from a segmenter: BertPreTokenizer makes every CJK character its own word, so
Chinese whole-word masking (Cui et al.) needs word boundaries from a segmenter. Segmentation changes word ids only,
never token ids: see :func:`segmented_word_ids`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from mlmlab.config import ConfigError
from mlmlab.data import builtin
from mlmlab.data.cache import cached_file
from mlmlab.data.tokenizer import (
    CLS,
    PAD,
    SEP,
    SPECIAL_TOKENS,
    UNK,
    load_tokenizer,
    segment_words,
    train_wordpiece,
)


def text_files(path: str, key: str = "data.path") -> list[Path]:
    """The .txt files behind a path (a file, or a folder searched recursively); ConfigError if none holds text."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{key}={path!r} does not exist (expected a .txt file or a folder of .txt files)")
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*.txt") if f.is_file())
    if not files:
        raise ConfigError(f"{key}={path!r} holds no .txt files")
    if not any(f.stat().st_size > 0 and f.read_text(encoding="utf-8", errors="replace").strip() for f in files):
        raise ConfigError(f"{key}={path!r} holds no text (all files are empty)")
    return files


def _files_key(path: str, key: str) -> list:
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in text_files(path, key)]


def corpus_key(d: DictConfig) -> dict:
    """What identifies the documents of a corpus (not how they are tokenized or packed)."""
    if d.name == "builtin":
        return {"name": "builtin", "n_docs": d.n_docs, "n_val_docs": d.n_val_docs, "n_topics": d.n_topics,
                "corpus_seed": d.corpus_seed, "version": 2}
    if d.get("mix"):
        return {"name": d.name, "doc_sep": d.doc_sep, "val_fraction": d.val_fraction, "mix_seed": d.mix_seed, "mix": [
            {"files": _files_key(s.path, f"data.mix[{i}].path"), "weight": float(s.get("weight", 1.0)),
             "val_files": _files_key(s.val_path, f"data.mix[{i}].val_path") if s.get("val_path") else None}
            for i, s in enumerate(d.mix)]}
    key = {"name": d.name, "files": _files_key(d.path, "data.path"), "doc_sep": d.doc_sep}
    if d.val_path is not None:
        key["val_files"] = _files_key(d.val_path, "data.val_path")
    else:
        key["val_fraction"] = d.val_fraction
    return key


def _read_docs(path: str, doc_sep: str, key: str) -> list[str]:
    import datasets

    files = [str(f) for f in text_files(path, key)]
    ds = datasets.load_dataset(
        "text", data_files=files, split="train", sample_by="paragraph" if doc_sep == "blank_line" else "line",
        keep_in_memory=True,
    )
    docs = [t.strip() for t in ds["text"]]
    return [t for t in docs if t]


def load_documents(d: DictConfig) -> dict[str, list[str]]:
    """``{"train": [...], "validation": [...]}`` documents for the data config."""
    if d.name == "builtin":
        return {
            "train": builtin.generate_corpus(d.n_docs, seed=d.corpus_seed, n_topics=d.n_topics),
            "validation": builtin.generate_corpus(d.n_val_docs, seed=d.corpus_seed + 10_000, n_topics=d.n_topics),
        }
    if d.get("mix"):
        return _mixture(d)
    return _source(d.path, d.val_path, d.doc_sep, d.val_fraction, "data")


def _source(path: str, val_path: str | None, doc_sep: str, val_fraction: float, key: str) -> dict[str, list[str]]:
    train = _read_docs(path, doc_sep, f"{key}.path")
    if val_path is not None:
        return {"train": train, "validation": _read_docs(val_path, doc_sep, f"{key}.val_path")}
    n_val = max(1, int(round(len(train) * val_fraction)))
    if len(train) < 2:
        raise ConfigError(f"{key}.path={path!r} holds {len(train)} document(s); need >= 2 to hold out validation")
    return {"train": train[:-n_val], "validation": train[-n_val:]}


def _mixture(d: DictConfig) -> dict[str, list[str]]:
    """Training documents interleaved from the sources with probabilities proportional to their weights until every
    source is used up (smaller sources repeat); validation is every source's held-out documents, unmixed."""
    import datasets

    parts = [_source(s.path, s.get("val_path"), d.doc_sep, d.val_fraction, f"data.mix[{i}]")
             for i, s in enumerate(d.mix)]
    weights = [float(s.get("weight", 1.0)) for s in d.mix]
    probs = [w / sum(weights) for w in weights]
    mixed = datasets.interleave_datasets([datasets.Dataset.from_dict({"text": p["train"]}) for p in parts],
                                         probabilities=probs, seed=d.mix_seed, stopping_strategy="all_exhausted")
    return {"train": mixed["text"], "validation": [doc for p in parts for doc in p["validation"]]}


def tokenizer_key(cfg: DictConfig) -> dict:
    """What identifies a trained tokenizer. The word segmenter is left out: it changes word ids, not the vocabulary,
    so runs with and without segmentation share one tokenizer (and the blocks key adds it back)."""
    t = {k: v for k, v in dict(cfg.tokenizer).items() if k != "word_segmenter"}
    return {"corpus": corpus_key(cfg.data), "tokenizer": t}


def pack(ids: list[list[int]], word_ids: list[list[int | None]], max_seq_len: int) -> dict[str, torch.Tensor]:
    """Pack tokenized documents into ``[CLS] ... [SEP]`` blocks (the last one padded)."""
    body = max_seq_len - 2
    stream, words, offset = [], [], 0
    for doc_ids, doc_words in zip(ids, word_ids):
        if not doc_ids:
            continue
        stream.append(np.asarray(doc_ids, dtype=np.int64))
        w = np.asarray([-1 if x is None else x for x in doc_words], dtype=np.int64)
        words.append(np.where(w >= 0, w + offset, -1))
        offset += int(w.max()) + 1 if (w >= 0).any() else 0
        stream.append(np.asarray([SEP], dtype=np.int64))
        words.append(np.asarray([-1], dtype=np.int64))
    if not stream:
        raise ConfigError("the corpus produced no tokens")
    flat, flat_w = np.concatenate(stream[:-1]), np.concatenate(words[:-1])  # no trailing [SEP]
    n = -(-len(flat) // body)
    pad = n * body - len(flat)
    flat = np.concatenate([flat, np.full(pad, PAD)]).reshape(n, body)
    flat_w = np.concatenate([flat_w, np.full(pad, -1)]).reshape(n, body)
    input_ids = np.concatenate([np.full((n, 1), CLS), flat, np.full((n, 1), SEP)], axis=1)
    if pad:  # move the last block's closing [SEP] right after its last real token
        last = input_ids[-1]
        last[-1] = PAD
        last[1 + body - pad] = SEP
    wid = np.concatenate([np.full((n, 1), -1), flat_w, np.full((n, 1), -1)], axis=1)
    first = np.where(wid >= 0, wid, np.iinfo(np.int64).max).min(axis=1, keepdims=True)
    wid = np.where(wid >= 0, wid - np.where(first == np.iinfo(np.int64).max, 0, first), -1)
    special = input_ids < len(SPECIAL_TOKENS)
    special &= input_ids != UNK  # [UNK] is an ordinary token: it may be masked and predicted
    return {
        "input_ids": torch.from_numpy(input_ids.astype(np.int32)),
        "special_tokens_mask": torch.from_numpy(special),
        "word_ids": torch.from_numpy(wid.astype(np.int32)),
    }


def segmented_word_ids(
    text: str, words: list[str], word_ids: list[int | None], offsets: list[tuple[int, int]]
) -> list[int]:
    """Word ids of one encoded text under a segmentation of it into ``words`` (substrings of ``text``, in order).

    A token starts a new word only where it starts both a new tokenizer word and a new segmenter word, so a word is a
    segmenter word (all characters of 我们 share an id) unless a tokenizer word straddles two segmenter words: then
    they merge, and a WordPiece word is never split (jieba splits ``～～``, ``❤❤`` or full-width ``ｉｐｈｏｎｅ`` into
    characters, while BertPreTokenizer keeps each as one word). Ids are dense from 0; -1 where ``word_ids`` is ``None``.

    This works on the ordinary encoding of the raw text (via character offsets) rather than re-encoding the words with
    ``is_pretokenized=True``: the latter gives different token ids wherever the segmenter splits a tokenizer word
    (155 of the first 20,000 zh_corpus documents), and segmentation must change word ids only.
    """
    if not word_ids:
        return []
    ends, pos = [], 0
    for w in words:
        start = text.find(w, pos)
        if start < 0:
            raise ValueError(f"segmenter word {w!r} not found in order in the text {text[:80]!r}")
        pos = start + len(w)
        ends.append(pos)
    seg = np.searchsorted(np.asarray(ends, dtype=np.int64), np.asarray([a for a, _ in offsets], dtype=np.int64),
                          side="right")  # index of the segmenter word holding each token's first character
    tw = np.asarray([-1 if x is None else x for x in word_ids], dtype=np.int64)
    new = np.ones(len(tw), dtype=bool)
    new[1:] = (tw[1:] != tw[:-1]) & (seg[1:] != seg[:-1])
    return np.where(tw >= 0, np.cumsum(new & (tw >= 0)) - 1, -1).tolist()


def tokenize(tok, texts: list[str], segmenter: str = "none") -> tuple[list[list[int]], list[list[int | None]]]:
    """Token ids and word ids per text; ``segmenter`` ("none" | "jieba") only changes the word ids."""
    encs = tok.encode_batch(texts, add_special_tokens=False)
    ids = [e.ids for e in encs]
    if segmenter == "none":
        return ids, [e.word_ids for e in encs]
    words = segment_words(texts, segmenter)
    return ids, [segmented_word_ids(t, w, e.word_ids, e.offsets) for t, w, e in zip(texts, words, encs)]


def get_blocks(cfg: DictConfig) -> tuple[object, dict[str, dict[str, torch.Tensor]]]:
    """The tokenizer and the packed blocks of both splits, from the cache when the same config made them before."""
    docs: dict[str, list[str]] = {}

    def lazy_docs() -> dict[str, list[str]]:
        if not docs:
            docs.update(load_documents(cfg.data))
        return docs

    def build_tok(tmp: Path) -> None:
        t = cfg.tokenizer
        train_wordpiece(lazy_docs()["train"], t.vocab_size, t.lowercase, t.min_frequency).save(str(tmp))

    tok = load_tokenizer(cached_file(cfg.paths.cache_dir, "tokenizer", tokenizer_key(cfg), "tokenizer.json", build_tok))

    segmenter = cfg.tokenizer.word_segmenter

    def build_blocks(tmp: Path) -> None:
        out = {}
        for split, texts in lazy_docs().items():
            out[split] = pack(*tokenize(tok, texts, segmenter), cfg.data.max_seq_len)
        with open(tmp, "wb") as f:
            torch.save(out, f)

    key = {**tokenizer_key(cfg), "max_seq_len": cfg.data.max_seq_len, "packing": 1}
    if segmenter != "none":  # keeps the keys (and caches) of unsegmented corpora as they were
        key["word_segmenter"] = segmenter
    path = cached_file(cfg.paths.cache_dir, "blocks", key, "blocks.pt", build_blocks)
    return tok, torch.load(path, weights_only=True)


