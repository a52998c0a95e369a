"""WordPiece tokenizer training and loading with HF `tokenizers`.

Special tokens always get the ids 0..4 in the order of :data:`SPECIAL_TOKENS`, so masking code and tests can rely on
``[PAD] == 0`` and "special" meaning ``id < len(SPECIAL_TOKENS)`` for our own tokenizers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD, UNK, CLS, SEP, MASK = range(len(SPECIAL_TOKENS))
WORD_SEGMENTERS = ("none", "jieba")


def train_wordpiece(
    texts: Iterable[str], vocab_size: int, lowercase: bool = True, min_frequency: int = 2
) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    # BertNormalizer puts spaces around CJK characters, so Chinese text becomes one "word" per character here;
    # Chinese word boundaries for whole-word masking come from segment_words (tokenizer.word_segmenter=jieba) and
    # change only the word ids (corpus.tokenize); the vocabulary stays character-level.
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, handle_chinese_chars=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), min_frequency=min_frequency, show_progress=False
    )
    tok.train_from_iterator(_batched(texts), trainer=trainer)
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, f"special token {t} got id {tok.token_to_id(t)}, expected {i}"
    return tok


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
