"""Built-in corpus, tokenizer, packing and caching."""

import pytest
import torch
from conftest import SHARED, blocks_of

from mlmlab.data import builtin
from mlmlab.data.corpus import get_blocks, load_documents, pack, tokenize
from mlmlab.data.tokenizer import CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK, train_wordpiece

# corpus_key / tokenizer_key hashes of the debug=fast built-in corpus (tests/conftest.py FAST)
PINNED_BUILTIN_KEYS = ("8fbd9695b58b7b88", "9071f6b227b8f007")


def test_builtin_is_deterministic_and_tasks_hold_out_words():
    assert builtin.generate_corpus(50, seed=3) == builtin.generate_corpus(50, seed=3)
    assert builtin.generate_corpus(50, seed=3) != builtin.generate_corpus(50, seed=4)
    lex = builtin.make_lexicon(0, 8)
    train = builtin.generate_task("builtin_sentiment", "train", 300, seed=0)
    test = builtin.generate_task("builtin_sentiment", "test", 300, seed=0)
    words = lambda exs: {w for e in exs for w in e["text"].split()}  # noqa: E731
    polar = set(lex.pos_adj) | set(lex.neg_adj)
    seen, held = words(train) & polar, words(test) & polar
    assert seen and held and not (seen & held)  # evaluation uses only opinion words absent from labelled training
    assert {e["label"] for e in train} == {0, 1}
    topic = builtin.generate_task("builtin_topic", "train", 300, seed=0)
    assert {e["label"] for e in topic} == set(range(8))


def test_tokenizer_special_ids():
    tok = train_wordpiece(builtin.generate_corpus(300, seed=0), vocab_size=300)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD, UNK, CLS, SEP, MASK]
    assert tok.get_vocab_size() <= 300


def test_pack_blocks_specials_and_word_ids():
    tok = train_wordpiece(builtin.generate_corpus(300, seed=0), vocab_size=200)  # small vocab: words split
    docs = builtin.generate_corpus(40, seed=1)
    ids, wids = tokenize(tok, docs)
    b = pack(ids, wids, max_seq_len=32)
    x, sp, w = b["input_ids"], b["special_tokens_mask"], b["word_ids"]
    assert x.shape[1] == 32 and (x[:, 0] == CLS).all()
    real = x != PAD
    last_real = real.sum(1) - 1
    assert (x[torch.arange(len(x)), last_real] == SEP).all()
    assert torch.equal(sp, (x == PAD) | (x == CLS) | (x == SEP) | (x == MASK))
    assert ((w == -1) == sp).all()  # special <=> no word
    # every token stream is preserved: concatenating block bodies gives documents joined by [SEP]
    flat = torch.cat([row[1 : int(n)] for row, n in zip(x, last_real)]).tolist()
    expected = []
    for d in ids:
        expected += d + [SEP]
    assert flat == expected[:-1]
    # word ids: non-decreasing within a block, start at 0, and some word spans several pieces
    for row in w:
        v = row[row >= 0]
        assert v[0] == 0 and (v[1:] >= v[:-1]).all()
    assert any(len(set(r)) < len(r) for r in (row[row >= 0].tolist() for row in w))


def test_blocks_are_cached_by_config(cfg_factory, cache_dir):
    cfg = cfg_factory()
    tok1, b1 = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    n_files = sorted(p for p in cache_dir.rglob("*") if p.is_file())
    tok2, b2 = blocks_of(cfg_factory("mask.rate=0.3", "seed=5"))  # masking/seed do not change the data
    assert sorted(p for p in cache_dir.rglob("*") if p.is_file()) == n_files
    assert torch.equal(b1["train"]["input_ids"], b2["train"]["input_ids"])
    _, b3 = blocks_of(cfg_factory("data.max_seq_len=32"))
    assert b3["train"]["input_ids"].shape[1] == 32


def test_text_files_line_and_blank_line(cfg_factory, tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("first doc line\nsecond doc\n\nthird doc\nstill third\n", encoding="utf-8")
    by_line = load_documents(cfg_factory("data=text_files", f"data.path={f}", "data.val_fraction=0.25").data)
    assert by_line["train"] + by_line["validation"] == ["first doc line", "second doc", "third doc", "still third"]
    assert by_line["validation"] == ["still third"]
    by_par = load_documents(cfg_factory("data=text_files", f"data.path={f}", "data.doc_sep=blank_line",
                                        "data.val_fraction=0.5").data)
    assert [d.split() for d in by_par["train"] + by_par["validation"]] == [
        ["first", "doc", "line", "second", "doc"], ["third", "doc", "still", "third"]]


def test_a_vocabulary_that_is_not_the_size_asked_for_is_a_warning(cfg_factory, caplog):
    import logging


    with caplog.at_level(logging.WARNING, logger="mlmlab.data.corpus"):
        tok, _ = blocks_of(cfg_factory("tokenizer.vocab_size=12"))
    assert tok.get_vocab_size() > 12
    assert f"tokenizer.vocab_size=12 asked, the tokenizer has {tok.get_vocab_size()} tokens" in caplog.text


@pytest.mark.parametrize("overrides", [(), ("experiment=real_en",), ("data=finance_mix", f"paths.data_dir={SHARED}")])
def test_cache_keys_are_the_same_from_the_typed_config_and_the_composed_node(cfg_factory, overrides):
    """The job hands the data stages its typed groups (DataConfig ...), tests and notebooks often the composed nodes:
    the corpus, tokenizer and random-init keys must not depend on which, or every cache would be built twice (and
    the ones of earlier runs never found). The built-in corpus's keys are pinned: a change rebuilds every cache."""
    from mlmlab.baseline import LOADER_ONLY
    from mlmlab.config import plain, typed
    from mlmlab.data.cache import config_hash
    from mlmlab.data.corpus import corpus_key, tokenizer_key

    if "data=finance_mix" in overrides and not (SHARED / "finance_corpus").is_dir():
        pytest.skip(f"{SHARED}/finance_corpus is not here")
    node = cfg_factory(*overrides)
    c = typed(node)

    def keys(d, t):
        return (config_hash(corpus_key(d)), config_hash(tokenizer_key(d, t)),
                config_hash({k: v for k, v in plain(d).items() if k not in LOADER_ONLY}))

    assert keys(c.data, c.tokenizer) == keys(node.data, node.tokenizer)
    assert plain(c.downstream) == plain(node.downstream)
    if not overrides:
        assert keys(c.data, c.tokenizer)[:2] == PINNED_BUILTIN_KEYS
