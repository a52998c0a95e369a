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

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mlmlab.data import builtin
from mlmlab.data.cache import cached_file, config_hash, plain
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
from mlmlab.errors import ConfigError

if TYPE_CHECKING:
    from mlmlab.data.schema import DataConfig, TokenizerConfig

log = logging.getLogger(__name__)


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


def corpus_key(d: DataConfig) -> dict:
    """What identifies the documents of a corpus (not how they are tokenized or packed)."""
    key = _corpus_key(d)
    return {**key, "strip_html": True} if d.strip_html else key  # unset: the keys of existing caches


def _corpus_key(d: DataConfig) -> dict:
    if d.name == "builtin":
        return {"name": "builtin", "n_docs": d.n_docs, "n_val_docs": d.n_val_docs, "n_topics": d.n_topics,
                "corpus_seed": d.corpus_seed, "version": 2}
    if d.mix:
        return {"name": d.name, "doc_sep": d.doc_sep, "val_fraction": d.val_fraction, "mix_seed": d.mix_seed, "mix": [
            {"files": _files_key(s["path"], f"data.mix[{i}].path"), "weight": float(s.get("weight", 1.0)),
             "val_files": _files_key(s["val_path"], f"data.mix[{i}].val_path") if s.get("val_path") else None}
            for i, s in enumerate(d.mix)]}
    if uses_hub(d):
        return {"name": d.name, "hub": d.hub, "hub_name": d.hub_name, "hub_split": d.hub_split,
                "hub_val_split": d.hub_val_split, "text_column": d.text_column,
                "val_fraction": None if d.hub_val_split else d.val_fraction,
                # a local folder given as data.hub: its files' sizes and times, so edits rebuild the caches
                "local": _files_any(d.hub) if Path(str(d.hub)).expanduser().exists() else None}
    key = {"name": d.name, "files": _files_key(d.path, "data.path"), "doc_sep": d.doc_sep}
    if d.val_path is not None:
        key["val_files"] = _files_key(d.val_path, "data.val_path")
    else:
        key["val_fraction"] = d.val_fraction
    return key


def _text_dataset(path: str, doc_sep: str, key: str, cache_dir: str | None = None):
    """The documents of local text files as a memory-mapped Arrow ``datasets.Dataset`` (column ``text``), stripped, empty
    ones dropped. With ``cache_dir`` the Arrow files live under ``<cache_dir>/hf`` (the project's cache), else in memory."""
    import datasets

    paths = text_files(path, key)
    for f in paths:
        check_utf8(f, key)
    files = [str(f) for f in paths]
    kw = {"cache_dir": str(Path(cache_dir).expanduser() / "hf")} if cache_dir else {"keep_in_memory": True}
    ds = datasets.load_dataset("text", data_files=files, split="train",
                               sample_by="paragraph" if doc_sep == "blank_line" else "line", **kw)
    return _clean(ds, keep_in_memory=not cache_dir)


def check_utf8(f: Path, key: str = "data.path", chunk: int = 8 << 20) -> None:
    """ConfigError naming the file, line and byte offset of the first bytes that are not UTF-8 (streamed in chunks: a
    large corpus is read once, in bounded memory; done when the documents are loaded for a cache build)."""
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(f, "rb") as fh:
        while True:
            data = fh.read(chunk)
            pending = len(dec.getstate()[0])  # bytes of a character cut by the previous chunk's end
            try:
                dec.decode(data, final=not data)
            except UnicodeDecodeError as e:
                pos = offset - pending + e.start
                with open(f, "rb") as g:
                    head = g.read(pos)
                line = head.count(b"\n") + 1
                raise ConfigError(f"{key}: {f}, line {line} (byte {pos}): not valid UTF-8 ({e.reason}: "
                                  f"{e.object[e.start:e.end]!r}); re-encode the file as UTF-8") from None
            if not data:
                return
            offset += len(data)


def _clean(ds, keep_in_memory: bool = True):
    import datasets

    datasets.disable_progress_bars()  # map/filter/save bars of every small step would drown the job's log
    ds = ds.map(lambda b: {"text": [(t or "").strip() for t in b["text"]]}, batched=True, keep_in_memory=keep_in_memory,
                desc=None)
    return ds.filter(lambda b: [bool(t) for t in b["text"]], batched=True, keep_in_memory=keep_in_memory)


def _files_any(path: str) -> list:
    p = Path(path).expanduser()
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def _read_docs(path: str, doc_sep: str, key: str) -> list[str]:
    return list(_text_dataset(path, doc_sep, key)["text"])


def load_documents(d: DataConfig, cache_dir: str | None = None) -> dict[str, list[str]]:
    """``{"train": [...], "validation": [...]}`` documents for the data config, as lists (small corpora, tests)."""
    return {split: list(ds["text"]) for split, ds in document_datasets(d, cache_dir).items()}


HTML_TAG = r"<\s*/?\s*[a-zA-Z][^<>]{0,100}>"  # <br />, <i>, </p>: markup in scraped reviews (the hub's IMDB)


def strip_html(text: str) -> str:
    """``data.strip_html=true``: HTML tags become one space, runs of spaces collapse, HTML entities are decoded."""
    import html
    import re

    return re.sub(r"\s+", " ", html.unescape(re.sub(HTML_TAG, " ", text))).strip()


def document_datasets(d: DataConfig, cache_dir: str | None = None) -> dict:
    """``{"train": Dataset, "validation": Dataset}`` (column ``text``): the built-in corpus (in memory), local text files
    or a mixture of them (memory-mapped Arrow under ``<cache_dir>/hf``), or a hub data set (``data.hub``); with
    ``data.strip_html`` the documents' markup removed."""
    return _cleaned(d, _documents(d, cache_dir), cache_dir)


def _cleaned(d: DataConfig, docs: dict, cache_dir: str | None) -> dict:
    if not d.strip_html:
        return docs
    return {k: _clean(ds.map(lambda b: {"text": [strip_html(t) for t in b["text"]]}, batched=True,
                             keep_in_memory=not cache_dir), keep_in_memory=not cache_dir) for k, ds in docs.items()}


def _documents(d: DataConfig, cache_dir: str | None = None) -> dict:
    import datasets

    if d.name == "builtin":
        return {
            "train": datasets.Dataset.from_dict(
                {"text": builtin.generate_corpus(d.n_docs, seed=d.corpus_seed, n_topics=d.n_topics)}),
            "validation": datasets.Dataset.from_dict(
                {"text": builtin.generate_corpus(d.n_val_docs, seed=d.corpus_seed + 10_000, n_topics=d.n_topics)}),
        }
    if d.mix:
        return _mixture(d, cache_dir)
    if uses_hub(d):
        return _hub_corpus(d, cache_dir)
    return _source(d.path, d.val_path, d.doc_sep, d.val_fraction, "data", cache_dir)


def uses_hub(d: DataConfig) -> bool:
    """Whether a (non-mixture) corpus comes from the hub: ``data.source=hub``, or ``auto`` with ``data.hub`` set and
    ``data.path`` unset or not on this machine (a preset's local copy wins where the data dir has it)."""
    source = d.source
    if source == "hub" or (source == "auto" and d.hub
                           and (d.path is None or not Path(str(d.path)).expanduser().exists())):
        return True
    return False


def _split(ds, val_fraction: float, key: str, what: str) -> dict:
    n = len(ds)
    if n < 2:
        raise ConfigError(f"{key}={what!r} holds {n} document(s); need >= 2 to hold out validation")
    n_val = max(1, int(round(n * val_fraction)))
    return {"train": ds.select(range(n - n_val)), "validation": ds.select(range(n - n_val, n))}


def _source(path: str, val_path: str | None, doc_sep: str, val_fraction: float, key: str,
            cache_dir: str | None = None) -> dict:
    train = _text_dataset(path, doc_sep, f"{key}.path", cache_dir)
    if val_path is not None:
        return {"train": train, "validation": _text_dataset(val_path, doc_sep, f"{key}.val_path", cache_dir)}
    return _split(train, val_fraction, f"{key}.path", path)


def _hub_corpus(d: DataConfig, cache_dir: str | None) -> dict:
    """``datasets.load_dataset(data.hub, data.hub_name, split=...)``: a hub name, or anything else load_dataset takes (a
    local folder of data files, a loading script). Non-empty values of ``data.text_column`` are the documents."""
    from mlmlab.data.hub import load_dataset

    where = f"data.hub={d.hub!r}" + (f" data.hub_name={d.hub_name!r}" if d.hub_name else "")

    def load(split: str):
        try:  # the user's HF cache (HF_DATASETS_CACHE): what is downloaded there is reused, also offline
            ds = load_dataset(d.hub, d.hub_name, split=split)
        except Exception as e:  # offline, unknown name, unknown split: say what was asked and how to work offline
            raise ConfigError(f"{where}: could not load split {split!r} ({type(e).__name__}: {e}); for offline work "
                              "set data.path to local text files (or paths.data_dir for a preset's local copy)") from e
        col = d.text_column
        if col not in ds.column_names:
            raise ConfigError(f"{where} split {split!r} has no column data.text_column={col!r}; it has "
                              f"{ds.column_names}")
        ds = ds.select_columns([col])
        return _clean(ds.rename_column(col, "text") if col != "text" else ds, keep_in_memory=False)

    train = load(d.hub_split or "train")
    if len(train) == 0:
        raise ConfigError(f"{where} split {d.hub_split or 'train'!r} holds no text")
    if d.hub_val_split:
        return {"train": train, "validation": load(d.hub_val_split)}
    return _split(train, d.val_fraction, "data.hub", d.hub)


def _mixture(d: DataConfig, cache_dir: str | None = None) -> dict:
    """Training documents interleaved from the sources with probabilities proportional to their weights until every
    source is used up (smaller sources repeat); validation is every source's held-out documents, unmixed."""
    import datasets

    parts = [_source(s["path"], s.get("val_path"), d.doc_sep, d.val_fraction, f"data.mix[{i}]", cache_dir)
             for i, s in enumerate(d.mix)]
    weights = [float(s.get("weight", 1.0)) for s in d.mix]
    probs = [w / sum(weights) for w in weights]
    mixed = datasets.interleave_datasets([p["train"] for p in parts], probabilities=probs, seed=d.mix_seed,
                                         stopping_strategy="all_exhausted")
    return {"train": mixed, "validation": datasets.concatenate_datasets([p["validation"] for p in parts])}


def source_val_blocks(d: DataConfig, t: TokenizerConfig, cache_dir: str | None, tok) -> list[dict[str, torch.Tensor]]:
    """``data.mix``: each source's validation documents packed on their own -- the same cleaning, tokenizer, word
    segmenter and block length as the mixture's validation split (which is these documents in source order), at most
    ``data.max_val_blocks`` blocks each -- for the per-source fixed-mask losses of ``eval.per_source``. In memory:
    validation splits are small. ``d``, ``t``: ``data.*``, ``tokenizer.*``."""
    out = []
    for i, s in enumerate(d.mix):
        val = _source(s["path"], s.get("val_path"), d.doc_sep, d.val_fraction, f"data.mix[{i}]", cache_dir)["validation"]
        texts = list(_cleaned(d, {"validation": val}, cache_dir)["validation"]["text"])
        ids, words = tokenize(tok, texts, t.word_segmenter)
        out.append({k: v[: d.max_val_blocks] for k, v in pack(ids, words, d.max_seq_len).items()})
    return out


def tokenizer_key(d: DataConfig, t: TokenizerConfig, given=None) -> dict:
    """What identifies a trained tokenizer. The word segmenter is left out: it changes word ids, not the vocabulary,
    so runs with and without segmentation share one tokenizer (and the blocks key adds it back). ``d``, ``t``:
    ``data.*``, ``tokenizer.*``. ``given``: a tokenizer that was not trained on this corpus (``init.*``: the start's),
    identified by its content."""
    if given is not None:
        import hashlib

        return {"corpus": corpus_key(d), "tokenizer_sha": hashlib.sha256(given.to_str().encode()).hexdigest(),
                "trainer": "given"}
    tk = {k: v for k, v in plain(t).items() if k != "word_segmenter"}
    return {"corpus": corpus_key(d), "tokenizer": tk, "trainer": 2}  # 2: deterministic (train_wordpiece)


class _Packer:
    """Writes documents, in order, into ``[CLS] <body> [SEP]`` blocks of preallocated arrays (numpy or memory-mapped):
    documents joined by ``[SEP]``, no trailing ``[SEP]``, the last block padded with its ``[SEP]`` right after its last
    real token. Word ids are made distinct across documents and counted from 0 in each block."""

    def __init__(self, input_ids: np.ndarray, word_ids: np.ndarray, special: np.ndarray):
        self.x, self.w, self.sp = input_ids, word_ids, special
        self.body = input_ids.shape[1] - 2
        self.row, self.word_offset, self.started = 0, 0, False
        self.buf_ids: list[np.ndarray] = []
        self.buf_w: list[np.ndarray] = []
        self.buffered = 0

    @staticmethod
    def n_blocks(lengths: np.ndarray, body: int) -> int:
        lengths = lengths[lengths > 0]
        total = int(lengths.sum()) + max(0, len(lengths) - 1)
        return -(-total // body)

    def add(self, ids: np.ndarray, words: np.ndarray) -> None:
        if len(ids) == 0:
            return
        if self.started:
            self._push(np.asarray([SEP], dtype=np.int64), np.asarray([-1], dtype=np.int64))
        self.started = True
        w = np.asarray(words, dtype=np.int64)
        real = w >= 0
        self._push(np.asarray(ids, dtype=np.int64), np.where(real, w + self.word_offset, -1))
        self.word_offset += int(w.max()) + 1 if real.any() else 0
        if self.buffered >= self.body * 1024:  # write ~1024 blocks at a time
            self._flush(final=False)

    def _push(self, ids: np.ndarray, w: np.ndarray) -> None:
        self.buf_ids.append(ids)
        self.buf_w.append(w)
        self.buffered += len(ids)

    def _flush(self, final: bool) -> None:
        ids, w = np.concatenate(self.buf_ids), np.concatenate(self.buf_w)
        n = len(ids) // self.body if not final else -(-len(ids) // self.body)
        take = min(len(ids), n * self.body)
        rest_ids, rest_w = ids[take:], w[take:]
        ids, w = ids[:take], w[:take]
        pad = n * self.body - take
        if n:
            body_ids = np.concatenate([ids, np.full(pad, PAD)]).reshape(n, self.body)
            body_w = np.concatenate([w, np.full(pad, -1)]).reshape(n, self.body)
            x = np.concatenate([np.full((n, 1), CLS), body_ids, np.full((n, 1), SEP)], axis=1)
            if pad:  # move the last block's closing [SEP] right after its last real token
                x[-1, -1] = PAD
                x[-1, 1 + self.body - pad] = SEP
            wid = np.concatenate([np.full((n, 1), -1), body_w, np.full((n, 1), -1)], axis=1)
            big = np.iinfo(np.int64).max
            first = np.where(wid >= 0, wid, big).min(axis=1, keepdims=True)
            wid = np.where(wid >= 0, wid - np.where(first == big, 0, first), -1)
            rows = slice(self.row, self.row + n)
            self.x[rows], self.w[rows] = x, wid
            self.sp[rows] = (x < len(SPECIAL_TOKENS)) & (x != UNK)  # [UNK] is an ordinary token: masked, predicted
            self.row += n
        self.buf_ids, self.buf_w, self.buffered = [rest_ids], [rest_w], len(rest_ids)

    def finish(self) -> None:
        if self.buffered:
            self._flush(final=True)
        if self.row != len(self.x):
            raise AssertionError(f"packed {self.row} blocks into {len(self.x)} rows")


def pack(ids: list[list[int]], word_ids: list[list[int | None]], max_seq_len: int) -> dict[str, torch.Tensor]:
    """Pack tokenized documents into ``[CLS] ... [SEP]`` blocks (the last one padded), in memory."""
    n = _Packer.n_blocks(np.asarray([len(d) for d in ids], dtype=np.int64), max_seq_len - 2)
    if n == 0:
        raise ConfigError("the corpus produced no tokens")
    x, w = np.zeros((n, max_seq_len), np.int32), np.zeros((n, max_seq_len), np.int32)
    sp = np.zeros((n, max_seq_len), bool)
    p = _Packer(x, w, sp)
    for d, dw in zip(ids, word_ids):
        p.add(np.asarray(d, dtype=np.int64), np.asarray([-1 if v is None else v for v in dw], dtype=np.int64))
    p.finish()
    return {"input_ids": torch.from_numpy(x), "special_tokens_mask": torch.from_numpy(sp),
            "word_ids": torch.from_numpy(w)}


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


def _tokenize_batch(batch: dict, tok, segmenter: str) -> dict:
    ids, words = tokenize(tok, batch["text"], segmenter)
    return {"ids": ids, "words": [[-1 if v is None else v for v in w] for w in words],
            "length": [len(i) for i in ids]}


def tokenized_corpus(d: DataConfig, t: TokenizerConfig, cache_dir: str, tok, split: str, docs,
                     given: bool = False) -> object:
    """The token ids and word ids of one split's documents: ``datasets.map(batched=True, num_proc=data.num_proc)``
    over the Arrow documents, saved under ``<cache_dir>/tokens/<hash>/`` (the hash of corpus, tokenizer, segmenter and
    split) and memory-mapped from there, so a sweep tokenizes once and changing ``data.max_seq_len`` only re-packs."""
    import datasets

    segmenter = t.word_segmenter
    key = {**tokenizer_key(d, t, tok if given else None), "split": split, "word_segmenter": segmenter, "version": 1}

    def build(tmp: Path) -> None:
        ds = docs()[split]
        num_proc = d.num_proc if d.num_proc > 1 and len(ds) >= 2 * d.num_proc else None
        scratch = tmp.parent / f".map{os.getpid()}"  # map's own Arrow output (shards with num_proc), out of RAM
        out = ds.map(_tokenize_batch, batched=True, batch_size=1000, num_proc=num_proc, remove_columns=ds.column_names,
                     fn_kwargs={"tok": tok, "segmenter": segmenter}, cache_file_name=f"{scratch}.arrow",
                     new_fingerprint=config_hash(key),
                     features=datasets.Features({"ids": datasets.Sequence(datasets.Value("int32")),
                                                 "words": datasets.Sequence(datasets.Value("int32")),
                                                 "length": datasets.Value("int64")}))
        log.info("tokenized %d %s documents (num_proc=%s)", len(out), split, num_proc or 1)
        out.save_to_disk(str(tmp))
        del out
        for f in tmp.parent.glob(f"{scratch.name}*"):
            f.unlink()

    return datasets.load_from_disk(str(cached_file(cache_dir, "tokens", key, "tokens", build)))


def pack_dataset(tokens, max_seq_len: int, out_dir: Path, what: str = "the corpus") -> None:
    """Pack a tokenized split (:func:`tokenized_corpus`) into ``.npy`` files under ``out_dir``, streaming over Arrow
    record batches into memory-mapped arrays: a corpus larger than RAM packs in bounded memory."""
    out_dir.mkdir(parents=True)
    lengths = tokens.data.column("length").to_numpy().astype(np.int64)
    n = _Packer.n_blocks(lengths, max_seq_len - 2)
    if n == 0:
        raise ConfigError(f"{what} produced no tokens")
    # documents longer than a block are not cut off: packing streams them over consecutive blocks (counted here)
    long_docs = int((lengths > max_seq_len - 2).sum())
    (out_dir / "stats.json").write_text(json.dumps({
        "docs": len(lengths), "blocks": n, "long_docs": long_docs, "max_doc_tokens": int(lengths.max(initial=0)),
        "block_body_tokens": max_seq_len - 2}))
    arrays = {name: np.lib.format.open_memmap(out_dir / f"{name}.npy", mode="w+", dtype=dtype, shape=(n, max_seq_len))
              for name, dtype in (("input_ids", np.int32), ("word_ids", np.int32), ("special_tokens_mask", bool))}
    p = _Packer(arrays["input_ids"], arrays["word_ids"], arrays["special_tokens_mask"])
    for table in tokens.with_format("arrow").iter(batch_size=10_000):
        ids_col, w_col = table.column("ids").combine_chunks(), table.column("words").combine_chunks()
        io, wo = ids_col.offsets.to_numpy(), w_col.offsets.to_numpy()  # absolute offsets into .values
        flat_ids, flat_w = ids_col.values.to_numpy(), w_col.values.to_numpy()
        for i in range(len(io) - 1):
            p.add(flat_ids[io[i] : io[i + 1]], flat_w[wo[i] : wo[i + 1]])
    p.finish()
    for a in arrays.values():
        a.flush()


def load_blocks(d: Path) -> dict[str, torch.Tensor]:
    """Packed blocks as tensors over memory-mapped ``.npy`` files (copy-on-write: pages load on use, nothing is read
    whole into RAM)."""
    return {name: torch.from_numpy(np.load(d / f"{name}.npy", mmap_mode="c"))
            for name in ("input_ids", "special_tokens_mask", "word_ids")}


def iter_rows(t: torch.Tensor, chunk: int = 65_536):
    """Row chunks of a (memory-mapped) block tensor, so statistics over a corpus never materialise a full copy."""
    for i in range(0, len(t), chunk):
        yield t[i : i + chunk]


def block_stats(blocks: dict[str, torch.Tensor]) -> dict[str, float | int]:
    """Exact counts over packed blocks, chunk by chunk: ``tokens`` (non-pad), ``cand_frac`` (share of positions that
    may be masked) and ``token_frac`` (share of non-pad positions after [CLS])."""
    n = len(blocks["input_ids"])
    seq = blocks["input_ids"].shape[1]
    tokens = cand = body = 0
    for x, sp in zip(iter_rows(blocks["input_ids"]), iter_rows(blocks["special_tokens_mask"])):
        tokens += int((x != PAD).sum())
        body += int((x[:, 1:] != PAD).sum())
        cand += int((~sp).sum())
    return {"tokens": tokens, "cand_frac": cand / (n * seq), "token_frac": body / (n * (seq - 1))}


def get_blocks(d: DataConfig, t: TokenizerConfig, cache_dir: str,
               report: dict | None = None, tok=None) -> tuple[object, dict[str, dict[str, torch.Tensor]]]:
    """The tokenizer and the packed blocks of both splits of ``data.*`` (``d``) with ``tokenizer.*`` (``t``), from the
    cache (``paths.cache_dir``) when the same settings made them before. ``report``: filled with each split's packing
    statistics (documents, long documents spread over several blocks). ``tok``: a given tokenizer (``init.*``: the
    start's) instead of one trained on the corpus."""
    given = tok
    docs: dict = {}

    def lazy_docs() -> dict:
        if not docs:
            docs.update(document_datasets(d, cache_dir))
        return docs

    def build_tok(tmp: Path) -> None:
        def texts():
            return (x for batch in lazy_docs()["train"].iter(batch_size=1000) for x in batch["text"])

        train_wordpiece(texts, t.vocab_size, t.lowercase, t.min_frequency).save(str(tmp))

    if given is None:
        tok = load_tokenizer(cached_file(cache_dir, "tokenizer", tokenizer_key(d, t), "tokenizer.json", build_tok))
    got, asked = tok.get_vocab_size(), t.vocab_size
    if got != asked and given is None:  # recorded as data.vocab_size in results.json; said here so that nobody reads the wrong number
        why = ("every character of the corpus is kept as a token (WordPiece's alphabet), more than the size asked for"
               if got > asked else f"the corpus has no more pieces seen >= {t.min_frequency} times")
        log.warning("tokenizer.vocab_size=%d asked, the tokenizer has %d tokens: %s", asked, got, why)

    segmenter = t.word_segmenter
    out = {}
    for split in ("train", "validation"):
        key = {**tokenizer_key(d, t, given), "max_seq_len": d.max_seq_len, "packing": 2, "split": split}
        if segmenter != "none":
            key["word_segmenter"] = segmenter

        def build(tmp: Path, split=split) -> None:
            src = d.hub if uses_hub(d) else (d.path or d.name)
            pack_dataset(tokenized_corpus(d, t, cache_dir, tok, split, lazy_docs, given is not None), d.max_seq_len, tmp,
                         f"the {split} split of data={d.name} ({src})")

        where = cached_file(cache_dir, "blocks", key, "blocks", build)
        out[split] = load_blocks(where)
        if report is not None and (where / "stats.json").exists():
            report[split] = json.loads((where / "stats.json").read_text())
    return tok, out
