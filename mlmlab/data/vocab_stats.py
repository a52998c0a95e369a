"""The data side of the replacement samplers: token counts, word lists and domain corpora, behind a SamplerContext.

:mod:`mlmlab.masking.replacement` is pure torch; everything a sampler needs from files or the tokenizer comes through
the callables of the :class:`~mlmlab.masking.replacement.SamplerContext` built here. They are lazy (a uniform run counts
nothing and reads nothing) and their results are cached on disk like the blocks, so a sweep counts each corpus once:

- ``token_counts()``: bincount of the training blocks' non-special ids (``[UNK]`` included, as in the blocks' mask),
  keyed like the blocks (corpus + tokenizer config, sequence length, block shape);
- ``corpus_counts(path)``: bincount of a domain text corpus (a .txt file or a folder of them) under the tokenizer,
  keyed by the tokenizer's content and each file's resolved path, size and mtime;
- ``read_lines(path)``: a UTF-8 word list, stripped, without empty lines and ``#`` comments;
- ``encode_words(words)``: each string -> its piece ids, without [CLS]/[SEP].

Relative paths resolve against the current directory and, if not found there, against ``paths.data_dir``
(env ``MLMLAB_DATA_DIR``), e.g. ``mask.sampler.corpus=finance_corpus/train.txt``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mlmlab.data.cache import cached_file, config_hash
from mlmlab.data.corpus import _read_docs, iter_rows, text_files, tokenizer_key
from mlmlab.data.tokenizer import SPECIAL_TOKENS, UNK
from mlmlab.errors import ConfigError
from mlmlab.masking.replacement import SamplerContext

if TYPE_CHECKING:
    from mlmlab.data.schema import DataConfig, PathsConfig, TokenizerConfig

COUNTS_VERSION = 1


def find_data_path(path: str, data_dir: str | None, key: str) -> Path:
    """``path`` as given (``~`` expanded) if it exists, else ``data_dir/path`` for a relative path; ConfigError naming
    the key, the path and where it was looked for otherwise."""
    p = Path(str(path)).expanduser()
    if p.exists():
        return p
    tried = [str(p.resolve())]
    if data_dir is not None and not p.is_absolute():
        q = Path(str(data_dir)).expanduser() / p
        if q.exists():
            return q
        tried.append(str(q.resolve()))
    hint = "" if data_dir is not None or p.is_absolute() else " (set paths.data_dir or env MLMLAB_DATA_DIR to look there too)"
    raise ConfigError(f"{key}={path!r} does not exist; looked for {' and '.join(tried)}{hint}")


def read_lines(path: str, data_dir: str | None = None, key: str = "mask.sampler.word_list") -> list[str]:
    """The stripped, non-empty, non-``#`` lines of a UTF-8 text file."""
    p = find_data_path(path, data_dir, key)
    if not p.is_file():
        raise ConfigError(f"{key}={path!r} is not a file ({p}); expected a text file with one entry per line")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{key}={path!r} is not valid UTF-8 ({e.reason} at byte {e.start})") from e
    return [s for s in (line.strip() for line in text.splitlines()) if s and not s.startswith("#")]


def encode_words(tok, words: list[str]) -> list[list[int]]:
    """Each string -> its piece ids under ``tok`` (no [CLS]/[SEP])."""
    return [e.ids for e in tok.encode_batch(list(words), add_special_tokens=False)] if words else []


def block_token_counts(blocks: dict[str, torch.Tensor], vocab_size: int) -> torch.Tensor:
    """int64 [vocab_size]: how often each id occurs at the non-special positions of packed blocks."""
    total = torch.zeros(vocab_size, dtype=torch.int64)
    for x, sp in zip(iter_rows(blocks["input_ids"]), iter_rows(blocks["special_tokens_mask"])):
        total += _bincount(x.long()[~sp.bool()], vocab_size)
    return total


def block_doc_freq(blocks: dict[str, torch.Tensor], vocab_size: int, chunk: int = 4096) -> torch.Tensor:
    """int64 [vocab_size]: in how many blocks each id occurs at a non-special position."""
    total = torch.zeros(vocab_size, dtype=torch.int64)
    for x, sp in zip(iter_rows(blocks["input_ids"], chunk), iter_rows(blocks["special_tokens_mask"], chunk)):
        ids = x.long().masked_fill(sp.bool(), vocab_size)  # specials to an extra column, dropped
        seen = torch.zeros((len(ids), vocab_size + 1), dtype=torch.bool).scatter_(1, ids, True)
        total += seen[:, :vocab_size].sum(0)
    return total


def _bincount(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return torch.bincount(ids.flatten(), minlength=vocab_size)[:vocab_size].long()


def text_token_counts(tok, texts: list[str], vocab_size: int, batch: int = 10_000) -> torch.Tensor:
    """int64 [vocab_size]: how often each id occurs when ``texts`` are tokenized (no [CLS]/[SEP] added)."""
    total = torch.zeros(vocab_size, dtype=torch.int64)
    for i in range(0, len(texts), batch):
        flat = [j for ids in encode_words(tok, texts[i : i + batch]) for j in ids]
        total += _bincount(torch.tensor(flat, dtype=torch.long), vocab_size)
    return total


def _tokenizer_hash(tok) -> str:
    return hashlib.sha256(tok.to_str().encode()).hexdigest()[:16]


def _cached_counts(cache_dir: str, kind: str, key: dict, compute) -> torch.Tensor:
    def build(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            torch.save(compute(), f)

    return torch.load(cached_file(cache_dir, kind, key, "counts.pt", build), weights_only=True)


def train_blocks_key(d: DataConfig, t: TokenizerConfig, tok, train: dict[str, torch.Tensor]) -> dict:
    """What identifies statistics of the packed training blocks: the corpus and tokenizer config, the block length and
    shape, the tokenizer's content (a given one, ``init.*``, included)."""
    return {**tokenizer_key(d, t), "max_seq_len": d.max_seq_len, "split": "train",
            "blocks_shape": list(train["input_ids"].shape), "tokenizer_sha": _tokenizer_hash(tok),
            "version": COUNTS_VERSION}


def make_sampler_context(d: DataConfig, t: TokenizerConfig, paths: PathsConfig, tok,
                         blocks: dict[str, dict[str, torch.Tensor]]) -> SamplerContext:
    """The SamplerContext of a run: ``tok`` and ``blocks`` are what :func:`mlmlab.data.corpus.get_blocks` returned for
    ``data.*`` (``d``) and ``tokenizer.*`` (``t``); ``paths.*``: the cache and the data dir."""
    vocab_size = tok.get_vocab_size()
    special = tuple(sorted(i for i in (tok.token_to_id(s) for s in SPECIAL_TOKENS) if i is not None))
    cache_dir, data_dir = paths.cache_dir, paths.data_dir
    memo: dict[str, torch.Tensor] = {}

    def train_counts(kind: str, compute) -> torch.Tensor:
        """A statistic of the training blocks, counted once per corpus, tokenizer and block shape (cached)."""
        if kind not in memo:
            memo[kind] = _cached_counts(cache_dir, kind, train_blocks_key(d, t, tok, blocks["train"]),
                                        lambda: compute(blocks["train"], vocab_size))
        return memo[kind]

    def token_counts() -> torch.Tensor:
        return train_counts("token_counts", block_token_counts)

    def doc_freq() -> tuple[torch.Tensor, int]:
        """How many training blocks hold each id (a block stands for a document), and the number of blocks."""
        return train_counts("doc_freq", block_doc_freq), len(blocks["train"]["input_ids"])

    def corpus_counts(path: str, key: str = "mask.sampler.corpus") -> torch.Tensor:
        p = str(find_data_path(path, data_dir, key))
        files = text_files(p, key)
        ckey = {"tokenizer_sha": _tokenizer_hash(tok), "vocab_size": vocab_size, "version": COUNTS_VERSION,
                "files": [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]}
        h = config_hash(ckey)
        if h not in memo:
            memo[h] = _cached_counts(cache_dir, "corpus_counts", ckey,
                                     lambda: text_token_counts(tok, _read_docs(p, "line", key), vocab_size))
        return memo[h]

    return SamplerContext(
        vocab_size=vocab_size,
        special_ids=special,
        token_counts=token_counts,
        encode_words=lambda words: encode_words(tok, words),
        corpus_counts=corpus_counts,
        read_lines=lambda path, key="mask.sampler.word_list": read_lines(path, data_dir, key),
        unk_id=tok.token_to_id(SPECIAL_TOKENS[UNK]),
        doc_freq=doc_freq,
    )
