"""WordPiece tokenizer training and loading with HF `tokenizers`.

Special tokens always get the ids 0..4 in the order of :data:`SPECIAL_TOKENS`, so masking code and tests can rely on
``[PAD] == 0`` and "special" meaning ``id < len(SPECIAL_TOKENS)`` for our own tokenizers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD, UNK, CLS, SEP, MASK = range(len(SPECIAL_TOKENS))
WORD_SEGMENTERS = ("none", "jieba")


def train_wordpiece(
    texts: Iterable[str] | Callable[[], Iterable[str]], vocab_size: int, lowercase: bool = True, min_frequency: int = 2
) -> Tokenizer:
    """A WordPiece tokenizer trained on ``texts`` (a re-iterable, or a function returning a fresh iterator: it is read
    twice), the same vocabulary on every run and machine for the same texts.

    ``tokenizers``' WordPiece/BPE trainer alone is not deterministic (huggingface/tokenizers#1794): it gives the
    continuing-subword pieces ``##c`` ids in hash-map order, and those ids break ties between equally frequent merges,
    so two runs on the same corpus can learn different vocabularies. Here every ``##c`` that the corpus can produce
    (each character after the first of a pre-tokenized word) is registered up front, in sorted order, so no id depends
    on iteration order. They are registered as special tokens for the trainer only and then turned back into ordinary
    vocabulary entries, so they encode, decode and export like any other piece.
    """
    if not callable(texts) and iter(texts) is texts:
        raise TypeError("train_wordpiece reads texts twice: pass a list (or other re-iterable) or a function "
                        "returning a fresh iterator, not a one-shot iterator")

    def read() -> Iterable[str]:
        return texts() if callable(texts) else texts

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    # BertNormalizer puts spaces around CJK characters, so Chinese text becomes one "word" per character here;
    # Chinese word boundaries for whole-word masking come from segment_words (tokenizer.word_segmenter=jieba) and
    # change only the word ids (corpus.tokenize); the vocabulary stays character-level.
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, handle_chinese_chars=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    continuing = sorted(_continuing_chars(tok, read()))
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=[*SPECIAL_TOKENS, *(f"##{c}" for c in continuing)],
        min_frequency=min_frequency, show_progress=False,
    )
    tok.train_from_iterator(_batched(read()), trainer=trainer)
    spec = json.loads(tok.to_str())  # the ##c pieces: ordinary vocabulary again, not added (special) tokens
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in SPECIAL_TOKENS]
    tok = Tokenizer.from_str(json.dumps(spec))
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, f"special token {t} got id {tok.token_to_id(t)}, expected {i}"
    return tok


def _continuing_chars(tok: Tokenizer, texts: Iterable[str]) -> set[str]:
    """Every character that follows the first one in a word of ``texts`` (after normalization and pre-tokenization)."""
    chars: set[str] = set()
    norm, pre = tok.normalizer.normalize_str, tok.pre_tokenizer.pre_tokenize_str
    for t in texts:
        for w, _ in pre(norm(t)):
            if len(w) > 1:
                chars.update(w[1:])
    return chars


def _batched(texts: Iterable[str], n: int = 1000) -> Iterator[list[str]]:
    batch: list[str] = []
    for t in texts:
        batch.append(t)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def load_tokenizer(path: str | Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def segment_words(texts: Iterable[str], segmenter: str) -> list[list[str]]:
    """Split each text into words with a word segmenter (``"jieba"``), dropping whitespace-only pieces.

    The words are in text order and each is a substring of its text (jieba keeps every character), so they can be
    located again with ``str.find``. Non-Chinese runs (Latin words, numbers) stay as the segmenter returns them.
    jieba is imported only here, so English corpora never load it.
    """
    if segmenter == "jieba":
        import jieba

        jieba.setLogLevel(logging.WARNING)  # silence "Building prefix dict ..." on first use
        return [[w for w in jieba.lcut(t) if w.strip()] for t in texts]
    raise ValueError(f"unknown word segmenter {segmenter!r}; expected one of {WORD_SEGMENTERS[1:]}")
