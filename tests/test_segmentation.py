"""Chinese word segmentation (jieba) for whole-word masking: word ids change, token ids never do."""

from pathlib import Path

import pytest
import torch
from conftest import blocks_of

from mlmlab.data.corpus import pack, tokenize
from mlmlab.data.tokenizer import segment_words, train_wordpiece

pytest.importorskip("jieba")

ZH_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "zh_corpus" / "train.txt"

SENTENCES = [
    "我们喜欢这家酒店的服务。房间很干净。",
    "快递很快，包装也很好，东西质量不错。",
    "今天才拿到货，打开一看有问题，让我很失望！",
    "价格还是挺超值的，下次还会再来购买。",
    "送餐速度太慢了，饭菜都凉了，不会再点了。",
    "手机屏幕很清楚，电池也很耐用，推荐购买。",
    "买了iPhone12，用了一个月感觉还不错。",
    "客服态度非常好，耐心解答了我的问题。",
    "辛苦了～～ 谢谢骑士！❤❤",
    "这本书的内容很丰富，孩子非常喜欢看。",
]


@pytest.fixture(scope="module")
def tok():
    return train_wordpiece(SENTENCES * 3, vocab_size=400, min_frequency=1)


def multi_token_word_fraction(word_ids: torch.Tensor) -> float:
    """Fraction of words (over all blocks) that span >= 2 tokens."""
    spans = [torch.unique_consecutive(row[row >= 0], return_counts=True)[1] for row in word_ids]
    counts = torch.cat(spans)
    return (counts >= 2).float().mean().item()


def test_jieba_words_share_one_word_id(tok):
    text = SENTENCES[0]
    words = segment_words([text], "jieba")[0]
    assert "".join(words) == text and any(len(w) >= 2 for w in words)
    (ids,), (wids,) = tokenize(tok, [text], "jieba")
    (ids0,), (wids0,) = tokenize(tok, [text])
    assert ids == ids0  # segmentation changes word ids only
    assert wids0 == list(range(len(text)))  # without it: every character is its own word
    # each character is one token here, so the word ids are exactly the jieba word index of each character
    assert wids == [i for i, w in enumerate(words) for _ in w]


@pytest.mark.parametrize("text", SENTENCES)
def test_token_ids_unchanged_and_word_ids_follow_jieba(tok, text):
    words = segment_words([text], "jieba")[0]
    assert all(w.strip() for w in words)  # whitespace-only pieces dropped
    (ids,), (wids,) = tokenize(tok, [text], "jieba")
    (ids0,), (wids0,) = tokenize(tok, [text])
    assert ids == ids0
    assert wids[0] == 0 and all(b - a in (0, 1) for a, b in zip(wids, wids[1:]))  # dense, non-decreasing
    # pieces of one tokenizer word are never split, and tokens of one jieba word are never split either
    enc = tok.encode(text, add_special_tokens=False)
    char_word = [i for i, w in enumerate(words) for _ in w]  # valid on the text with whitespace removed
    keep = [i for i, c in enumerate(text) if not c.isspace()]
    jieba_of = {pos: char_word[k] for k, pos in enumerate(keep)}
    seg = [jieba_of[start] for start, _ in enc.offsets]
    for i in range(1, len(ids)):
        if wids0[i] == wids0[i - 1] or seg[i] == seg[i - 1]:
            assert wids[i] == wids[i - 1]
        else:
            assert wids[i] == wids[i - 1] + 1


def test_is_pretokenized_would_change_token_ids(tok):
    """Why tokenize() aligns jieba words by character offsets instead of re-encoding them with is_pretokenized=True.

    With is_pretokenized, word_ids do index the input words (the pre-tokenizer still splits inside each word), but
    wherever jieba splits one tokenizer word (``～～`` -> ``～``, ``～``) the token ids change: ``～ ##～`` vs ``～ ～``.
    """
    text = "辛苦了～～"
    words = segment_words([text], "jieba")[0]
    assert words[-2:] == ["～", "～"]
    pre = tok.encode(words, is_pretokenized=True, add_special_tokens=False)
    plain = tok.encode(text, add_special_tokens=False)
    assert pre.word_ids[:2] == [0, 0]  # 辛苦: two characters, one input word
    assert pre.ids != plain.ids
    (ids,), (wids,) = tokenize(tok, [text], "jieba")
    assert ids == plain.ids and len(ids) > 3 and wids == [0, 0, 1] + [2] * (len(ids) - 3)  # 辛苦 | 了 | ～～


def test_unknown_segmenter_is_rejected():
    with pytest.raises(ValueError, match="unknown word segmenter"):
        segment_words(["你好"], "pkuseg")


def test_packing_keeps_segmented_word_ids(tok):
    docs = SENTENCES * 2
    ids, wids = tokenize(tok, docs, "jieba")
    b = pack(ids, wids, max_seq_len=24)
    b0 = pack(*tokenize(tok, docs), max_seq_len=24)
    assert torch.equal(b["input_ids"], b0["input_ids"])
    assert torch.equal(b["special_tokens_mask"], b0["special_tokens_mask"])
    w = b["word_ids"]
    assert ((w == -1) == b["special_tokens_mask"]).all()
    for row in w:
        v = row[row >= 0]
        assert v[0] == 0 and ((v[1:] - v[:-1]) >= 0).all() and ((v[1:] - v[:-1]) <= 1).all()
    assert multi_token_word_fraction(w) > 0.3
    assert multi_token_word_fraction(b0["word_ids"]) < 0.05


@pytest.mark.parametrize("corpus", ["inline", "zh_corpus"])
def test_get_blocks_with_jieba(cfg_factory, cache_dir, tmp_path, corpus):
    f = tmp_path / "zh.txt"
    if corpus == "zh_corpus":
        if not ZH_CORPUS.exists():
            pytest.skip(f"shared data absent: {ZH_CORPUS}")
        with open(ZH_CORPUS, encoding="utf-8") as src:
            lines = [next(src) for _ in range(300)]
        f.write_text("".join(lines), encoding="utf-8")
    else:
        f.write_text("\n".join(SENTENCES * 5) + "\n", encoding="utf-8")
    data = ["data=text_files", f"data.path={f}", "data.max_seq_len=64"]
    tok0, b0 = blocks_of(cfg_factory(*data))
    tokenizers = sorted((cache_dir / "tokenizer").iterdir())
    tok1, b1 = blocks_of(cfg_factory(*data, "tokenizer.word_segmenter=jieba"))
    assert sorted((cache_dir / "tokenizer").iterdir()) == tokenizers  # same vocabulary, shared tokenizer
    assert tok1.to_str() == tok0.to_str()
    for split in ("train", "validation"):
        assert torch.equal(b1[split]["input_ids"], b0[split]["input_ids"])
        assert torch.equal(b1[split]["special_tokens_mask"], b0[split]["special_tokens_mask"])
        assert not torch.equal(b1[split]["word_ids"], b0[split]["word_ids"])
        assert ((b1[split]["word_ids"] == -1) == b1[split]["special_tokens_mask"]).all()
    frac, frac0 = multi_token_word_fraction(b1["train"]["word_ids"]), multi_token_word_fraction(b0["train"]["word_ids"])
    assert frac > 0.25, frac  # jieba: many words of >= 2 characters
    assert frac0 < 0.05, frac0  # no segmentation: Chinese characters are single-token words
