"""``mask.*``, the masking group's one owner: its schema (the only defaults, a help string per field) and its rules,
beside the masker built from it (:meth:`mlmlab.masking.Masker.from_config`). Plain dataclasses, no Hydra: the config
layer registers ``MaskConfig`` as the ``mask`` node of the job's schema (mlmlab.config) and builds it with
``OmegaConf.to_object``, which runs the rules (``__post_init__`` -> :meth:`MaskConfig.validate`); a broken rule is a
ValueError naming the key (``mask.rate=1.5 must be ...``), which the job turns into its one-line error.

``mask.schedule`` and ``mask.sampler`` are ``_target_`` nodes (conf/mask/schedule/, conf/mask/sampler/): the
schedule's and sampler's own constructors are their schema (mlmlab.config checks their keys against them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

UNITS = ("token", "word", "span", "pmi")
SELECT_WEIGHTS = ("uniform", "idf", "domain", "loss")
COUNT_RULES = ("bernoulli", "exact", "prob_round")


def _f(default=None, help: str = "", factory=None):  # noqa: A002
    """A field with its help string (``dataclasses.fields(MaskConfig)[i].metadata["help"]``)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class ReplaceConfig:
    """What a selected unit becomes: [MASK], a random token (from ``mask.sampler``) or itself. Also ``eval.replace``."""
    mask: float = _f(0.8, "share of selected units replaced by [MASK]")
    random: float = _f(0.1, "share replaced by a token drawn from mask.sampler")
    keep: float = _f(0.1, "share left as they are (still predicted)")

    def check(self, key: str) -> None:
        """The rule, with the node's key (``mask.replace``, ``eval.replace``) in the message."""
        vals = {"mask": self.mask, "random": self.random, "keep": self.keep}
        for k, v in vals.items():
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{key}.{k}={v} must be >= 0 (ratios of [MASK]/random/keep)")
        total = sum(vals.values())
        if abs(total - 1.0) >= 1e-6:
            raise ValueError(f"{key}.mask + {key}.random + {key}.keep must sum to 1, got {total:g} "
                             f"({self.mask:g} + {self.random:g} + {self.keep:g})")


@dataclass
class SpanConfig:
    p: float = _f(0.2, "geometric parameter of span lengths (in words), truncated to [min_len, max_len]")
    min_len: int = _f(1, "shortest span, in words")
    max_len: int = _f(10, "longest span, in words")

    def check(self, key: str) -> None:
        if not 0.0 < self.p < 1.0:
            raise ValueError(f"{key}.p={self.p} must be in (0, 1)")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"{key}.min_len={self.min_len} and {key}.max_len={self.max_len} need "
                             "1 <= min_len <= max_len")


@dataclass
class SelectConfig:
    """Which units are selected: uniformly (BERT), or each with a probability proportional to a weight of its tokens'
    types, rescaled so that the expected rate is still ``mask.rate`` (capped at 1 per unit; mlmlab.masking.selection)."""
    weight: str = _f("uniform", "uniform | idf (inverse block frequency in the training corpus) | domain (how much more "
                                "frequent in the domain corpus than in the reference) | loss (a running per-type "
                                "estimate of the model's own MLM loss: adaptive masking)")
    corpus: str | None = _f(None, "weight=domain: the domain corpus (a text file or folder; null: the training corpus)")
    reference: str | None = _f(None, "weight=domain: the reference (general) corpus (null: the training corpus)")
    smoothing: float = _f(1.0, "weight=domain: add-k smoothing of both corpora's counts")
    power: float = _f(1.0, "weights are raised to this power (0: uniform; > 1 sharper)")
    decay: float = _f(0.99, "weight=loss: per-update decay of a type's running loss (its new batch mean weighs 1 - decay)")

    def check(self, key: str, unit: str) -> None:
        if self.weight not in SELECT_WEIGHTS:
            raise ValueError(f"{key}.weight={self.weight!r} is not known; allowed: {', '.join(SELECT_WEIGHTS)}")
        if self.weight == "domain" and self.corpus is None and self.reference is None:
            raise ValueError(f"{key}.weight=domain compares a domain corpus with a reference corpus: set {key}.corpus "
                             f"(the domain; training corpus = reference) or {key}.reference (the general corpus; "
                             "training corpus = domain), or both")
        if self.weight != "uniform" and unit == "span":
            raise ValueError(f"{key}.weight={self.weight} with mask.unit=span is not supported; allowed units: token, "
                             "word, pmi")
        if not (self.smoothing > 0 and math.isfinite(self.smoothing)):
            raise ValueError(f"{key}.smoothing={self.smoothing} must be > 0")
        if not (self.power >= 0 and math.isfinite(self.power)):
            raise ValueError(f"{key}.power={self.power} must be >= 0")
        if not 0 < self.decay < 1:
            raise ValueError(f"{key}.decay={self.decay} must be in (0, 1)")


@dataclass
class PMIConfig:
    """``mask.unit=pmi`` (Levine et al. 2021): word n-grams whose PMI in the training corpus is high are one unit."""
    max_n: int = _f(5, "longest n-gram, in words (2..max_n)")
    min_count: int = _f(5, "n-grams seen fewer times are never units")
    top_k: int = _f(20000, "the n-grams with the highest PMI (at least min_count occurrences) that become units")

    def check(self, key: str) -> None:
        if not 2 <= self.max_n <= 5:
            raise ValueError(f"{key}.max_n={self.max_n} must be in 2..5")
        if self.min_count < 1:
            raise ValueError(f"{key}.min_count={self.min_count} must be >= 1")
        if self.top_k < 1:
            raise ValueError(f"{key}.top_k={self.top_k} must be >= 1")


def check_rate(key: str, rate: float) -> None:
    if not 0.0 < rate < 1.0:
        raise ValueError(f"{key}={rate} must be in the open interval (0, 1)")


@dataclass
class MaskConfig:
    """``mask.*``: how a pretraining batch is corrupted (the axes of the ablations)."""
    name: str = _f("bert", "the preset's name (conf/mask/<name>.yaml)")
    rate: float = _f(0.15, "selection (corruption) probability under the default constant schedule")
    predict_rate: float | None = _f(None, "Wettig et al.'s prediction rate, apart from corruption; null = mask.rate")
    count: str = _f("bernoulli", "units per sequence: bernoulli (independent) | exact | prob_round")
    min_per_seq: int | None = _f(None, "fewest units selected per sequence; null: 0 for bernoulli, 1 otherwise")
    unit: str = _f("token", "what is selected: token | word (whole words) | span (SpanBERT) | pmi (high-PMI word "
                            "n-grams as one unit, other words alone: Levine et al. 2021)")
    span: SpanConfig = _f(help="span lengths (mask.unit=span)", factory=SpanConfig)
    pmi: PMIConfig = _f(help="the n-gram table of mask.unit=pmi", factory=PMIConfig)
    select: SelectConfig = _f(help="selection weights: uniform, idf, domain, loss", factory=SelectConfig)
    dynamic: bool = _f(True, "new masks every time a block is seen; false: static masks keyed by (seed, block, "
                             "epoch mod static_copies)")
    static_copies: int = _f(1, "static masking: distinct masks per block (RoBERTa's 10)")
    replace: ReplaceConfig = _f(help="80/10/10 and its variants", factory=ReplaceConfig)
    # pluggable parts, instantiated from conf/mask/schedule/*.yaml and conf/mask/sampler/*.yaml (empty here: a
    # _target_ node merged with a default would keep the default's keys)
    schedule: dict[str, Any] = _f(help="the rate over training: a _target_ node (constant, linear, cosine, ...)",
                                  factory=dict)
    sampler: dict[str, Any] = _f(help="where random replacements come from: a _target_ node (uniform, unigram, "
                                      "domain)", factory=dict)

    def __post_init__(self):
        if isinstance(self.replace, dict):
            self.replace = ReplaceConfig(**self.replace)
        if isinstance(self.span, dict):
            self.span = SpanConfig(**self.span)
        if isinstance(self.pmi, dict):
            self.pmi = PMIConfig(**self.pmi)
        if isinstance(self.select, dict):
            self.select = SelectConfig(**self.select)
        self.validate()

    def validate(self, key: str = "mask") -> None:
        """Every rule of the group, each written here once (ValueError naming the key)."""
        check_rate(f"{key}.rate", self.rate)
        self.replace.check(f"{key}.replace")
        if self.predict_rate is not None:
            check_rate(f"{key}.predict_rate", self.predict_rate)
        for k, value, allowed in (("count", self.count, COUNT_RULES), ("unit", self.unit, UNITS)):
            if value not in allowed:
                raise ValueError(f"{key}.{k}={value!r} is not known; allowed: {', '.join(allowed)}")
        if self.min_per_seq is not None and self.min_per_seq < 0:
            raise ValueError(f"{key}.min_per_seq={self.min_per_seq} must be >= 0 or null")
        self.span.check(f"{key}.span")
        self.pmi.check(f"{key}.pmi")
        self.select.check(f"{key}.select", self.unit)
        if self.static_copies < 1:
            raise ValueError(f"{key}.static_copies={self.static_copies} must be >= 1")

    @property
    def min_units(self) -> int:
        """``min_per_seq`` with its null default resolved."""
        return (0 if self.count == "bernoulli" else 1) if self.min_per_seq is None else int(self.min_per_seq)
