"""The downstream task registry (local files in ../shared/data's formats), metrics, windowing and the fine-tuning
protocol (lr grid chosen on validation, test reported where labelled, mean/std/CI over seeds)."""

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import SHARED
from hypothesis import given, settings
from hypothesis import strategies as st

import mlmlab.downstream as downstream
from mlmlab import pretrain_job as train
from mlmlab.config import ConfigError, validate
from mlmlab.data.tasks import TASKS, TaskSource, read_jsonl
from mlmlab.downstream import classification_metrics, entity_f1, mean_ci95, windows

LOCAL = sorted(n for n, t in TASKS.items() if t.local is not None and t.kind != "minimal_pairs")  # blimp: test_zeroshot
WORDS = "good bad film plot actor great awful movie story scene".split()


def fixture_record(spec, i: int) -> dict:
    words = [WORDS[(i * 3 + k) % len(WORDS)] for k in range(3 + i % 4)]
    if spec.kind == "token":
        return {spec.columns[0]: words, spec.label_column: ["B-PER" if k == 0 else "O" for k in range(len(words))]}
    labels = spec.labels or (0, 1)
    r = {c: " ".join(words) + f" {c}" for c in spec.columns}
    r[spec.label_column] = labels[i % len(labels)]
    return r


def write_task(root: Path, spec, n: int = 24, splits=None) -> None:
    folder = root / spec.local
    folder.mkdir(parents=True, exist_ok=True)
    for split in splits or spec.splits:
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(fixture_record(spec, i)) + "\n" for i in range(n)))


@pytest.mark.parametrize("name", LOCAL)
def test_every_local_task_loads_from_fixtures(name, cfg_factory, tmp_path):
    spec = TASKS[name]
    write_task(tmp_path, spec)
    cfg = cfg_factory(f"paths.data_dir={tmp_path}", f"downstream.tasks=[{name}]")
    validate(cfg)
    data = spec.load(TaskSource.of(cfg.paths, cfg.data, cfg.downstream))
    assert set(data) == {"label_names", "source", *spec.splits} and all(len(data[s]) == 24 for s in spec.splits)
    assert data["source"] == f"local:{tmp_path / spec.local}"
    rec = data["train"][0]
    if spec.kind == "token":
        assert data["label_names"] == ["B-PER", "O"] and rec["tags"][0] == 0 and len(rec["tags"]) == len(rec["tokens"])
    else:
        assert 0 <= rec["label"] < len(data["label_names"]) and rec["text"]
        assert ("text_b" in rec) == (spec.kind == "pair")


SHARED_COUNTS = {"sst2": {"train": 67349, "validation": 872}, "rte": {"train": 2490, "validation": 277},
                 "imdb": {"train": 10000, "test": 5000},
                 "chnsenticorp": {"train": 6212, "validation": 776, "test": 777},
                 "financial_phrasebank": {"train": 3868, "validation": 483, "test": 485},
                 "medical": {"train": 2125, "validation": 265, "test": 267},
                 "conll2003": {"train": 14041, "validation": 3250, "test": 3453},
                 "bc5cdr": {"train": 4560, "validation": 4581, "test": 4797},
                 "ncbi_disease": {"train": 5424, "validation": 923, "test": 940}}


@pytest.mark.parametrize("name", sorted(SHARED_COUNTS))
def test_shared_data_tasks_load(name, cfg_factory):
    spec = TASKS[name]
    if not (SHARED / spec.local).is_dir():
        pytest.skip(f"{SHARED / spec.local} is not here")
    c = cfg_factory(f"paths.data_dir={SHARED}")
    data = spec.load(TaskSource.of(c.paths, c.data, c.downstream))
    for split, n in SHARED_COUNTS[name].items():
        assert len(data[split]) == n, split
    if name == "conll2003":
        assert len(data["label_names"]) == 9 and "O" in data["label_names"]
    if name == "financial_phrasebank":
        assert data["label_names"] == ["negative", "neutral", "positive"]
    if name == "medical":
        assert len(data["label_names"]) == 5
    if name == "bc5cdr":
        assert data["label_names"] == ["B-Chemical", "B-Disease", "I-Chemical", "I-Disease", "O"]
    if name == "ncbi_disease":
        assert data["label_names"] == ["B-Disease", "I-Disease", "O"]


def test_classification_metrics_by_hand():
    target = torch.tensor([1, 1, 1, 0, 0, 0, 1, 0])
    preds = torch.tensor([1, 1, 0, 0, 0, 1, 1, 1])
    m = classification_metrics(preds, target, 2, ("acc", "f1", "mcc"))
    # tp=3 fn=1 tn=2 fp=2: acc 5/8, F1 = 2*3 / (2*3 + 1 + 2) = 6/9, MCC = (3*2 - 2*1) / sqrt(5*4*4*3) = 4/sqrt(240)
    assert m["acc"] == pytest.approx(5 / 8) and m["f1"] == pytest.approx(6 / 9)
    assert m["mcc"] == pytest.approx(4 / math.sqrt(240))
    three = classification_metrics(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2]), 3, ("f1",))
    assert three["f1"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)  # macro: per-class F1 1, 2/3, 2/3


def test_entity_f1_on_a_known_case():
    true = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]  # 2 of 3 entities right, 3 predicted
    m = entity_f1(true, pred)
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(2 / 3)
    assert m["entity_f1"] == pytest.approx(2 / 3)
    half = entity_f1([["B-PER", "I-PER"]], [["B-PER", "O"]])  # a truncated span is a wrong entity
    assert half["entity_f1"] == 0.0


def test_mean_ci95_uses_the_t_distribution():
    mean, std, ci = mean_ci95([0.7, 0.8, 0.9])
    assert mean == pytest.approx(0.8) and std == pytest.approx(0.1)
    assert ci == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-5)  # t(0.975, df=2) = 4.3027
    assert mean_ci95([0.5]) == (0.5, 0.0, None)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 400), body=st.integers(4, 64), stride=st.integers(0, 60))
def test_windows_cover_every_token(n, body, stride):
    stride = min(stride, body - 1)
    spans = windows(n, body, stride)
    covered = torch.zeros(n, dtype=torch.long)
    for s, t in spans:
        assert 0 <= s < t <= n and t - s <= body
        covered[s:t] += 1
    assert bool((covered >= 1).all()) and spans[-1][1] == n
    for (s1, t1), (s2, _) in zip(spans, spans[1:]):
        assert s2 > s1 and s2 <= t1  # consecutive, no gap


class _Tok:
    """A word-level stand-in for a tokenizers.Tokenizer: one id per character pair, word ids from words."""

    class Enc:
        def __init__(self, ids, word_ids):
            self.ids, self.word_ids = ids, word_ids

    def encode_batch(self, texts, is_pretokenized=False, add_special_tokens=False):
        out = []
        for t in texts:
            words = t if is_pretokenized else t.split()
            ids, wids = [], []
            for w, word in enumerate(words):
                pieces = max(1, (len(word) + 1) // 2) if word else 0
                ids += [10 + (hash(word) + k) % 50 for k in range(pieces)]
                wids += [w] * pieces
            out.append(self.Enc(ids, wids))
        return out


@settings(max_examples=100, deadline=None)
@given(lens=st.lists(st.integers(0, 9), min_size=1, max_size=60), max_len=st.integers(8, 24), stride=st.integers(0, 5))
def test_ner_windows_predict_every_word_exactly_once(lens, max_len, stride):
    words = ["x" * n for n in lens]
    ex = [{"tokens": words, "tags": list(range(len(words)))}]  # a unique tag per word: a misplaced read shows
    items, index = downstream.encode_tokens(_Tok(), ex, max_len, stride)
    at = index[0]["at"]
    assert len(at) == len(words)
    starts, pos0 = {}, 0  # where each word's first sub-token sits in the whole sequence
    for w, n in enumerate(lens):
        if n:
            starts[w] = pos0
        pos0 += max(1, (n + 1) // 2) if n else 0
    spans = windows(pos0, max_len - 2, stride)
    for w, a in enumerate(at):
        if lens[w] == 0:
            assert a is None  # a word with no token: predicted as "O" (counted in the metric)
            continue
        item, pos = a
        assert items[item]["labels"][pos] == w  # its first sub-token carries its own tag there
        assert len(items[item]["input_ids"]) <= max_len
        best = max(min(starts[w] - s, t - 1 - starts[w]) for s, t in spans if s <= starts[w] < t)
        s, t = spans[item]
        assert min(starts[w] - s, t - 1 - starts[w]) == best  # read from a window where it is most central


def test_long_texts_become_windows_averaged_back():
    ex = [{"text": " ".join(["abcd"] * 50), "label": 1}, {"text": "ab", "label": 0}]
    items = downstream.encode_examples(_Tok(), ex, max_seq_len=16, stride=4)
    docs = [it["doc"] for it in items]
    assert docs.count(0) > 1 and docs.count(1) == 1 and all(len(it["input_ids"]) <= 16 for it in items)


def test_lr_grid_is_chosen_on_validation_and_reported_on_test(cfg_factory, tmp_path, monkeypatch):
    spec = TASKS["chnsenticorp"]
    write_task(tmp_path, spec)
    # validation prefers lr 1e-4, test would prefer 3e-4: the protocol must report test at 1e-4
    scores = {1e-4: (0.8, 0.6), 3e-4: (0.7, 0.9)}

    def fake(f, spec, enc, state, names, splits, lr, seed, kw, run_factory=None, reported="test"):
        assert set(splits) == {"train", "validation", "test"}
        v, t = scores[lr]
        return {"validation": {"acc": v + seed / 100}, "test": {"acc": t + seed / 100}}

    monkeypatch.setattr(downstream.protocol, "finetune_one", fake)
    cfg = cfg_factory(f"paths.data_dir={tmp_path}", "downstream.tasks=[chnsenticorp]", "downstream.seeds=[0,1,2]",
                      "downstream.finetune.lr=[1e-4,3e-4]")
    metrics, report = downstream.run_downstream(downstream.Protocol.of(cfg.paths, cfg.data, cfg.downstream), _Tok(), {}, {}, {})
    assert report["chnsenticorp"]["best_lr"] == 1e-4 and report["chnsenticorp"]["reported_split"] == "test"
    assert metrics["downstream/chnsenticorp/acc"] == pytest.approx(0.61)
    assert metrics["downstream/chnsenticorp/seed_2/acc"] == pytest.approx(0.62)
    assert metrics["downstream/chnsenticorp/acc_ci95"] == pytest.approx(4.302653 * 0.01 / math.sqrt(3), rel=1e-4)


def test_without_labelled_test_validation_is_reported_and_never_used_for_selection(cfg_factory, tmp_path,
                                                                                     monkeypatch):
    write_task(tmp_path, TASKS["rte"], n=40)
    seen = []

    def fake(f, spec, enc, state, names, splits, lr, seed, kw, run_factory=None, reported="test"):
        seen.append({k: v["n"] for k, v in splits.items()})
        return {k: {"acc": 0.5 + lr} for k in splits if k != "train"}

    monkeypatch.setattr(downstream.protocol, "finetune_one", fake)
    cfg = cfg_factory(f"paths.data_dir={tmp_path}", "downstream.tasks=[rte]")
    metrics, report = downstream.run_downstream(downstream.Protocol.of(cfg.paths, cfg.data, cfg.downstream), _Tok(), {}, {}, {})
    assert report["rte"]["reported_split"] == "validation" and report["rte"]["selection_split"] is None
    assert seen[-1] == {"train": 40, "test": 40}  # no selection: the official validation split is only reported
    cfg = cfg_factory(f"paths.data_dir={tmp_path}", "downstream.tasks=[rte]", "downstream.finetune.lr=[0.1,0.2]")
    metrics, report = downstream.run_downstream(downstream.Protocol.of(cfg.paths, cfg.data, cfg.downstream), _Tok(), {}, {}, {})
    assert report["rte"]["selection_split"] == "train (held out)" and report["rte"]["best_lr"] == 0.2
    assert seen[-1] == {"train": 36, "validation": 4, "test": 40}  # selection on a part of train, not on validation
    assert metrics["downstream/rte/acc"] == pytest.approx(0.7)


QUICK = ["trainer.max_steps=5", "trainer.val_check_interval=5", "logger=none", "callbacks.checkpoint=false"]


def test_real_task_formats_end_to_end(cfg_factory, tmp_path):
    """A pair task, an NER task and a long-text task from local files, through a real (tiny) job; lr grid + early
    stopping on validation."""
    for name in ("rte", "conll2003", "imdb"):
        write_task(tmp_path, TASKS[name], n=40)
    out = tmp_path / "run"
    m = train(cfg_factory(f"paths.data_dir={tmp_path}", "downstream.tasks=[rte,conll2003,imdb]", *QUICK,
                          "downstream.seeds=[0,1]", "downstream.finetune.lr=[1e-4,1e-3]", "downstream.finetune.epochs=2",
                          "downstream.finetune.early_stopping_patience=1", "downstream.finetune.max_seq_len=8",
                          "downstream.finetune.stride=2", output_dir=out))
    for key in ("rte/acc", "conll2003/entity_f1", "conll2003/precision", "imdb/acc"):
        assert 0.0 <= m[f"downstream/{key}"] <= 1.0, key
        assert f"downstream/{key}_ci95" in m
    rec = json.loads((out / "results.json").read_text())["downstream"]
    assert rec["rte"]["reported_split"] == "validation" and rec["rte"]["selection_split"] == "train (held out)"
    assert rec["conll2003"]["reported_split"] == "test" and rec["conll2003"]["selection_split"] == "validation"
    assert rec["imdb"]["selection_split"] == "train (held out)" and set(rec["imdb"]["grid"]) == {"0.0001", "0.001"}
    assert rec["imdb"]["source"] == f"local:{tmp_path / 'imdb/cls'}" and rec["imdb"]["label_names"] == ["neg", "pos"]


@pytest.mark.parametrize("name,folder", [("bc5cdr", "medical/ner_bc5cdr"), ("ncbi_disease", "medical/ner_ncbi_disease")])
def test_biomedical_ner_needs_its_folder_before_any_work(name, folder, cfg_factory, tmp_path):
    """Issue 55: without the task's local files a job stops with one line naming the folder and the data dir keys,
    before building a tokenizer or training (the failure record only: no checkpoint)."""
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=rf"^task {name} needs local files in {tmp_path / folder} .*MLMLAB_DATA_DIR"):
        train(cfg_factory(f"paths.data_dir={tmp_path}", f"downstream.tasks=[{name}]", *QUICK, output_dir=out))
    assert json.loads((out / "results.json").read_text())["status"] == "failed" and not (out / "checkpoints").exists()


@pytest.mark.slow
def test_biomedical_ner_fine_tunes_from_a_fixture(cfg_factory, tmp_path):
    """BC5CDR's two entity types (IOB2) through a tiny job: entity F1 against random init, label names in the record."""
    folder = tmp_path / TASKS["bc5cdr"].local
    folder.mkdir(parents=True)
    words = "aspirin induced renal failure in rats treated with cisplatin".split()
    tags = ["B-Chemical", "O", "B-Disease", "I-Disease", "O", "O", "O", "O", "B-Chemical"]
    for split in ("train", "validation", "test"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"tokens": words[i % 3:], "ner_tags": tags[i % 3:]})
                                                       + "\n" for i in range(30)))
    out = tmp_path / "run"
    m = train(cfg_factory(f"paths.data_dir={tmp_path}", "downstream.tasks=[bc5cdr]", *QUICK, "downstream.seeds=[0]",
                          "downstream.finetune.lr=[1e-3]", "downstream.finetune.epochs=1", "downstream.random_init_baseline=true",
                          "downstream.finetune.max_seq_len=16", "downstream.finetune.stride=4", output_dir=out))
    assert 0.0 <= m["downstream/bc5cdr/entity_f1"] <= 1.0 and "gain/bc5cdr/entity_f1" in m
    rec = json.loads((out / "results.json").read_text())["downstream"]["bc5cdr"]
    assert rec["label_names"] == ["B-Chemical", "B-Disease", "I-Disease", "O"]  # the sorted tags of train
    assert rec["reported_split"] == "test" and rec["source"] == f"local:{folder}"


def test_bad_task_data_is_reported_before_training(cfg_factory, tmp_path):
    spec = TASKS["chnsenticorp"]
    write_task(tmp_path, spec)
    folder = tmp_path / spec.local
    cfg = cfg_factory(f"paths.data_dir={tmp_path}", "downstream.tasks=[chnsenticorp]")

    def load():
        TASKS["chnsenticorp"]._load(TaskSource.of(cfg.paths, cfg.data, cfg.downstream))

    (folder / "validation.jsonl").write_text(json.dumps({"text": "x", "label": 7}) + "\n")
    with pytest.raises(ConfigError, match=r"label id 7; the task's labels are \['negative', 'positive'\]"):
        load()
    med = TASKS["medical"]
    write_task(tmp_path, med)
    (tmp_path / med.local / "test.jsonl").write_text(json.dumps({"text": "x", "label": "neoplasms"}) + "\n")
    with pytest.raises(ConfigError, match="label 'neoplasms', which is not in the train split's label set"):
        med._load(TaskSource.of(cfg.paths, cfg.data, cfg.downstream))
    (folder / "validation.jsonl").write_text(json.dumps({"review": "x", "label": 0}) + "\n")
    with pytest.raises(ConfigError, match=r"lacks column\(s\) \['text'\]"):
        load()
    (folder / "validation.jsonl").write_text("")
    with pytest.raises(ConfigError, match="the validation split is empty"):
        load()
    (folder / "validation.jsonl").write_bytes(b'{"text": "ok", "label": 0}\n{"text": "\xff\xfe", "label": 1}\n')
    with pytest.raises(ConfigError, match=r"validation.jsonl, line 2: not valid UTF-8"):
        read_jsonl(folder / "validation.jsonl")
    write_task(tmp_path, spec)
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": "x", "label": 1}) + "\n" for _ in range(5)))
    with pytest.raises(ConfigError, match="single label"):
        load()
    (folder / "test.jsonl").unlink()
    with pytest.raises(ConfigError, match="test.jsonl not found"):
        validate(cfg)


@pytest.mark.parametrize("override,message", [
    ("downstream.finetune.lr=[]", "must be a learning rate > 0 or a non-empty list"),
    ("downstream.finetune.lr=-1", "must be a learning rate > 0"),
    ("downstream.finetune.stride=100", "downstream.finetune.stride=100 must be in"),
    ("downstream.seeds=[1,1]", "has duplicates"),
    ("downstream.finetune.early_stopping_patience=0", "must be >= 1 or null"),
])
def test_bad_protocol_values(override, message, cfg_factory):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        validate(cfg_factory(override))


def test_early_stopping_restores_the_best_weights_in_train_mode(monkeypatch):
    from mlmlab.lit.finetune import FinetuneModule

    enc = {"vocab_size": 64, "hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32,
           "max_position_embeddings": 32}
    module = FinetuneModule(enc, 2, 1e-3, 0.0, 0.0, 10).train()
    scores = iter([0.5, 0.9, 0.7, 0.6])
    monkeypatch.setattr(downstream.finetuning, "evaluate", lambda *a: {"acc": next(scores)})
    cb = downstream.BestOnValidation(TASKS["sst2"], {}, ["a", "b"], 8, patience=2)

    class T:
        should_stop = False
        logger = None

    weights = []
    for epoch in range(4):
        with torch.no_grad():
            module.model.head.out_proj.weight.fill_(float(epoch))
        weights.append(epoch)
        cb.on_train_epoch_end(T, module)
        if T.should_stop:
            break
    assert T.should_stop and epoch == 3 and cb.history == [0.5, 0.9, 0.7, 0.6]
    cb.on_train_end(T, module)
    assert bool((module.model.head.out_proj.weight == 1.0).all())  # epoch 1's weights: the best score
    assert module.training


def test_a_task_of_your_own_from_a_yaml_file(cfg_factory, tmp_path):
    """downstream.task_dirs: a folder of <task>.yaml files in mlmlab/tasks/'s format; the task trains like a built-in one."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "my_reviews.yaml").write_text("kind: single\ncolumns: [review]\nlabel_column: stars\nlabels: [low, high]\n"
                                           "metrics: [f1, acc]\nlocal: reviews\nsplits: [train, test]\n")
    data = tmp_path / "data" / "reviews"
    data.mkdir(parents=True)
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text("".join(
            json.dumps({"review": f"{WORDS[i % 10]} {WORDS[(i + 3) % 10]}", "stars": ["low", "high"][i % 2]}) + "\n"
            for i in range(30)))
    out = tmp_path / "run"
    m = train(cfg_factory(f"paths.data_dir={tmp_path / 'data'}", f"downstream.task_dirs=[{tasks}]",
                          "downstream.tasks=[my_reviews]", *QUICK, "downstream.seeds=[0]", output_dir=out))
    assert 0.0 <= m["downstream/my_reviews/f1"] <= 1.0 and "downstream/my_reviews/acc" in m
    rec = json.loads((out / "results.json").read_text())["downstream"]["my_reviews"]
    assert rec["label_names"] == ["low", "high"] and rec["reported_split"] == "test"
    with pytest.raises(ConfigError, match="downstream.tasks\\[0\\]='my_reviews' is not known"):
        validate(cfg_factory("downstream.tasks=[my_reviews]"))  # without task_dirs it is not registered


@pytest.mark.parametrize("text, message", [
    ("kind: single\ncolumns: [a]\nlocal: x\ncolour: red\n", r"unknown key\(s\) \['colour'\]"),
    ("kind: triple\ncolumns: [a]\nlocal: x\n", "kind='triple' is not known; allowed: single, pair, token"),
    ("kind: pair\ncolumns: [a]\nlocal: x\n", r"kind=pair takes 2 column\(s\)"),
    ("kind: single\ncolumns: [a]\nmetrics: [acc]\nmain_metric: f1\nlocal: x\n", "main_metric='f1' must be one of"),
    ("kind: single\ncolumns: [a]\nmetrics: [bleu]\nlocal: x\n", "metric 'bleu' is not known"),
    ("kind: single\ncolumns: [a]\n", "set local .* or hub"),
    ("kind: single\ncolumns: [a]\nlocal: x\nsplits: [train]\n", r"splits=\[.train.\] must hold train and at least"),
    ("columns: [a]\nlocal: x\n", "kind is required"),
    ("kind: pair\ncolumns: [a, b]\nlocal: x\nphrases: true\n", "phrases=True must be true or false, and true only for"),
])
def test_bad_task_files_name_the_file_and_key(text, message, cfg_factory, tmp_path):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError, match=f"task file .*bad.yaml: {message}"):
        validate(cfg_factory(f"downstream.task_dirs=[{tmp_path}]", "downstream.tasks=[bad]"))


def test_registered_names_cannot_be_shadowed(cfg_factory, tmp_path):
    (tmp_path / "sst2.yaml").write_text("kind: single\ncolumns: [a]\nlocal: x\n")
    with pytest.raises(ConfigError, match="task 'sst2' .* is already registered"):
        validate(cfg_factory(f"downstream.task_dirs=[{tmp_path}]", "downstream.tasks=[]"))


def test_ner_linear_probe_per_word(cfg_factory, tmp_path):
    """downstream.protocol=probe on a token task: a per-word probe scored by entity F1 (a fixture where the first word
    of every sentence is B-PER, so position alone separates the tags)."""
    spec = TASKS["conll2003"]
    write_task(tmp_path, spec, n=40)
    out = tmp_path / "run"
    m = train(cfg_factory(f"paths.data_dir={tmp_path}", "downstream.tasks=[conll2003]", "downstream.protocol=both",
                          "logger=none", "downstream.random_init_baseline=true", output_dir=out))
    assert {"probe/conll2003/entity_f1", "random_init_probe/conll2003/entity_f1", "gain_probe/conll2003/entity_f1",
            "downstream/conll2003/entity_f1"} <= set(m)
    assert 0 <= m["probe/conll2003/entity_f1"] <= 1
    preds = json.loads((out / "predictions" / "pretrained.json").read_text())["conll2003"]
    assert len(preds["probe"]) == len(preds["truth"]) and all(len(a) == len(b) for a, b in zip(preds["probe"],
                                                                                              preds["truth"]))
