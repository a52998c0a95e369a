"""WordPiece tokenizer training and loading with HF `tokenizers`.

Special tokens always get the ids 0..4 in the order of :data:`SPECIAL_TOKENS`, so masking code and tests can rely on
``[PAD] == 0`` and "special" meaning ``id < len(SPECIAL_TOKENS)`` for our own tokenizers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD, UNK, CLS, SEP, MASK = range(len(SPECIAL_TOKENS))


def train_wordpiece(
    texts: Iterable[str], vocab_size: int, lowercase: bool = True, min_frequency: int = 2
) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    # BertNormalizer puts spaces around CJK characters, so Chinese text becomes one "word" per character here;
    # word segmentation for whole-word masking is a separate step (issue: masking units).
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
