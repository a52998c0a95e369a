"""The job's schema: registration, the groups that have no component of their own, and the rules that span groups.

Each group with a component is owned beside it, with its only defaults and its own rules: ``mask.*`` by
``mlmlab.masking.config.MaskConfig`` (its rules run as it is built), ``model.*`` by
``mlmlab.models.encoder.EncoderConfig`` (``ModelConfig`` below is generated from it), ``analysis.*`` by
``mlmlab.stats.Question``; a ``_target_`` node (``mask.sampler``, ``mask.schedule``) by its target's constructor.
The whole schema is registered with Hydra's ConfigStore as ``train_schema``; ``conf/train.yaml`` lists it first in its
defaults, so every composed config is typed and in struct mode: a misspelled key or a wrong type fails at compose time.
:func:`validate` then runs every group's rules and the cross-group ones (ranges, sums, names, files) before any data
or training work, each failure a one-line ConfigError naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from mlmlab.data.cache import plain  # noqa: F401  (re-exported: a group as a plain dict; the cache keys use it)
from mlmlab.data.schema import (  # data.*, tokenizer.*, paths.*: beside the data code
    DataConfig,
    PathsConfig,
    TokenizerConfig,
)
from mlmlab.errors import ConfigError  # noqa: F401  (re-exported: mlmlab.config.ConfigError)
from mlmlab.init import InitConfig  # init.*: its owner, beside the loader
from mlmlab.masking.config import MaskConfig, ReplaceConfig, check_rate  # mask.*: its owner, beside the masker
from mlmlab.models.electra import SAMPLINGS
from mlmlab.stats import Question  # analysis.*: the question a sweep declares (its owner: mlmlab.stats)

DATA_NAMES = ("builtin", "text_files", "hub", "imdb", "wikitext2", "wikitext103", "zh", "finance", "medical",
              "finance_mix", "medical_mix")  # all but builtin: text files (one source or a data.mix) or a hub data set
DATA_SOURCES = ("auto", "local", "hub")
OBJECTIVES = ("mlm", "electra", "clm", "none")
ELECTRA_KEYS = ("generator_size", "generator_layers", "disc_weight", "temperature", "temperature_end", "sampling")
ELECTRA_OPTIONAL = ("generator_layers", "temperature_end")  # may stay null for objective=electra
LR_SCHEDULES = ("linear", "cosine", "constant", "wsd")
DOC_SEPS = ("line", "blank_line")
WANDB_MODES = ("offline", "online", "disabled")
POOLINGS = ("auto", "mean", "cls", "last")




def _model_schema():
    """``model.*``: the encoder's own fields (mlmlab.models.encoder.EncoderConfig, where their defaults live) without
    the two the job sets itself (``vocab_size`` from the tokenizer, ``causal`` from the objective), plus the preset's
    name. Built from EncoderConfig so that a new encoder option is one field in one place."""
    import typing
    from dataclasses import MISSING as NO_DEFAULT
    from dataclasses import fields, make_dataclass

    from mlmlab.models.encoder import EncoderConfig

    hints = typing.get_type_hints(EncoderConfig)
    own = [(f.name, hints[f.name], field(default=f.default)) for f in fields(EncoderConfig)
           if f.name not in ("vocab_size", "causal") and f.default is not NO_DEFAULT]
    cls = make_dataclass("ModelConfig", [("name", str, field(default="small")), *own])
    cls.__module__ = __name__
    return cls


ModelConfig = _model_schema()


EVAL_UNITS = ("token", "word")  # eval.units: the fixed evaluation masks' units


def eval_units(e) -> list[str]:
    """``eval.units`` (of the ``eval`` group ``e``) with its null default resolved (``[token]``): the one reading of
    the key."""
    return ["token"] if e.units is None else list(e.units)


@dataclass
class EvalConfig:
    """Fixed evaluation masks: the validation set is masked once with these settings, identical for every run."""

    rate: float = 0.15
    seed: int = 1234
    replace: ReplaceConfig = field(default_factory=ReplaceConfig)
    # the units the fixed masks select (Bernoulli per unit at eval.rate): the first feeds validation during training
    # (val/mlm_loss_r15); each further one is scored once at the end (objective=mlm), ``word`` as val/mlm_loss_r15w
    # (whole words from the blocks' word_ids): token-level masks favour token-level training, so mask units are ranked
    # fairly only at each unit's own masks. null = [token] (so records made before this key existed stay the same config)
    units: list[str] | None = None
    # data.mix only: also score the fixed masks (first unit) on each source's validation documents packed on their own,
    # once at the end (objective=mlm), as val/mlm_loss_r15_mix<i>: the mixture's validation blocks hold at most
    # data.max_val_blocks, taken in source order, so the main loss may see one source only (finance_mix: IMDB)
    per_source: bool = False
    # curves over pretraining (mlmlab/lit/curves.py): every N steps, BLiMP (the downstream.tasks of kind minimal_pairs,
    # zeroshot_n_per_paradigm pairs each) and the linear probe of the other downstream tasks; null: off
    zeroshot_every_n_steps: int | None = None
    zeroshot_n_per_paradigm: int = 20
    # the phase rule (mlmlab.phase): an encoder is "lexical" unless its val/mlm_loss_r15 is below the unigram
    # reference (val/unigram_loss_r15) by this many nats, "past the drop" when below the bigram reference
    # (val/bigram_loss_r15) by it, "bigram" in between; how a record is read, not how the job runs
    phase_margin: float = 0.1

    def __post_init__(self):
        check_phase_margin(self.phase_margin)


def check_phase_margin(value) -> None:
    """``eval.phase_margin``: a finite number of nats >= 0 (a ValueError naming the key otherwise)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise ValueError(f"eval.phase_margin={value!r} must be a finite number of nats >= 0 (default 0.1): how far "
                         "below the unigram / bigram reference loss val/mlm_loss_r15 must be to leave a phase")


@dataclass
class ObjectiveConfig:
    name: str = "mlm"  # mlm | electra | clm | none
    # objective=electra only (conf/objective/electra.yaml sets them; null for the other objectives)
    generator_size: float | None = None  # generator hidden/FFN width as a fraction of the discriminator's, (0, 1]
    generator_layers: int | None = None  # null: the discriminator's depth
    disc_weight: float | None = None  # loss = gen_mlm + disc_weight x disc BCE
    temperature: float | None = None  # generator softmax temperature when sampling replacements (the start, with _end)
    temperature_end: float | None = None  # null: constant; else geometric from temperature to this over the run
    sampling: str | None = None  # gumbel | multinomial


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    warmup_steps: int = 40
    # warmup as a fraction of the run's steps (budget runs, whose step count is only known at the start); when set it
    # replaces warmup_steps. With schedule=linear and min_lr_ratio=0 the lr decays to 0 at the budget's last step
    warmup_frac: float | None = None
    schedule: str = "linear"  # decay after warmup: linear | cosine | constant | wsd (warmup-stable-decay)
    min_lr_ratio: float = 0.0
    decay_frac: float = 0.2  # schedule=wsd: the share of the run's last steps that decays linearly to min_lr_ratio
    impl: str = "auto"  # torch.optim.AdamW's implementation: auto (= foreach on every device) | for_loop | foreach | fused


@dataclass
class BudgetConfig:
    """Equal-budget runs: set at most one; it replaces trainer.max_steps (see mlmlab/flops.py)."""

    tokens: float | None = None  # training tokens (batch x seq x accumulation per step)
    flops: float | None = None  # training FLOPs (fwd + bwd matmuls from the model shapes, sparse MLM head)
    # wall-clock seconds of training (trainer.fit): a timing probe before training turns them into a step count,
    # recorded in results.json (budget.steps, budget.calibration); rerun it exactly with trainer.max_steps=<steps>
    seconds: float | None = None


@dataclass
class TrainerConfig:
    accelerator: str = "auto"
    devices: Any = "auto"
    strategy: str = "auto"
    num_nodes: int = 1
    precision: str = "32-true"
    compile: bool = False  # torch.compile the encoder (the MLM head runs on a varying number of masked positions)
    max_steps: int = 400
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    val_check_interval: int = 100  # steps
    log_every_n_steps: int = 10
    gradient_clip_val: float | None = 1.0
    accumulate_grad_batches: int = 1
    deterministic: bool = False
    enable_progress_bar: bool = True
    # reliability (mlmlab/guard.py): <output_dir>/checkpoints/last.ckpt every n optimizer steps (atomic; null: off;
    # a SIGTERM always checkpoints), and what a NaN/inf loss or gradient does: error | skip | off
    checkpoint_every_n_steps: int | None = None
    nonfinite: str = "error"
    # torch threads of the job: an int, or auto -- every core for a job alone, cores // n_jobs for each of the n_jobs
    # jobs the joblib launcher runs at once (hydra/launcher=cores), so parallel jobs never share a core
    threads: Any = "auto"


@dataclass
class WandbConfig:
    project: str = "mlmlab"
    entity: str | None = None
    mode: str = "offline"
    group: str | None = None  # default: the sweep dir name in a multirun, "single" otherwise
    name: str | None = None  # default: the job's overrides
    tags: list[str] = field(default_factory=list)
    # seconds between W&B's writes of the run's .wandb log to disk (its own default is 15): what a SIGKILL can lose;
    # a checkpoint waits this long so the log on disk holds everything logged before the checkpoint
    flush_seconds: float = 2.0


@dataclass
class LoggerConfig:
    wandb: WandbConfig | None = None


@dataclass
class FinetuneConfig:
    lr: Any = 3e-4  # a float, or a list: a grid, the lr chosen on validation (mean over seeds of the primary metric)
    epochs: int = 4
    batch_size: int = 32
    max_seq_len: int = 64
    weight_decay: float = 0.01
    warmup_frac: float = 0.1
    # ELECTRA's layer-wise lr decay (Clark et al. 2020 used 0.8): the classifier gets lr, encoder layer i of L gets
    # lr x layer_decay^(L - i), the embeddings lr x layer_decay^(L + 1); null: one lr for every parameter
    layer_decay: float | None = None
    dropout: float = 0.1
    pooling: str = "auto"  # auto (mean; last token for objective=clm) | mean | cls | last
    stride: int = 32  # overlap (tokens) of consecutive windows over texts longer than max_seq_len
    early_stopping_patience: int | None = None  # epochs without a better validation score; null: all epochs
    # batches of similar length (shuffled pools sorted by length): far less padding on tasks whose lengths vary
    # (SST-2's phrases: 1-60 tokens); false: plain shuffled batches
    length_buckets: bool = False


@dataclass
class ZeroShotConfig:
    """Minimal-pairs tasks (``downstream.tasks=[blimp]``; mlmlab/zeroshot.py): scored without training."""

    # pairs per paradigm, a fixed random subsample (the same pairs in every run); null: all (BLiMP: 1,000)
    n_per_paradigm: int | None = 100
    pll: str = "within_word_l2r"  # masked LMs: within_word_l2r (Kauf & Ivanova 2023) | original (Salazar et al. 2020)
    batch_size: int = 1024  # masked copies per forward pass
    unigram_floor: bool = True  # also score the pairs with the training corpus's unigram distribution (pretraining jobs)


@dataclass
class DownstreamConfig:
    tasks: list[str] = field(default_factory=lambda: ["builtin_sentiment", "builtin_topic"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    task_dirs: list[str] = field(default_factory=list)  # folders of <task>.yaml files (your own tasks; see mlmlab/tasks/)
    # one W&B run per fine-tuning (task x lr x seed): job_type=finetune, the pretraining run's group, its loss and
    # per-epoch validation curve, its scores in the summary (the job's own run always has the aggregates)
    wandb_runs: bool = False
    # the first N training examples of each task; null: all; a list [250, 1000, 4000]: a label-budget curve, one
    # score per budget (downstream/<task>@<N>/<metric>; downstream/score takes the largest)
    max_train_examples: Any = None
    val_fraction: float = 0.1  # held out of train for tasks without a validation split, when one is needed
    # the selection split (lr grid, early stopping; scored after every epoch of every fine-tuning) is cut to its first
    # N examples; null: all of it (SST-2's held-out 10% of train is 6,735 phrases)
    max_selection_examples: int | None = 2000
    # also fine-tune the untrained encoder (the init of `seed`) with the same protocol: random_init/<task>/<metric> and
    # the paired per-seed gain gain/<task>/<metric> (+ _ci95, _p) in the same job
    random_init_baseline: bool = False
    # the random-init row is cached by a hash of what it depends on (tokenizer, encoder shape, seed, data, protocol,
    # precision) and reused by the jobs that share it (results.json: downstream_random_init.reused_from)
    reuse_random_init: bool = True
    # finetune: fine-tune the encoder (seeds x lrs); probe: a linear probe on the frozen encoder's pooled features
    # (scikit-learn logistic regression, deterministic; probe/<task>/<metric>); both
    protocol: str = "finetune"
    zeroshot: ZeroShotConfig = field(default_factory=ZeroShotConfig)
    # built-in tasks: sizes of the generated splits
    builtin_n_train: int = 512
    builtin_n_test: int = 1000
    # the split a job scores: reported (the task's evaluation split: test where it has labels, else validation) |
    # selection (screens: the task's selection split, val_fraction of train held out by a fixed seeded split
    # (mlmlab.data.tasks.hold_out), never trained on; label budgets come from the rest of train; an lr grid or early
    # stopping selects on the same held-out part). results.json downstream.<task>.reported_split names it.
    score_split: str = "reported"
    # with a declared question (analysis.primary): fine-tune only the label budgets of max_train_examples that a
    # declared metric (analysis.primary, analysis.family) reads, and the random-init comparator only at the primary
    # metric's task and budget (what the regime gate reads); results.json downstream.skipped says what was left out and
    # why. false: every budget, and the comparator at every task and budget (as before this key)
    only_declared: bool = True

    def __post_init__(self):
        check_score_split(self.score_split)
        check_only_declared(self.only_declared)

    def declared(self, primary: str | None, family=()) -> Declared:
        """What a job with the question ``primary`` + ``family`` fine-tunes (``only_declared``): this group with the
        label budgets no declared metric reads removed (``encoder``), and the random-init comparator's (``comparator``:
        the primary metric's task and budget, and those of declared metrics that read the comparator themselves --
        ``gain/...``, ``random_init/...``); ``skipped``, the record of what was left out (None: nothing). A question that
        names no label budget (``downstream/score``, ``val/...``) leaves the budgets; a primary that names no task of
        ``tasks`` leaves the comparator. The task registry is not needed: metric keys name the task and budget."""
        import dataclasses

        metrics = [m for m in [primary, *(family or [])] if m]
        if not self.only_declared or primary is None:
            return Declared(self, self, None)
        value, tasks = self.max_train_examples, list(self.tasks)
        curve = isinstance(value, (list, tuple, ListConfig))
        budgets = [int(x) for x in value] if curve else []
        read = [r for r in map(_reads, metrics) if r is not None and r[1] in tasks]
        named = {n for _, _, n in read if n in budgets}
        if named and "downstream/score" in metrics:
            named.add(max(budgets))  # the score takes each task's largest budget
        skipped: dict = {}
        encoder = self
        if curve and named and len(named) < len(budgets):
            keep = [n for n in budgets if n in named]
            encoder = dataclasses.replace(self, max_train_examples=keep)
            skipped["budgets"] = [n for n in budgets if n not in named]
            skipped["why"] = ("no declared metric (analysis.primary, analysis.family) reads them; "
                              "downstream.only_declared=false fine-tunes them")
        comparator = encoder
        first = _reads(primary)
        if self.random_init_baseline and first is not None and first[1] in tasks:
            gated = [first, *(r for r in read if r[0] in COMPARATOR_HEADS)]
            c_tasks = [t for t in tasks if any(r[1] == t for r in gated)]
            # (a gated metric without a budget: a zero-shot task, which runs once whatever the budgets)
            kept = list(encoder.max_train_examples) if curve else value
            c_budgets = ([n for n in budgets if any(r[2] == n for r in gated)] or kept) if curve else value
            if c_tasks != tasks or c_budgets != kept:
                comparator = dataclasses.replace(self, tasks=c_tasks, max_train_examples=c_budgets)
                skipped["random_init"] = {"tasks": c_tasks, "max_train_examples": c_budgets,
                                          "why": "the regime gate reads the comparator at the primary metric's task "
                                                 "and label budget only"}
        return Declared(encoder, comparator, skipped or None)


# metric prefixes that read the random-init comparator themselves (mlmlab.baseline writes them)
COMPARATOR_HEADS = ("random_init", "gain", "random_init_probe", "gain_probe")


def _reads(metric: str | None) -> tuple[str, str, int | None] | None:
    """``<head>/<task>[@<N>]/<name>`` -> (head, task, N or None); None for a key that names no task
    (``downstream/score``, ``val/mlm_loss_r15``: no ``<task>/<name>`` after the head)."""
    if not metric:
        return None
    head, _, rest = str(metric).partition("/")
    key, _, name = rest.rpartition("/")
    if not key or not name or "/" in key:
        return None
    task, at, n = key.partition("@")
    return head, task, int(n) if at and n.isdigit() else None


@dataclass(frozen=True)
class Declared:
    """:meth:`DownstreamConfig.declared`: the pretrained encoder's and the comparator's ``downstream.*`` and the record
    of what they leave out (results.json ``downstream.skipped``; None: nothing)."""
    encoder: DownstreamConfig
    comparator: DownstreamConfig
    skipped: dict | None


def check_only_declared(value) -> None:
    """``downstream.only_declared``: a boolean (a ValueError naming the key otherwise)."""
    if not isinstance(value, bool):
        raise ValueError(f"downstream.only_declared={value!r}; allowed: true (fine-tune only what the declared "
                         "question reads) or false (every label budget, and the comparator at each)")


SCORE_SPLITS = ("reported", "selection")


def check_score_split(value) -> None:
    """``downstream.score_split``: one of :data:`SCORE_SPLITS` (a ValueError naming the key otherwise)."""
    if value not in SCORE_SPLITS:
        raise ValueError(f"downstream.score_split={value!r} is not known; allowed: {', '.join(SCORE_SPLITS)} "
                         "(reported: the task's evaluation split; selection: a part held out of train, for screens)")


@dataclass
class CallbacksConfig:
    checkpoint: bool = True  # save <output_dir>/checkpoints/last.ckpt after pretraining


@dataclass
class TrainConfig:
    seed: int = 0
    skip_completed: bool = False  # re-running a sweep: jobs with a complete results.json of the same config are skipped
    resume: str | None = None  # a run dir (its checkpoints/last.ckpt) or a .ckpt path: continue that pretraining exactly
    overwrite: bool = False  # true: start again (step 0) in an output dir that holds a checkpoint, replacing it
    init: InitConfig = field(default_factory=InitConfig)  # start from an encoder (continued pretraining): mlmlab.init
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    downstream: DownstreamConfig = field(default_factory=DownstreamConfig)
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    analysis: Question = field(default_factory=Question)  # what a sweep asks: primary metric, family, margin, rule


@dataclass
class FinetuneJobConfig:
    """``python -m mlmlab.finetune``: fine-tune an existing pretraining checkpoint (an explicit path)."""

    checkpoint: str = MISSING  # <run dir>/checkpoints/last.ckpt of a pretraining job
    task: str | None = None  # shorthand for downstream.tasks=[<task>] (replaces the list)
    data: DataConfig = field(default_factory=DataConfig)  # replaced by the checkpoint's (built-in tasks read it)
    downstream: DownstreamConfig = field(default_factory=DownstreamConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)


def unknown_keys(node, schema: type, prefix: str = "") -> list[str]:
    """Keys of a composed config that its schema does not declare, under every typed (dataclass) node. Hydra rejects
    ``mask.rat=0.2`` but adds ``+mask.rat=0.2``; this catches the second. Free-form nodes (``dict[str, Any]``:
    ``mask.sampler``, ``mask.schedule``; ``Any``) are not looked into."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(schema)
    out = []
    for k in node.keys():
        if k not in hints:
            out.append(f"{prefix}{k}")
            continue
        t = hints[k]
        if dataclasses.is_dataclass(t) and isinstance(node.get(k), DictConfig):
            out += unknown_keys(node[k], t, f"{prefix}{k}.")
    return out


def check_known_keys(cfg: DictConfig, schema: type) -> None:
    """ConfigError naming each key the schema does not know (``+mask.rat=0.2``), with the allowed keys of its node."""
    import typing

    bad = unknown_keys(cfg, schema)
    if not bad:
        return
    key = bad[0]
    parent, _, _ = key.rpartition(".")
    node_type = schema
    for part in parent.split(".") if parent else []:
        node_type = typing.get_type_hints(node_type)[part]
    allowed = ", ".join(sorted(typing.get_type_hints(node_type)))
    raise ConfigError(f"unknown config key{'s' if len(bad) > 1 else ''} {', '.join(bad)} (a typo, or a '+' "
                      f"override adding a key the schema does not have); allowed{' under ' + parent if parent else ''}:"
                      f" {allowed}")


def register_configs() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    ConfigStore.instance().store(name="finetune_schema", node=FinetuneJobConfig)
    if not OmegaConf.has_resolver("data_file"):
        OmegaConf.register_new_resolver("data_file", _data_file)
    if not OmegaConf.has_resolver("job_subdir"):
        OmegaConf.register_new_resolver("job_subdir", job_subdir)
    if not OmegaConf.has_resolver("mlmlab_sweeps"):  # hydra.searchpath: `+sweep=<name>` finds sweeps/sweep/<name>.yaml
        OmegaConf.register_new_resolver("mlmlab_sweeps", lambda: str(Path(__file__).parent / "sweeps"))


def job_subdir(num, override_dirname: str, limit: int = 120) -> str:
    """A sweep job's folder name: ``<num>_<overrides>``, one path segment (``/`` in values becomes ``_``), and, past ``limit`` characters, cut with a hash of the whole so names stay unique and under the file system's
    255-byte limit."""
    import hashlib

    name = f"{num}_{override_dirname}".replace("/", "_")
    if len(name) <= limit:
        return name
    return f"{name[:limit - 10]}~{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def _data_file(rel: str, *, _root_) -> str:
    """``${data_file:imdb/corpus/train.txt}``: a file of the data dir (``paths.data_dir`` / env MLMLAB_DATA_DIR).
    Unset, the path says so, and the file check that follows names the key and what to set."""
    d = _root_.paths.get("data_dir")
    return str(Path(str(d)).expanduser() / rel) if d is not None else f"<set paths.data_dir or MLMLAB_DATA_DIR>/{rel}"


register_configs()


# ----------------------------------------------------------------------------------------------------- validation


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def _check_choice(key: str, value, allowed) -> None:
    _check(value in allowed, f"{key}={value!r} is not known; allowed: {', '.join(map(str, allowed))}")


def _owned(rule, *args) -> None:
    """A rule of a group's owner (a ValueError naming the key) as the job's ConfigError."""
    try:
        rule(*args)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def mask_config(node) -> MaskConfig:
    """``mask.*`` as its typed owner (the group's rules run as it is built); ConfigError naming the key."""
    try:
        obj = OmegaConf.to_object(node) if isinstance(node, DictConfig) else node
        return obj if isinstance(obj, MaskConfig) else MaskConfig(**obj)
    except ValueError as e:
        raise ConfigError(str(getattr(e, "__cause__", None) or e)) from None


def build_schedule(mask):
    """Instantiate ``mask.schedule`` (a ``_target_`` node) and check it keeps the rate in (0, 1) over the whole run."""
    from collections.abc import Mapping

    from hydra.utils import instantiate

    target = mask.schedule.get("_target_") if isinstance(mask.schedule, (DictConfig, Mapping)) else None
    _check(bool(target), "mask.schedule needs a _target_ (see conf/mask/schedule/: constant, linear, cosine, step, piecewise)")
    try:
        sched = instantiate(mask.schedule)
    except Exception as e:  # unknown class, unknown or missing kwargs, bad milestones ...
        cause = e.__cause__ or e
        raise ConfigError(f"mask.schedule ({target}) is invalid: {cause}") from e
    try:
        sched.check()
    except ValueError as e:
        raise ConfigError(str(e)) from e
    return sched


def validate_mask(m: DictConfig) -> None:
    mask_config(m)  # the group's own rules (mlmlab.masking.config.MaskConfig)
    build_schedule(m)
    sampler = m.sampler if isinstance(m.sampler, DictConfig) else None
    _check(sampler is not None and bool(sampler.get("_target_")),
           "mask.sampler needs a _target_ (see conf/mask/sampler/: uniform, unigram, domain)")
    check_target_keys("mask.sampler", sampler, given=("ctx",))
    if "alpha" in sampler:
        _check(sampler.alpha >= 0, f"mask.sampler.alpha={sampler.alpha} must be >= 0")
    if "mix" in sampler:
        _check(0.0 <= sampler.mix <= 1.0, f"mask.sampler.mix={sampler.mix} must be in [0, 1]")
    if str(sampler._target_).endswith("DomainSampler"):
        _check((sampler.get("word_list") is None) != (sampler.get("corpus") is None),
               "mask.sampler=domain needs exactly one of mask.sampler.word_list (a file of domain terms) or "
               "mask.sampler.corpus (a domain text corpus)")


def check_target_keys(key: str, node: DictConfig, given: tuple[str, ...] = ()) -> None:
    """A ``_target_`` node's keys are its target's parameters (the constructor is that node's schema): a typo
    (``+mask.sampler.alpah=0.5``) is a ConfigError naming the key and the allowed ones, before any data work.
    ``given``: parameters the job passes itself (the sampler's data context)."""
    import inspect

    from hydra.utils import get_object

    target = str(node.get("_target_"))
    try:
        params = inspect.signature(get_object(target)).parameters
    except Exception as e:  # not importable, or not a callable
        raise ConfigError(f"{key}._target_={target} cannot be used ({type(e).__name__}: {e})") from None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = [p for p in params if p not in ("self", *given)]
    for k in node:
        if not str(k).startswith("_") and k not in allowed:
            raise ConfigError(f"{key}.{k} is not a parameter of {target.rsplit('.', 1)[-1]}; allowed: "
                              f"{', '.join(allowed)}")


def validate_objective(o: DictConfig, model: DictConfig) -> None:
    _check_choice("objective.name", o.name, OBJECTIVES)
    if o.name != "electra":
        for k in ELECTRA_KEYS:
            _check(o[k] is None, f"objective.{k}={o[k]} applies to objective=electra only (objective={o.name})")
        return
    for k in ELECTRA_KEYS:
        _check(o[k] is not None or k in ELECTRA_OPTIONAL, f"objective.{k} must be set for objective=electra (see conf/objective/electra.yaml)")
    _check(0.0 < o.generator_size <= 1.0, f"objective.generator_size={o.generator_size} must be in (0, 1] "
           "(a fraction of the discriminator's hidden and FFN width)")
    _check(o.generator_layers is None or 1 <= o.generator_layers <= model.num_layers,
           f"objective.generator_layers={o.generator_layers} must be in [1, model.num_layers={model.num_layers}] or "
           "null (the discriminator's depth): the generator is never deeper than the discriminator, as it is never "
           "wider")
    _check(o.disc_weight >= 0 and math.isfinite(o.disc_weight), f"objective.disc_weight={o.disc_weight} must be >= 0")
    _check(o.temperature > 0 and math.isfinite(o.temperature), f"objective.temperature={o.temperature} must be > 0")
    _check(o.temperature_end is None or (o.temperature_end > 0 and math.isfinite(o.temperature_end)),
           f"objective.temperature_end={o.temperature_end} must be > 0 or null (a constant temperature)")
    _check_choice("objective.sampling", o.sampling, SAMPLINGS)
    from mlmlab.models.electra import generator_shape

    g = generator_shape(model.hidden_size, model.num_heads, model.intermediate_size, model.num_layers,
                        o.generator_size, o.generator_layers)
    _check(g["hidden_size"] % g["num_heads"] == 0,
           f"objective.generator_size={o.generator_size} gives a generator of hidden size {g['hidden_size']} "
           f"and {g['num_heads']} heads (model.hidden_size={model.hidden_size}, model.num_heads={model.num_heads}); "
           "the hidden size must be divisible by the heads")
    _check(g["hidden_size"] // g["num_heads"] >= 8,
           f"objective.generator_size={o.generator_size} gives a generator of hidden size {g['hidden_size']} "
           f"with {g['num_heads']} head(s): a head size of {g['hidden_size'] // g['num_heads']} < 8; "
           "allowed: a generator_size that keeps the head size >= 8")


def validate_downstream(cfg: DictConfig, objective: str, max_positions: int, task_key: str | None = None) -> None:
    """``downstream.*`` (shared by pretraining jobs and ``mlmlab.finetune``): tasks known and loadable, protocol values.
    ``task_key``: the key the user gave the one task under (``mlmlab.finetune task=``), named in its errors."""
    from mlmlab.data.tasks import TaskSource, task_registry

    ds = cfg.downstream
    tasks, src = task_registry(ds.task_dirs), TaskSource.of(cfg.paths, cfg.data, ds)
    for i, name in enumerate(ds.tasks):
        _check_choice(task_key or f"downstream.tasks[{i}]", name, sorted(tasks))
        tasks[name].check_available(src)
    _check(len(ds.tasks) == 0 or len(ds.seeds) >= 1, "downstream.seeds must list at least one seed when tasks are set")
    from mlmlab.zeroshot import PLL_VARIANTS

    z = ds.zeroshot
    _check(z.n_per_paradigm is None or z.n_per_paradigm >= 1,
           f"downstream.zeroshot.n_per_paradigm={z.n_per_paradigm} must be >= 1 or null (all pairs)")
    _check_choice("downstream.zeroshot.pll", z.pll, PLL_VARIANTS)
    _check(z.batch_size >= 1, f"downstream.zeroshot.batch_size={z.batch_size} must be >= 1")
    _check_choice("downstream.finetune.pooling", ds.finetune.pooling, POOLINGS)
    from mlmlab.downstream import PROTOCOLS

    _check_choice("downstream.protocol", ds.protocol, PROTOCOLS)
    _check(not (objective == "clm" and ds.finetune.pooling == "cls"),
           "downstream.finetune.pooling=cls with objective=clm: under causal attention the first token sees only "
           "itself; allowed: auto (= last), last, mean")
    f = ds.finetune
    _check(f.epochs >= 1, f"downstream.finetune.epochs={f.epochs} must be >= 1")
    _check(f.batch_size >= 1, f"downstream.finetune.batch_size={f.batch_size} must be >= 1")
    _check(0 <= f.warmup_frac <= 1, f"downstream.finetune.warmup_frac={f.warmup_frac} must be in [0, 1]")
    _check(f.layer_decay is None or (isinstance(f.layer_decay, (int, float)) and 0 < f.layer_decay <= 1),
           f"downstream.finetune.layer_decay={f.layer_decay} must be in (0, 1] or null (one lr)")
    _check(0 <= f.dropout < 1, f"downstream.finetune.dropout={f.dropout} must be in [0, 1)")
    lrs = list(f.lr) if isinstance(f.lr, ListConfig) else [f.lr]
    _check(len(lrs) >= 1 and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in lrs),
           f"downstream.finetune.lr={f.lr} must be a learning rate > 0 or a non-empty list of them (a grid)")
    _check(0 <= f.stride < f.max_seq_len - 2,
           f"downstream.finetune.stride={f.stride} must be in [0, downstream.finetune.max_seq_len - 2 = "
           f"{f.max_seq_len - 2})")
    _check(f.early_stopping_patience is None or f.early_stopping_patience >= 1,
           f"downstream.finetune.early_stopping_patience={f.early_stopping_patience} must be >= 1 or null")
    mte = ds.max_train_examples
    budgets = list(mte) if isinstance(mte, ListConfig) else [mte]
    _check((mte is None or len(budgets) >= 1)
           and all(x is None and len(budgets) == 1 or isinstance(x, int) and not isinstance(x, bool) and x >= 1
                   for x in budgets) and len(set(budgets)) == len(budgets),
           f"downstream.max_train_examples={mte} must be null (all), a number of examples >= 1, or a non-empty list of "
           "distinct numbers >= 1 (a label-budget curve)")
    _check(ds.max_selection_examples is None or ds.max_selection_examples >= 1,
           f"downstream.max_selection_examples={ds.max_selection_examples} must be >= 1 or null")
    _check(0 < ds.val_fraction < 1, f"downstream.val_fraction={ds.val_fraction} must be in (0, 1)")
    _owned(check_score_split, ds.score_split)
    _owned(check_only_declared, ds.only_declared)
    _check(len(set(ds.seeds)) == len(ds.seeds), f"downstream.seeds={list(ds.seeds)} has duplicates")
    _check(
        ds.finetune.max_seq_len <= max_positions,
        f"downstream.finetune.max_seq_len={ds.finetune.max_seq_len} exceeds the model's {max_positions} positions "
        "(model.max_position_embeddings)",
    )


OPTIM_IMPLS = ("auto", "for_loop", "foreach", "fused")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "32", "16", "bf16", "64", "auto")


def validate_analysis(a) -> None:
    """``analysis.*``: the schema's own rules (:class:`mlmlab.stats.Question`), as a one-line ConfigError."""
    if a is None:
        return
    try:
        OmegaConf.to_object(a) if isinstance(a, DictConfig) else Question(**a)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def validate_declared_metrics(a, ds, objective: str) -> None:
    """A declared metric (``analysis.primary``, ``analysis.family``) that names a task must name one the job
    fine-tunes, at a label budget it runs (``downstream/<task>@<N>/<name>``), and a ``val/mlm_loss_*`` metric needs an
    objective that logs it: known here, before any job of a sweep runs, not after its first round. ``a``: the
    ``analysis`` group, ``ds``: ``downstream``."""
    if a is None or not a.get("primary"):
        return
    tasks = list(ds.tasks or [])
    mte = ds.max_train_examples
    budgets = [int(x) for x in mte] if isinstance(mte, (list, tuple, ListConfig)) else ([int(mte)] if mte else [])
    for key, metric in [("analysis.primary", a.primary), *(("analysis.family", m) for m in a.get("family") or [])]:
        read = _reads(metric)
        if read is not None and read[0] != "val":
            head, task, n = read
            _check(task in tasks, f"{key}={metric} reads task {task!r}, which this job does not fine-tune; allowed: "
                   f"a metric of downstream.tasks={tasks}")
            _check(n is None or n in budgets, f"{key}={metric} reads {n} labels, a budget this job does not run; "
                   f"allowed: {', '.join(map(str, budgets)) or 'none (downstream.max_train_examples=null)'}")
        if str(metric).startswith("val/mlm_loss") and objective not in ("mlm", "none"):
            raise ConfigError(f"{key}={metric} is the MLM's fixed-mask loss, which objective={objective} does not log; "
                              f"allowed: a metric the job logs (objective=electra: val/gen_mlm_loss_r15, ...)")


def validate(cfg: DictConfig) -> None:
    """Reject bad values with a :class:`ConfigError` naming the key and the allowed values. Does no data work."""
    from mlmlab.data.tokenizer import SPECIAL_TOKENS, WORD_SEGMENTERS  # local: keeps config importable without data

    check_known_keys(cfg, TrainConfig)
    _check(isinstance(cfg.seed, int) and 0 <= cfg.seed < 2**32,
           f"seed={cfg.seed} must be an integer in [0, 2**32 - 1] (numpy's and torch's seed range)")
    validate_objective(cfg.objective, cfg.model)
    from mlmlab import init as init_

    init_.check(cfg.get("init"))
    validate_mask(cfg.mask)
    sel = cfg.mask.get("select")
    if sel is not None:
        _check(sel.weight != "loss" or cfg.objective.name == "mlm",
               f"mask.select.weight=loss reads the MLM loss of the model being trained: objective=mlm only "
               f"(objective={cfg.objective.name}); allowed here: uniform, idf, domain")
        for key in ("corpus", "reference"):  # found now, not after tokenizing the corpus
            if sel.get(key) is not None:
                from mlmlab.data.vocab_stats import find_data_path

                find_data_path(str(sel.get(key)), cfg.paths.get("data_dir"), f"mask.select.{key}")
    validate_analysis(cfg.get("analysis"))
    validate_declared_metrics(cfg.get("analysis"), cfg.downstream, cfg.objective.name)
    sampler = cfg.mask.sampler
    for key in ("word_list", "corpus", "reference"):  # the domain sampler's files: found now, not after tokenizing
        if isinstance(sampler, DictConfig) and sampler.get(key) is not None:
            from mlmlab.data.vocab_stats import find_data_path, read_lines

            find_data_path(str(sampler.get(key)), cfg.paths.get("data_dir"), f"mask.sampler.{key}")
            if key == "word_list":  # a small file: its entries are checked now (their vocabulary after tokenizing)
                _check(bool(read_lines(str(sampler.word_list), cfg.paths.get("data_dir"))),
                       f"mask.sampler.word_list={sampler.word_list!r} holds no entries (empty, or only blank and "
                       "# lines); expected one domain term per line")
    _owned(check_rate, "eval.rate", cfg.eval.rate)
    _owned(ReplaceConfig(**OmegaConf.to_container(cfg.eval.replace)).check, "eval.replace")
    units = eval_units(cfg.eval)
    _check(bool(units) and all(u in EVAL_UNITS for u in units) and len(set(units)) == len(units),
           f"eval.units={units} must be a non-empty list of distinct units (or null: [token]); allowed: "
           f"{', '.join(EVAL_UNITS)}")
    _check(len(units) == 1 or cfg.objective.name == "mlm",
           f"eval.units={units}: units after the first are scored at the end for objective=mlm only "
           f"(objective={cfg.objective.name})")
    per_source = cfg.eval.get("per_source", False)
    _check(isinstance(per_source, bool), f"eval.per_source={per_source!r} must be true or false")
    _check(not per_source or bool(cfg.data.get("mix")),
           f"eval.per_source=true scores each source of data.mix separately; data={cfg.data.get('name')} has no "
           f"data.mix (allowed: false, or a mixture such as data=finance_mix, medical_mix)")
    _check(not per_source or cfg.objective.name == "mlm",
           f"eval.per_source=true: the per-source losses are scored at the end for objective=mlm only "
           f"(objective={cfg.objective.name})")
    _owned(check_phase_margin, cfg.eval.get("phase_margin", 0.1))
    n = cfg.eval.get("zeroshot_every_n_steps")
    _check(n is None or n >= 1, f"eval.zeroshot_every_n_steps={n} must be >= 1 or null (off)")
    _check(cfg.eval.get("zeroshot_n_per_paradigm", 1) >= 1,
           f"eval.zeroshot_n_per_paradigm={cfg.eval.get('zeroshot_n_per_paradigm')} must be >= 1")
    _check(n is None or bool(cfg.downstream.tasks),
           "eval.zeroshot_every_n_steps needs downstream.tasks (BLiMP for the zero-shot curve, or a classification "
           "task for the probe curve)")

    d = cfg.data
    _check_choice("data.name", d.name, DATA_NAMES)
    _check_choice("data.doc_sep", d.doc_sep, DOC_SEPS)
    _check(d.max_seq_len >= 8, f"data.max_seq_len={d.max_seq_len} must be >= 8")
    _check(
        d.max_seq_len <= cfg.model.max_position_embeddings,
        f"data.max_seq_len={d.max_seq_len} exceeds model.max_position_embeddings="
        f"{cfg.model.max_position_embeddings} (model={cfg.model.name}); allowed: 8..{cfg.model.max_position_embeddings}",
    )
    _check(d.batch_size >= 1, f"data.batch_size={d.batch_size} must be >= 1")
    _check(0.0 < d.val_fraction < 1.0, f"data.val_fraction={d.val_fraction} must be in (0, 1)")
    if d.name == "builtin":
        _check(d.n_docs >= 10, f"data.n_docs={d.n_docs} must be >= 10")
        _check(d.n_val_docs >= 1, f"data.n_val_docs={d.n_val_docs} must be >= 1")
        _check(d.n_topics >= 2, f"data.n_topics={d.n_topics} must be >= 2")
    else:
        from mlmlab.data.corpus import text_files, uses_hub  # raises ConfigError naming data.path

        _check_choice("data.source", d.source, DATA_SOURCES)
        _check(d.num_proc >= 1, f"data.num_proc={d.num_proc} must be >= 1")
        if d.source == "hub":
            _check(not OmegaConf.is_missing(d, "hub") and bool(d.hub),
                   f"data.source=hub needs data.hub (a hub data set name; data={d.name})")
            _check(not d.mix, "data.source=hub cannot be combined with data.mix (a mixture takes local files)")
        if d.mix:
            _check(d.path is None, f"set data.path or data.mix, not both (data={d.name})")
            for i, src in enumerate(d.mix):
                extra = set(src) - {"path", "val_path", "weight"}
                _check(not extra and "path" in src, f"data.mix[{i}]={dict(src)}: needs path, optionally val_path and "
                       f"weight (unknown: {sorted(extra)})")
                w = src.get("weight", 1.0)
                _check(isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0,
                       f"data.mix[{i}].weight={w} must be a number > 0")
                text_files(src.path, f"data.mix[{i}].path")
                if src.get("val_path") is not None:
                    text_files(src.val_path, f"data.mix[{i}].val_path")
        elif not uses_hub(d):
            _check(d.path is not None, f"data.path is required for data={d.name} (a .txt file or a folder of .txt "
                   "files), or data.mix, or data.hub")
            text_files(d.path, "data.path")
            if d.val_path is not None:
                text_files(d.val_path, "data.val_path")

    t = cfg.tokenizer
    _check_choice("tokenizer.name", t.name, ("wordpiece",))
    _check_choice("tokenizer.word_segmenter", t.word_segmenter, WORD_SEGMENTERS)
    _check(
        t.vocab_size > len(SPECIAL_TOKENS),
        f"tokenizer.vocab_size={t.vocab_size} must be larger than the {len(SPECIAL_TOKENS)} special tokens "
        f"({' '.join(SPECIAL_TOKENS)})",
    )

    m = cfg.model
    from mlmlab.models.encoder import NORMS, POSITIONS

    _check_choice("model.norm", m.norm, NORMS)
    _check_choice("model.position", m.position, POSITIONS)
    _check(m.hidden_size % m.num_heads == 0, f"model.hidden_size={m.hidden_size} must be divisible by model.num_heads={m.num_heads}")
    _check(m.position != "rope" or (m.hidden_size // m.num_heads) % 2 == 0,
           f"model.position=rope needs an even head size: model.hidden_size={m.hidden_size} / "
           f"model.num_heads={m.num_heads} is odd")
    for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
        _check(getattr(m, k) >= 1, f"model.{k}={getattr(m, k)} must be >= 1")

    o = cfg.optim
    _check_choice("optim.name", o.name, ("adamw",))
    _check_choice("optim.schedule", o.schedule, LR_SCHEDULES)
    _check(o.lr > 0, f"optim.lr={o.lr} must be > 0")
    _check(o.warmup_frac is None or 0 <= o.warmup_frac < 1,
           f"optim.warmup_frac={o.warmup_frac} must be in [0, 1) or null (then optim.warmup_steps is used)")
    _check(o.warmup_steps >= 0, f"optim.warmup_steps={o.warmup_steps} must be >= 0")
    _check(0 < o.decay_frac <= 1, f"optim.decay_frac={o.decay_frac} must be in (0, 1] (schedule=wsd's decay share)")
    _check_choice("optim.impl", o.impl, OPTIM_IMPLS)
    _check_choice("trainer.precision", str(cfg.trainer.precision), PRECISIONS)
    _check_bf16(cfg.trainer)
    from mlmlab.hardware import resolve_precision

    _check(not (o.impl == "fused" and "mixed" in resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator)
                and cfg.trainer.gradient_clip_val),
           f"optim.impl=fused cannot be combined with trainer.precision={cfg.trainer.precision} and "
           f"trainer.gradient_clip_val={cfg.trainer.gradient_clip_val} (Lightning refuses to clip the gradients of a "
           "fused optimizer under mixed precision); allowed: optim.impl=foreach, or trainer.gradient_clip_val=null")
    _check(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), f"optim.betas={list(o.betas)} must be two values in [0, 1)")
    _check(cfg.trainer.max_steps >= 1, f"trainer.max_steps={cfg.trainer.max_steps} must be >= 1")
    b = cfg.trainer.budget
    set_ = [f"trainer.budget.{k}={b[k]}" for k in ("tokens", "flops", "seconds") if b[k] is not None]
    _check(len(set_) <= 1, f"set at most one budget, not {' and '.join(set_)}")
    if b.seconds is not None:
        from mlmlab.flops import world_size

        _check(world_size(cfg.trainer) == 1, "trainer.budget.seconds calibrates the step count on one process; with "
               f"trainer.devices={cfg.trainer.devices} use trainer.budget.tokens or trainer.max_steps")
    for k in ("tokens", "flops", "seconds"):
        v = b[k]
        _check(v is None or (v > 0 and math.isfinite(v)), f"trainer.budget.{k}={v} must be > 0 or null")
    _check_budget_size(cfg.trainer, cfg.data, cfg.model, cfg.objective, cfg.tokenizer)
    validate_reliability(cfg)

    validate_downstream(cfg, cfg.objective.name, m.max_position_embeddings)

    if cfg.logger.wandb is not None:
        _check_choice("logger.wandb.mode", cfg.logger.wandb.mode, WANDB_MODES)
        fs = cfg.logger.wandb.get("flush_seconds", 2.0)
        _check(fs is not None and 0 < fs <= 60, f"logger.wandb.flush_seconds={fs} must be in (0, 60]")


def _check_budget_size(t, d, m, objective, tokenizer) -> None:
    """A budget that plans more than ``MAX_PLANNED_STEPS`` steps is refused before any data work: the steps of a token
    budget are exact here; those of a FLOP budget are at least the budget over the step's FLOPs with every position
    predicted and ``tokenizer.vocab_size`` (mlmlab.flops: the real step, sparser and with the built vocabulary, costs
    no more, so the run would take at least these steps)."""
    from mlmlab.flops import MAX_PLANNED_STEPS, electra_step_flops, mlm_step_flops, world_size

    b = t.budget
    batch = d.batch_size * t.accumulate_grad_batches * world_size(t)
    what, steps = f"trainer.max_steps={t.max_steps}", t.max_steps
    if b.tokens is not None:
        what, steps = f"trainer.budget.tokens={b.tokens:g}", b.tokens / (batch * d.max_seq_len)
    elif b.flops is not None:
        vocab = tokenizer.vocab_size
        per_step = (electra_step_flops(m, objective, vocab, batch, d.max_seq_len, 1.0, 1.0)
                    if objective.name == "electra" else mlm_step_flops(m, vocab, batch, d.max_seq_len, 1.0))
        what, steps = f"trainer.budget.flops={b.flops:g}", b.flops / per_step
    elif b.seconds is not None:
        return  # the calibration counts the steps that fill the seconds
    _check(steps <= MAX_PLANNED_STEPS, f"{what} plans {steps:.3g} optimizer steps or more; allowed: at most "
           f"{MAX_PLANNED_STEPS:.0e} steps (data.batch_size x data.max_seq_len = {batch} x {d.max_seq_len} tokens a step)")


def _check_bf16(t) -> None:
    """bf16 asked for on a CPU that only emulates it (slower than fp32): an error, with the ways out."""
    from mlmlab.hardware import BF16_CPU_FLAGS, cpu_bf16_supported, on_cpu

    p = str(t.precision)
    if p in ("16-mixed", "16", "16-true") and on_cpu(t.accelerator):  # Lightning would run bf16 and record "16-mixed"
        raise ConfigError(f"trainer.precision={p}: fp16 is a GPU precision; on the CPU Lightning switches it to bf16, "
                          "so the record would name a precision that did not run; allowed on the CPU: 32-true, "
                          "bf16-mixed, bf16-true, auto")
    if p.startswith("bf16") and on_cpu(t.accelerator) and not cpu_bf16_supported():
        raise ConfigError(f"trainer.precision={p}: this CPU has no native bf16 ({' / '.join(BF16_CPU_FLAGS)}), so bf16 "
                          "autocast would be emulated and slower than fp32; allowed here: trainer.precision=32-true, or "
                          "auto (bf16-mixed where the device supports it, else 32-true)")


def valid_threads(th) -> bool:
    return str(th) == "auto" or (isinstance(th, int) and not isinstance(th, bool) and th >= 1)


def validate_reliability(cfg: DictConfig) -> None:
    """``trainer.checkpoint_every_n_steps``, ``trainer.nonfinite`` and ``resume`` (the checkpoint must exist)."""
    from mlmlab.checkpoint import resume_path
    from mlmlab.guard import NONFINITE_MODES

    t = cfg.trainer
    n = t.get("checkpoint_every_n_steps")
    _check(n is None or n >= 1, f"trainer.checkpoint_every_n_steps={n} must be >= 1 or null (off)")
    _check_choice("trainer.nonfinite", t.get("nonfinite", "error"), NONFINITE_MODES)
    th = t.get("threads", "auto")
    _check(valid_threads(th), f"trainer.threads={th!r}; allowed: auto, or an integer >= 1")
    r = cfg.get("resume")
    _check(not (cfg.get("overwrite") and r is not None), f"overwrite=true and resume={r!r} contradict each other: "
           "resume= continues that checkpoint, overwrite=true starts again from step 0; give one of them")
    if r is not None:
        _check(cfg.objective.name != "none", "resume= needs a pretraining objective (objective=none trains nothing)")
        p = resume_path(r)
        _check(p.is_file(), f"resume={r!r}: {p} does not exist; give a run dir holding checkpoints/last.ckpt or the "
               "explicit path of a .ckpt file")
        from mlmlab.checkpoint import check_resume

        check_resume(r, to_container(cfg))  # the config diff before any data work (the job reads the path again)


def to_container(cfg: DictConfig) -> dict:
    """The whole resolved config as plain Python (Hydra's own node dropped)."""
    c = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    c.pop("hydra", None)
    return c


def typed(cfg: DictConfig):
    """The composed, validated config as its typed schema (``TrainConfig``, ``FinetuneJobConfig``): the one conversion,
    at a job's entry; below it each stage takes the groups it uses."""
    if "hydra" in cfg:  # a config composed with Hydra's own node (tests, notebooks): the job's part only
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        OmegaConf.set_struct(cfg, True)
    return OmegaConf.to_object(cfg)


def resolve_path(p: str | None) -> Path | None:
    return None if p is None else Path(p).expanduser()
