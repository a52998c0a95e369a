"""The schemas of ``data.*``, ``tokenizer.*`` and ``paths.*``: their owner is the data code (corpus, tokenizer, caches)
that reads them; mlmlab.config registers them with the rest of a job's groups."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class DataConfig:
    name: str = "builtin"
    # text_files: a .txt file or a directory of .txt files; one document per line or blank-line separated
    path: str | None = None
    val_path: str | None = None  # text_files: held-out documents; default: the last val_fraction of documents
    # a mixture instead of one path: [{path, val_path (optional), weight}], interleaved with probabilities
    # proportional to the weights (datasets.interleave_datasets, all sources used up: small ones are repeated)
    mix: list[dict[str, Any]] = field(default_factory=list)
    mix_seed: int = 0
    val_fraction: float = 0.02
    doc_sep: str = "line"
    max_seq_len: int = 64
    # builtin: the generated language (see mlmlab/data/builtin.py)
    n_docs: int = 30000
    n_val_docs: int = 1000
    n_topics: int = 8
    corpus_seed: int = 0
    # the hub (datasets.load_dataset(hub, hub_name, split=...)): source=auto uses it when data.path is unset or not on
    # this machine, source=local never, source=hub always
    source: str = "auto"
    hub: str | None = None
    hub_name: str | None = None
    hub_split: str = "train"
    hub_val_split: str | None = None  # null: the last val_fraction of hub_split
    text_column: str = "text"
    strip_html: bool = False  # remove HTML tags (<br />) and decode entities in every document (scraped reviews)
    # tokenization: datasets.map(batched=True, num_proc=num_proc), cached by config hash under paths.cache_dir
    num_proc: int = 1
    # loading
    batch_size: int = 32
    val_batch_size: int = 128
    max_val_blocks: int = 1024
    num_workers: int = 0


@dataclass
class TokenizerConfig:
    name: str = "wordpiece"
    vocab_size: int = 2048
    lowercase: bool = True
    min_frequency: int = 2
    word_segmenter: str = "none"  # none | jieba (Chinese word boundaries for whole-word masking)


@dataclass
class PathsConfig:
    output_dir: str = MISSING
    cache_dir: str = "~/.cache/mlmlab"
    data_dir: str | None = None  # ../shared/data-style folder (env MLMLAB_DATA_DIR)
