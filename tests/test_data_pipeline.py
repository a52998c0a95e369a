"""The corpus pipeline: hub loading (through a local folder, which datasets.load_dataset treats like a hub name),
datasets.map tokenization (num_proc) cached by config hash, streaming packing into memory-mapped blocks, and a
tokenizer that is the same on every run."""

import json

import numpy as np
import pytest
import torch
from conftest import blocks_of

from mlmlab.config import ConfigError, validate
from mlmlab.data import builtin
from mlmlab.data.corpus import document_datasets, get_blocks, pack, tokenize, uses_hub
from mlmlab.data.tokenizer import train_wordpiece


def hub_folder(tmp_path, n_train=400, n_val=40):
    """A data set folder in a hub repository's layout: <split>.jsonl files with a non-"text" column."""
    d = tmp_path / "my_hub_set"
    d.mkdir()
    docs = builtin.generate_corpus(n_train + n_val, seed=3)
    for split, rows in (("train", docs[:n_train]), ("validation", docs[n_train:])):
        with open(d / f"{split}.jsonl", "w") as f:
            for i, t in enumerate(rows):
                f.write(json.dumps({"id": i, "body": t}) + "\n")
                if i % 50 == 0:
                    f.write(json.dumps({"id": -1, "body": "   "}) + "\n")  # blank documents are dropped
    return d, docs


def test_hub_corpus_loads_with_datasets_and_pretrains(cfg_factory, tmp_path):
    d, docs = hub_folder(tmp_path)
    cfg = cfg_factory("data=hub", f"data.hub={d}", "data.text_column=body", "data.hub_val_split=validation",
                      "data.max_seq_len=32", "data.batch_size=8", "tokenizer.vocab_size=300")
    validate(cfg)
    assert uses_hub(cfg.data)
    ds = document_datasets(cfg.data)
    assert list(ds["train"]["text"]) == docs[:400] and list(ds["validation"]["text"]) == docs[400:]
    tok, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    assert blocks["train"]["input_ids"].shape[1] == 32 and len(blocks["validation"]["input_ids"]) > 0


def test_hub_errors_name_the_key(cfg_factory, tmp_path):
    d, _ = hub_folder(tmp_path)
    with pytest.raises(ConfigError, match=r"data.hub=.* has no column data.text_column='text'; it has \['id', 'body'\]"):
        blocks_of(cfg_factory("data=hub", f"data.hub={d}"))
    with pytest.raises(ConfigError, match=r"could not load split 'nope'.*for offline work set data.path"):
        blocks_of(cfg_factory("data=hub", f"data.hub={d}", "data.text_column=body", "data.hub_split=nope"))
    with pytest.raises(ConfigError, match="data.source='web' is not known; allowed: auto, local, hub"):
        validate(cfg_factory("data=hub", f"data.hub={d}", "data.source=web"))
    with pytest.raises(ConfigError, match="data.num_proc=0 must be >= 1"):
        validate(cfg_factory("data=hub", f"data.hub={d}", "data.num_proc=0"))


def test_wikitext_presets_pick_local_files_or_the_hub(cfg_factory, tmp_path):
    (tmp_path / "wikitext2").mkdir()
    for s in ("validation", "test"):
        (tmp_path / "wikitext2" / f"{s}.txt").write_text("a local line\nanother one\n")
    local = cfg_factory("data=wikitext2", f"paths.data_dir={tmp_path}")
    validate(local)
    assert not uses_hub(local.data) and list(document_datasets(local.data)["train"]["text"]) == ["a local line",
                                                                                                  "another one"]
    hub = cfg_factory("data=wikitext2", "paths.data_dir=null")
    validate(hub)  # no data dir: the hub's wikitext-2-raw-v1 (not loaded here: the hub is unreachable)
    assert uses_hub(hub.data) and hub.data.hub_name == "wikitext-2-raw-v1"
    w103 = cfg_factory("data=wikitext103")
    validate(w103)
    assert uses_hub(w103.data) and (w103.data.hub, w103.data.hub_name) == ("Salesforce/wikitext",
                                                                          "wikitext-103-raw-v1")
    with pytest.raises(ConfigError, match="set paths.data_dir or MLMLAB_DATA_DIR.*does not exist"):
        validate(cfg_factory("data=wikitext2", "paths.data_dir=null", "data.source=local"))


def test_map_with_num_proc_packs_the_same_blocks_as_in_memory(cfg_factory, tmp_path):
    f = tmp_path / "corpus.txt"
    docs = builtin.generate_corpus(900, seed=5)
    f.write_text("\n".join(docs[:600]) + "\n\n" + "\n".join(docs[600:]) + "\n")  # a blank line is not a document
    out = {}
    for n in (1, 2):
        cfg = cfg_factory("data=text_files", f"data.path={f}", "data.max_seq_len=48", f"data.num_proc={n}",
                          "tokenizer.vocab_size=300", f"paths.cache_dir={tmp_path / f'cache{n}'}")
        validate(cfg)
        tok, out[n] = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    ref = pack(*tokenize(tok, docs[: len(docs) - 18]), 48)  # val_fraction 0.02 of 900 documents: the last 18
    for k, v in ref.items():
        assert torch.equal(out[1]["train"][k], v) and torch.equal(out[2]["train"][k], v), k
    # cached by config hash: tokens once per corpus + tokenizer, blocks per max_seq_len
    cache = tmp_path / "cache1"
    assert len(list((cache / "tokens").iterdir())) == 2 and len(list((cache / "blocks").iterdir())) == 2
    cfg64 = cfg_factory("data=text_files", f"data.path={f}", "data.max_seq_len=64", "tokenizer.vocab_size=300",
                        f"paths.cache_dir={cache}")
    get_blocks(cfg64.data, cfg64.tokenizer, cfg64.paths.cache_dir)
    assert len(list((cache / "tokens").iterdir())) == 2 and len(list((cache / "blocks").iterdir())) == 4
    assert not list(cache.glob("tokens/*/.map*"))  # map's scratch files are removed


def test_blocks_are_memory_mapped(cfg_factory, tmp_path):
    cfg = cfg_factory("data.n_docs=200", "data.n_val_docs=20", f"paths.cache_dir={tmp_path}")
    _, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    x = blocks["train"]["input_ids"]
    ptr, maps = x.data_ptr(), []
    for line in open("/proc/self/maps"):
        parts = line.split()
        if len(parts) >= 6 and parts[5].endswith("input_ids.npy"):
            lo, hi = (int(v, 16) for v in parts[0].split("-"))
            maps.append((lo, hi))
    assert any(lo <= ptr < hi for lo, hi in maps), "train input_ids are not a view of input_ids.npy"
    assert x.numpy().flags.writeable  # copy-on-write: torch gets a writable tensor, the file is never changed


def test_packing_across_record_batches(tmp_path):
    """Documents longer and shorter than a block, blocks spanning Arrow batch borders: same as the in-memory pack."""
    import datasets

    from mlmlab.data.corpus import _Packer, load_blocks, pack_dataset

    rng = np.random.default_rng(0)
    ids = [rng.integers(5, 50, size=int(n)).tolist() for n in rng.integers(0, 90, size=25_000)]
    words = [[i // 2 for i in range(len(d))] for d in ids]
    ds = datasets.Dataset.from_dict({"ids": ids, "words": words, "length": [len(d) for d in ids]})
    pack_dataset(ds, 40, tmp_path / "b")
    got, ref = load_blocks(tmp_path / "b"), pack(ids, words, 40)
    assert len(got["input_ids"]) == _Packer.n_blocks(np.asarray([len(d) for d in ids]), 38)
    for k in ref:
        assert torch.equal(got[k], ref[k]), k


def test_tokenizer_training_is_deterministic():
    docs = builtin.generate_corpus(3000, seed=0)
    a, b = train_wordpiece(docs, 600), train_wordpiece(lambda: iter(docs), 600)
    assert a.get_vocab() == b.get_vocab() and a.to_str() == b.to_str()
    spec = json.loads(a.to_str())
    assert [t["content"] for t in spec["added_tokens"]] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert any(t.startswith("##") for t in a.get_vocab())
    enc = a.encode(" ".join(docs[:20]), add_special_tokens=False)
    assert any(t.startswith("##") for t in enc.tokens)  # the ## pieces are not special: decoding keeps them
    assert a.decode(enc.ids, skip_special_tokens=True) == a.decode(enc.ids, skip_special_tokens=False)


def test_block_stats_count_exactly_in_chunks(cfg_factory, tmp_path):
    from mlmlab.data.corpus import block_stats, iter_rows
    from mlmlab.data.tokenizer import PAD

    _, blocks = blocks_of(cfg_factory("data.n_docs=300", "data.n_val_docs=20", f"paths.cache_dir={tmp_path}"))
    b = blocks["train"]
    s = block_stats(b)
    assert s["tokens"] == int((b["input_ids"] != PAD).sum())
    assert s["cand_frac"] == pytest.approx(float((~b["special_tokens_mask"]).double().mean()), rel=1e-12)
    assert s["token_frac"] == pytest.approx(float((b["input_ids"][:, 1:] != PAD).double().mean()), rel=1e-12)
    assert sum(len(c) for c in iter_rows(b["input_ids"], chunk=7)) == len(b["input_ids"])


def test_a_failed_build_leaves_no_scratch_and_the_next_build_works(tmp_path):
    from mlmlab.data.cache import cached_file

    def bad(tmp):
        tmp.mkdir()
        (tmp / "half.npy").write_bytes(b"x" * 100)
        raise RuntimeError("killed mid-build")

    with pytest.raises(RuntimeError):
        cached_file(tmp_path, "blocks", {"a": 1}, "blocks", bad)
    assert not any((tmp_path / "blocks").iterdir())  # no half-written folder, no empty entry holding only its lock
    out = cached_file(tmp_path, "blocks", {"a": 1}, "blocks", lambda tmp: tmp.mkdir())
    assert out.is_dir() and (out.parent / "key.json").exists()


def test_hub_source_needs_a_name_and_no_mixture(cfg_factory, tmp_path):
    with pytest.raises(ConfigError, match="data.source=hub needs data.hub"):
        validate(cfg_factory("data=hub"))
    a = tmp_path / "a.txt"
    a.write_text("one doc\nanother doc\n")
    with pytest.raises(ConfigError, match="data.source=hub cannot be combined with data.mix"):
        validate(cfg_factory("data=hub", "data.hub=x", f"+data.mix=[{{path: '{a}'}}]"))


def test_train_wordpiece_rejects_a_one_shot_iterator():
    with pytest.raises(TypeError, match="reads texts twice"):
        train_wordpiece(iter(["a b c"] * 10), 100)
