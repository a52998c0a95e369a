"""Downstream task registry: what each task's records look like, its label set, metrics and primary metric, and where
its splits come from (the built-in generator, local JSON Lines files in the layout of ``../shared/data``, or the hub).

A loaded task is ``{"train": [...], "validation": [...], "test": [...]}`` (``test`` only where it has labels) of records
``{"text": str, "label": int}`` (``"text_b"`` for pairs) or, for token classification, ``{"tokens": [str],
"tags": [int]}``. Label strings are mapped to ids in the order of ``TaskSpec.labels`` (or of their sorted set in train).
Local files: ``<data dir>/<TaskSpec.local>/<split>.jsonl``, the data dir from ``paths.data_dir`` or ``$MLMLAB_DATA_DIR``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlmlab.data import builtin
from mlmlab.errors import ConfigError

KINDS = ("single", "pair", "token", "minimal_pairs")
METRICS = ("acc", "f1", "mcc", "entity_f1")
SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str  # single | pair | token
    columns: tuple[str, ...]  # text column(s); for token tasks the list-of-words column
    label_column: str = "label"
    metrics: tuple[str, ...] = ("acc",)
    main_metric: str = "acc"
    # label names in id order: a string label maps by name, an int label (GLUE's local files, hub ClassLabel ids)
    # by position; None: the sorted labels of train (ints numerically)
    labels: tuple[str, ...] | None = None
    local: str | None = None  # folder under the data dir holding <split>.jsonl
    hub: tuple[str, str | None] | None = None  # datasets.load_dataset(path, name)
    hub_splits: dict[str, str] = field(default_factory=dict)  # our split -> the hub's split name
    splits: tuple[str, ...] = ("train", "validation", "test")  # labelled splits the task has
    generate: Callable[[TaskSource], dict] | None = None  # built-in tasks: splits + label_names
    # minimal_pairs (zero-shot, no training): one <paradigm>.jsonl per paradigm in the local folder; on the hub, one
    # config per paradigm (split "train"); columns = (good sentence, bad sentence)
    paradigms: tuple[str, ...] = ()
    # train holds the phrases of its sentences (SST-2: every node of the treebank's parse trees): a part held out of
    # train takes whole sentences, and the phrases found only inside held-out sentences leave train (hold_out)
    phrases: bool = False

    @property
    def files(self) -> tuple[str, ...]:
        """The local files' stems: the splits, or a minimal-pairs task's paradigms."""
        return self.paradigms if self.kind == "minimal_pairs" else self.splits

    def check_available(self, src: TaskSource) -> None:
        """ConfigError before any work when the task cannot be loaded from ``src`` (no local files, no hub)."""
        if self.generate is not None:
            return
        folder = self.local_dir(src)
        what = "paradigms" if self.kind == "minimal_pairs" else "splits"
        if folder is not None and folder.is_dir():  # local files win; all declared splits/paradigms must be there
            missing = [s for s in self.files if not (folder / f"{s}.jsonl").is_file()]
            if missing and self.kind != "minimal_pairs":
                raise ConfigError(f"task {self.name}: {', '.join(f'{folder}/{s}.jsonl' for s in missing)} not found "
                                  f"(the task declares the splits {list(self.splits)})")
            if missing:
                shown = ", ".join(f"{s}.jsonl" for s in missing[:10]) + (f" (+{len(missing) - 10} more)"
                                                                         if len(missing) > 10 else "")
                raise ConfigError(f"task {self.name}: {len(missing)} of the {len(self.files)} {what} it declares "
                                  f"are missing in {folder}: {shown}")
        elif self.hub is None:
            where = f"{folder}" if folder is not None else f"<data dir>/{self.local}"
            raise ConfigError(f"task {self.name} needs local files in {where} (one <{what[:-1]}>.jsonl per "
                              f"{what[:-1]}); set paths.data_dir or MLMLAB_DATA_DIR to a ../shared/data-style folder")

    def local_dir(self, src: TaskSource) -> Path | None:
        root = src.root
        return None if self.local is None or root is None else root / self.local

    def load(self, src: TaskSource) -> dict:
        """The task's splits (records) and ``label_names`` from ``src``; cached per source for the process."""
        key = (self.name, src)
        if key not in _CACHE:
            _CACHE[key] = self._load(src)
        return _CACHE[key]

    def _load(self, src: TaskSource) -> dict:
        if self.generate is not None:  # the built-in tasks: splits and labels from the generator
            return self.generate(src)
        self.check_available(src)
        folder = self.local_dir(src)
        local = folder is not None and folder.is_dir()
        source = f"local:{folder}" if local else f"hub:{self.hub[0]}" + (f"/{self.hub[1]}" if self.hub[1] else "")
        if self.kind == "minimal_pairs":
            return {"pairs": self._pairs(folder if local else None), "label_names": [], "source": source}
        raw = {s: read_jsonl(folder / f"{s}.jsonl") if local else _hub_split(self, s, src.data_dir) for s in self.splits}
        out = self.convert(raw)
        out["source"] = source
        return out

    def _pairs(self, folder: Path | None) -> list[dict]:
        """Every paradigm's pairs as ``{"good", "bad", "paradigm", "field", "pair_id"}``; a record without the task's
        columns is reported with its file and line."""
        good, bad = self.columns
        out = []
        for par in self.paradigms:
            if folder is not None:
                where, rows = folder / f"{par}.jsonl", read_jsonl(folder / f"{par}.jsonl")
            else:
                where, rows = f"{self.hub[0]}/{par}", _hub_rows(self, par)
            if not rows:
                raise ConfigError(f"task {self.name}: {where} holds no pairs")
            for i, r in enumerate(rows):
                if good not in r or bad not in r:
                    raise ConfigError(f"task {self.name}: {where}, record {i + 1} lacks {good!r} or {bad!r} "
                                      f"(it has {sorted(r)})")
                out.append({"good": str(r[good]), "bad": str(r[bad]), "paradigm": par,
                            "field": str(r.get("field", "all")), "pair_id": r.get("pairID", i)})
        return out

    def convert(self, raw: dict[str, list[dict]]) -> dict:
        """Check columns and labels of raw records and turn them into the common form (label ids)."""
        for split, rows in raw.items():
            if not rows:
                raise ConfigError(f"task {self.name}: the {split} split is empty")
            need = (*self.columns, self.label_column)
            for i, r in enumerate(rows):
                missing = [c for c in need if c not in r]
                if missing:
                    raise ConfigError(f"task {self.name}: {split} record {i + 1} lacks column(s) {missing}; "
                                      f"the task declares {list(need)}, the record has {sorted(r)}")
        names = self._label_set(raw["train"])
        index = {n: i for i, n in enumerate(names)}
        out: dict = {"label_names": names}
        for split, rows in raw.items():
            out[split] = [self._record(r, index, split, i) for i, r in enumerate(rows)]
        seen = {t for r in out["train"] for t in (r["tags"] if self.kind == "token" else [r["label"]])}
        if len(seen) < 2:
            raise ConfigError(f"task {self.name}: the train split has a single label "
                              f"{[names[i] for i in seen]}; a classifier needs at least two")
        return out

    def _label_set(self, train: list[dict]) -> list[str]:
        if self.labels is not None:
            return list(self.labels)
        values = {v for r in train for v in (r[self.label_column] if self.kind == "token" else [r[self.label_column]])}
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
        return [str(v) for v in sorted(values, key=int if ints else str)]

    def _record(self, r: dict, index: dict[str, int], split: str, i: int) -> dict:
        def lid(v) -> int:
            if self.labels is not None and isinstance(v, int) and not isinstance(v, bool):
                if not 0 <= v < len(self.labels):
                    raise ConfigError(f"task {self.name}: {split} record {i + 1} has label id {v}; the task's labels "
                                      f"are {list(self.labels)} (ids 0..{len(self.labels) - 1})")
                return v
            if str(v) not in index:
                raise ConfigError(f"task {self.name}: {split} record {i + 1} has label {v!r}, which is not in the "
                                  f"train split's label set {list(index)}")
            return index[str(v)]

        if self.kind == "token":
            words, tags = list(r[self.columns[0]]), [lid(t) for t in r[self.label_column]]
            if len(words) != len(tags):
                raise ConfigError(f"task {self.name}: {split} record {i + 1} has {len(words)} tokens but "
                                  f"{len(tags)} tags")
            return {"tokens": words, "tags": tags}
        out = {"text": str(r[self.columns[0]]), "label": lid(r[self.label_column])}
        if self.kind == "pair":
            out["text_b"] = str(r[self.columns[1]])
        return out


_CACHE: dict = {}


def data_root(paths) -> Path | None:
    """``paths.data_dir`` (default: env MLMLAB_DATA_DIR), or None."""
    d = paths.data_dir
    return None if d is None else Path(str(d)).expanduser()


@dataclass(frozen=True)
class TaskSource:
    """What loading a task reads of a job's config: the data dir (``paths.data_dir``: local files) and, for the
    built-in tasks, the built-in language (``data.name``, ``data.n_topics``) and the split sizes
    (``downstream.builtin_n_train`` / ``builtin_n_test``). Hashable: loaded tasks are cached per source."""
    data_dir: str | None = None
    data_name: str = "builtin"
    n_topics: int = 8
    builtin_n_train: int = 512
    builtin_n_test: int = 1000

    @classmethod
    def of(cls, paths, data, downstream) -> TaskSource:
        """From the ``paths``, ``data`` and ``downstream`` groups."""
        return cls(None if paths.data_dir is None else str(paths.data_dir), data.name, data.n_topics,
                   downstream.builtin_n_train, downstream.builtin_n_test)

    @property
    def root(self) -> Path | None:
        return None if self.data_dir is None else Path(self.data_dir).expanduser()


def hold_out(train: list[dict], frac: float, phrases: bool = False) -> tuple[list[dict], list[dict]]:
    """A fixed selection split from train (seeded shuffle) where lr selection or early stopping needs one and the task
    has none apart from the reported split. Returns (train, held out).

    ``phrases`` (a task whose train split holds the phrases of its sentences, ``TaskSpec.phrases``): held out by
    sentence, see :func:`hold_out_sentences`."""
    if phrases:
        return hold_out_sentences(train, frac)
    if len(train) < 2:
        raise ConfigError(f"a train split of {len(train)} example(s) cannot give up a validation part; need >= 2")
    idx = list(range(len(train)))
    random.Random(0).shuffle(idx)
    n_val = max(1, int(round(frac * len(train))))
    val = set(idx[:n_val])
    return [r for i, r in enumerate(train) if i not in val], [r for i, r in enumerate(train) if i in val]


_SENTENCE_SPLITS: dict[tuple, tuple[list[int], list[int]]] = {}


def _word_spans(text: str, out: set[str]) -> None:
    """Every run of consecutive words of ``text`` (words split on single spaces) into ``out``."""
    bounds = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    for a, (start, _) in enumerate(bounds):
        for _, end in bounds[a:]:
            out.add(text[start:end])


def hold_out_sentences(train: list[dict], frac: float) -> tuple[list[dict], list[dict]]:
    """A selection split of whole sentences for a train split of phrases (SST-2), so that no held-out text is seen
    in training. A *sentence* is an example no other example contains (word-wise; the longest first); a seeded
    ``frac`` of the sentences is held out; train keeps every other sentence and every phrase that occurs inside one
    of them, and drops the phrases found only inside held-out sentences. A random tenth of SST-2's phrases instead
    shares its text with the rest: 84% of its examples of >= 4 words occur inside a training phrase, 0% of GLUE dev's
    (benchmarks/bench_split_overlap.py). Written here because no library splits treebank phrases by sentence; cached
    per train list for the process. Returns (train, held-out sentences), each in the order of ``train``."""
    texts = [" ".join(str(r["text"]).split()) for r in train]
    key = (id(train), len(train), frac, hash(tuple(texts[:50])))
    if key not in _SENTENCE_SPLITS:
        covered: set[str] = set()
        sentences = []
        for i in sorted(range(len(texts)), key=lambda i: -len(texts[i].split())):  # stable: ties in file order
            if texts[i] not in covered:
                sentences.append(i)
                _word_spans(texts[i], covered)
        del covered
        if len(sentences) < 2:
            raise ConfigError(f"a train split of {len(sentences)} sentence(s) cannot give up a validation part of "
                              "whole sentences; need >= 2")
        sentences.sort()
        random.Random(0).shuffle(sentences)
        held = set(sentences[: max(1, int(round(frac * len(sentences))))])
        kept: set[str] = set()
        for i in sentences:
            if i not in held:
                _word_spans(texts[i], kept)
        _SENTENCE_SPLITS[key] = ([i for i in range(len(texts)) if i not in held and texts[i] in kept], sorted(held))
    keep, held = _SENTENCE_SPLITS[key]
    return [train[i] for i in keep], [train[i] for i in held]


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON Lines file; a non-UTF-8 byte or a bad line is reported with the file and line number."""
    rows = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(f"{path}, line {n}: not valid UTF-8 ({e.reason} at byte {e.start})") from e
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}, line {n}: not valid JSON ({e.msg})") from e
    return rows


def _hub_split(spec: TaskSpec, split: str, data_dir: str | None = None) -> list[dict]:
    from mlmlab.data.hub import load_dataset

    path, name = spec.hub
    try:
        ds = load_dataset(path, name, split=spec.hub_splits.get(split, split))
    except Exception as e:
        where = (f"{data_dir}/{spec.local or spec.name}/" if data_dir else
                 f"<data dir>/{spec.local or spec.name}/ and point MLMLAB_DATA_DIR (or paths.data_dir) at the data dir "
                 "(neither is set)")
        raise ConfigError(f"task {spec.name}: could not load {path}{'/' + name if name else ''} split {split} from "
                          f"the hub ({type(e).__name__}: {e}); for offline work put local files under {where}") from e
    feats = ds.features.get(spec.label_column)
    names = getattr(feats, "names", None) or getattr(getattr(feats, "feature", None), "names", None)
    rows = ds.to_list()
    if names and spec.kind == "token":  # NER tag ids -> their names, as in the local files (classification keeps the
        for r in rows:                  # ids: they map by position onto TaskSpec.labels, like the local int labels)
            v = r[spec.label_column]
            r[spec.label_column] = [names[t] for t in v] if isinstance(v, list) else names[v]
    return rows


def _hub_rows(spec: TaskSpec, config: str) -> list[dict]:
    """A minimal-pairs paradigm from the hub (``nyu-mll/blimp`` has one config per paradigm, split ``train``)."""
    from mlmlab.data.hub import load_dataset

    try:
        return load_dataset(spec.hub[0], config, split="train").to_list()
    except Exception as e:
        raise ConfigError(f"task {spec.name}: could not load {spec.hub[0]}/{config} from the hub ({type(e).__name__}: "
                          f"{e}); for offline work put <paradigm>.jsonl files under <data dir>/{spec.local}/") from e


def _builtin(name: str) -> TaskSpec:
    def generate(src: TaskSource) -> dict:
        n_topics = src.n_topics if src.data_name == "builtin" else 8
        out: dict = {split: builtin.generate_task(name, split, n, seed=0, n_topics=n_topics)
                     for split, n in (("train", src.builtin_n_train), ("test", src.builtin_n_test))}
        out["label_names"] = [str(i) for i in range(builtin.task_num_labels(name, n_topics))]
        return out

    return TaskSpec(name=name, kind="single", columns=("text",), splits=("train", "test"), generate=generate)


TASK_KEYS = ("kind", "columns", "label_column", "labels", "metrics", "main_metric", "local", "hub", "hub_splits",
             "splits", "paradigms", "phrases")
TASK_DIR = Path(__file__).resolve().parents[1] / "tasks"  # the registry: mlmlab/tasks/<name>.yaml


def spec_from_yaml(path: Path) -> TaskSpec:
    """A task declared in ``<name>.yaml`` (see mlmlab/tasks/): ``kind``, ``columns``, ``labels`` (optional), ``metrics``
    (the first is primary unless ``main_metric``), ``local`` (folder under the data dir), ``hub`` ({path, name}),
    ``splits`` (labelled splits, default train/validation/test), ``label_column``, ``hub_splits``."""
    from omegaconf import OmegaConf

    name = path.stem
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
    except Exception as e:
        raise ConfigError(f"task file {path}: not valid YAML ({e})") from e

    def bad(msg: str) -> ConfigError:
        return ConfigError(f"task file {path}: {msg}")

    unknown = sorted(set(raw) - set(TASK_KEYS))
    if unknown:
        raise bad(f"unknown key(s) {unknown}; allowed: {', '.join(TASK_KEYS)}")
    for key in ("kind", "columns"):
        if key not in raw:
            raise bad(f"{key} is required")
    if raw["kind"] not in KINDS:
        raise bad(f"kind={raw['kind']!r} is not known; allowed: {', '.join(KINDS)}")
    columns = tuple(raw["columns"]) if isinstance(raw["columns"], list) else (raw["columns"],)
    need = {"single": 1, "pair": 2, "token": 1, "minimal_pairs": 2}[raw["kind"]]
    if len(columns) != need:
        raise bad(f"kind={raw['kind']} takes {need} column(s) in columns, got {list(columns)}")
    metrics = tuple(raw.get("metrics") or ("acc",))
    for m in metrics:
        if m not in METRICS:
            raise bad(f"metric {m!r} is not known; allowed: {', '.join(METRICS)}")
    if (raw["kind"] == "token") != (metrics == ("entity_f1",)):
        raise bad("token tasks take metrics [entity_f1], and entity_f1 is for token tasks only")
    main = raw.get("main_metric", metrics[0])
    if main not in metrics:
        raise bad(f"main_metric={main!r} must be one of metrics {list(metrics)}")
    paradigms = tuple(str(x) for x in raw.get("paradigms") or ())
    if (raw["kind"] == "minimal_pairs") != bool(paradigms):
        raise bad("paradigms (the <paradigm>.jsonl files) is required for kind=minimal_pairs, and only for it")
    if raw["kind"] == "minimal_pairs" and metrics != ("acc",):
        raise bad("kind=minimal_pairs takes metrics [acc] (a pair is right when the good sentence scores higher)")
    splits = tuple(raw.get("splits") or SPLITS)
    if "train" not in splits or any(sp not in SPLITS for sp in splits) or len(splits) < 2:
        raise bad(f"splits={list(splits)} must hold train and at least one of validation, test")
    hub = raw.get("hub")
    if hub is not None:
        if not isinstance(hub, dict) or "path" not in hub or set(hub) - {"path", "name"}:
            raise bad(f"hub={hub!r} must be {{path: <hub name>, name: <config or omitted>}}")
        hub = (str(hub["path"]), hub.get("name"))
    if raw.get("local") is None and hub is None:
        raise bad("set local (a folder under the data dir) or hub (a hub data set), or both")
    labels = raw.get("labels")
    phrases = raw.get("phrases", False)
    if not isinstance(phrases, bool) or (phrases and raw["kind"] != "single"):
        raise bad(f"phrases={phrases!r} must be true or false, and true only for kind=single (a train split of "
                  "phrases of its sentences: held out by sentence)")
    return TaskSpec(name=name, kind=raw["kind"], columns=columns, label_column=raw.get("label_column", "label"),
                    metrics=metrics, main_metric=main, labels=None if labels is None else tuple(map(str, labels)),
                    local=raw.get("local"), hub=hub, hub_splits=dict(raw.get("hub_splits") or {}), splits=splits,
                    paradigms=paradigms, phrases=phrases)


def load_task_dir(d: Path | str) -> dict[str, TaskSpec]:
    d = Path(d).expanduser()
    if not d.is_dir():
        raise ConfigError(f"downstream.task_dirs: {d} is not a folder (expected a folder of <task>.yaml files)")
    return {f.stem: spec_from_yaml(f) for f in sorted(d.glob("*.yaml"))}


TASKS: dict[str, TaskSpec] = {name: _builtin(name) for name in builtin.TASK_NAMES}
TASKS.update(load_task_dir(TASK_DIR))


def task_registry(task_dirs=()) -> dict[str, TaskSpec]:
    """The built-in and mlmlab/tasks/ tasks plus those declared in ``downstream.task_dirs`` (a user's own tasks: one
    ``<name>.yaml`` each, in the format of mlmlab/tasks/). A user task may not reuse a registered name."""
    dirs = list(task_dirs or [])
    if not dirs:
        return TASKS
    out = dict(TASKS)
    for d in dirs:
        for name, spec in load_task_dir(d).items():
            if name in out:
                raise ConfigError(f"downstream.task_dirs: task {name!r} in {d} is already registered; "
                                  "rename the file")
            out[name] = spec
    return out
