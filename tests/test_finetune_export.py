"""``mlmlab.finetune`` on an explicit checkpoint and ``mlmlab.export`` to a Hugging Face directory (round-trip parity)."""

import json

import pytest
import torch
from conftest import run_cli

from mlmlab.analysis import read_wandb_offline, wandb_run_dirs
from mlmlab.checkpoint import checkpoint_tokenizer, encoder_state, load_checkpoint
from mlmlab.config import ConfigError
from mlmlab.export import export
from mlmlab.models.encoder import BertForMLM, Encoder, EncoderConfig

# the downstream settings of debug=fast, spelled out for the finetune entry point (whose defaults are downstream=real)
FAST_DOWNSTREAM = ["downstream=builtin", "downstream.seeds=[0]", "downstream.builtin_n_train=64",
                   "downstream.builtin_n_test=64", "downstream.finetune.epochs=1", "downstream.finetune.max_seq_len=48"]


def run_module(module: str, args: list[str], cache):
    return run_cli(args, cache, module=module)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, cache_dir):
    runs = {}
    for obj in ("mlm", "electra"):
        out = tmp_path_factory.mktemp(f"pre_{obj}")
        p = run_cli(["debug=fast", f"objective={obj}", f"hydra.run.dir={out}", "logger.wandb.group=pre"], cache_dir)
        assert p.returncode == 0, p.stderr[-3000:]
        runs[obj] = out
    return runs


@pytest.mark.parametrize("obj", ["mlm", pytest.param("electra", marks=pytest.mark.slow)])  # electra: in -m slow (suite time)
def test_finetune_a_checkpoint_reproduces_the_jobs_own_downstream(obj, pretrained, tmp_path, cache_dir):
    pre = pretrained[obj]
    out = tmp_path / "ft"
    p = run_module("mlmlab.finetune", [f"checkpoint={pre}/checkpoints/last.ckpt", *FAST_DOWNSTREAM,
                                       f"hydra.run.dir={out}"], cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    ft = json.loads((out / "results.json").read_text())
    job = json.loads((pre / "results.json").read_text())
    assert ft["status"] == "ok" and ft["source_checkpoint"]["objective"] == obj
    for k in ("downstream/builtin_sentiment/acc", "downstream/builtin_topic/acc", "downstream/score"):
        assert ft["metrics"][k] == job["metrics"][k], k  # same encoder, same protocol: the same numbers
    (w,) = wandb_run_dirs(out)
    run = read_wandb_offline(w)["run"]
    assert run["job_type"] == "finetune" and run["group"] == "pre"  # in its pretraining run's group
    assert run["name"].startswith(f"ft:{pre.name}:")


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_finetune_task_shorthand_and_bad_input(pretrained, tmp_path, cache_dir):
    ckpt = pretrained["mlm"] / "checkpoints" / "last.ckpt"
    p = run_module("mlmlab.finetune", [f"checkpoint={ckpt}", "task=nope", f"hydra.run.dir={tmp_path / 'a'}"], cache_dir)
    assert p.returncode != 0 and "task='nope' is not known" in p.stderr  # the key the user gave (issue 54 item 15)
    p = run_module("mlmlab.finetune", [f"checkpoint={tmp_path}/missing.ckpt", "task=builtin_topic",
                                       f"hydra.run.dir={tmp_path / 'b'}"], cache_dir)
    assert p.returncode != 0 and "missing.ckpt' does not exist" in p.stderr
    sweep = tmp_path / "sweep"  # a multirun of fine-tunings ends with the same summary as a pretraining sweep
    p = run_module("mlmlab.finetune", ["-m", f"checkpoint={ckpt}", "task=nope,builtin_topic", *FAST_DOWNSTREAM,
                                       f"hydra.sweep.dir={sweep}"], cache_dir)
    assert p.returncode != 0 and "multirun summary: 1 of 2 jobs ok, 1 failed" in p.stdout + p.stderr
    assert json.loads((sweep / "summary.json").read_text())["failed"][0]["status"] == "failed"
    assert not list(sweep.rglob(".running.json"))
    not_ckpt = tmp_path / "x.ckpt"
    not_ckpt.write_text("hello")
    with pytest.raises(ConfigError, match="could not be read as a checkpoint"):
        load_checkpoint(str(not_ckpt))
    info, _ = load_checkpoint(str(ckpt))
    info["encoder_config"] = {**info["encoder_config"], "vocab_size": info["encoder_config"]["vocab_size"] + 1}
    with pytest.raises(ConfigError, match="tokenizer and checkpoint do not match"):
        checkpoint_tokenizer(info)


transformers = pytest.importorskip("transformers")


def test_export_round_trip_gives_the_same_logits(pretrained, tmp_path):
    ckpt = pretrained["mlm"] / "checkpoints" / "last.ckpt"
    out = export(str(ckpt), str(tmp_path / "hf"))
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    info, state = load_checkpoint(str(ckpt))
    ours = BertForMLM(EncoderConfig(**info["encoder_config"])).eval()
    ours.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})
    tok = checkpoint_tokenizer(info)
    text = ["the demaikru sir was trabi depal .", "i plas this kurir"]
    enc = hf_tok(text, padding=True, return_tensors="pt")
    # exactly what mlmlab feeds the model: [CLS] text [SEP] (and [CLS] a [SEP] b [SEP] with token types 0/1 for pairs)
    from mlmlab.downstream import encode_examples

    ours_items = encode_examples(tok, [{"text": t, "label": 0} for t in text], 64)
    for i, item in enumerate(ours_items):
        n = len(item["input_ids"])
        assert enc["input_ids"][i].tolist()[:n] == item["input_ids"] and enc["attention_mask"][i].sum() == n
    pair = encode_examples(tok, [{"text": text[0], "text_b": text[1], "label": 0}], 64)[0]
    hp = hf_tok(text[0], text[1])
    assert hp["input_ids"] == pair["input_ids"] and hp["token_type_ids"] == pair["token_type_ids"]
    # a fill-mask pipeline reads the input the model was trained on: its top token is our model's argmax there
    fill = transformers.pipeline("fill-mask", model=hf, tokenizer=hf_tok)
    masked = "the demaikru sir was [MASK] depal ."
    ids = [2] + tok.encode(masked, add_special_tokens=False).ids + [3]
    with torch.no_grad():
        want = int(ours(torch.tensor([ids]))[0, ids.index(4)].argmax())
    assert fill(masked)[0]["token"] == want
    with torch.no_grad():
        a = ours(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        b = hf(**enc).logits
    keep = enc["attention_mask"].bool()
    torch.testing.assert_close(a[keep], b[keep], atol=1e-4, rtol=0)
    assert hf.cls.predictions.decoder.weight.data_ptr() == hf.bert.embeddings.word_embeddings.weight.data_ptr()


def test_export_of_an_electra_checkpoint_is_its_discriminator(pretrained, tmp_path):
    ckpt = pretrained["electra"] / "checkpoints" / "last.ckpt"
    out = export(str(ckpt), str(tmp_path / "hf"))
    hf = transformers.AutoModel.from_pretrained(out).eval()
    info, state = load_checkpoint(str(ckpt))
    ours = Encoder(EncoderConfig(**info["encoder_config"])).eval()
    ours.load_state_dict(encoder_state(info, state))
    ids = torch.randint(5, info["encoder_config"]["vocab_size"], (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(input_ids=ids).last_hidden_state, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def pretrained_pre(tmp_path_factory, cache_dir):
    """A pre-LN MLM run (model.norm=pre), exported as RoBERTa-PreLayerNorm."""
    out = tmp_path_factory.mktemp("pre_mlm_preln")
    p = run_cli(["debug=fast", "objective=mlm", "model.norm=pre", f"hydra.run.dir={out}", "logger.wandb.group=pre"],
                cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    return out / "checkpoints" / "last.ckpt"


def test_export_of_a_pre_ln_checkpoint_gives_the_same_logits(pretrained_pre, tmp_path):
    out = export(str(pretrained_pre), str(tmp_path / "hf"))
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    assert type(hf) is transformers.RobertaPreLayerNormForMaskedLM
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    info, state = load_checkpoint(str(pretrained_pre))
    assert info["encoder_config"]["norm"] == "pre"
    ours = BertForMLM(EncoderConfig(**info["encoder_config"])).eval()
    ours.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})
    text = ["the demaikru sir was trabi depal .", "i plas this kurir"]
    enc = hf_tok(text, padding=True, return_tensors="pt")
    assert enc["attention_mask"][1, -1] == 0 and enc["input_ids"][1, -1] == 0  # right-padded with [PAD] = 0
    with torch.no_grad():
        a = ours(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        b = hf(**enc).logits
    keep = enc["attention_mask"].bool()
    torch.testing.assert_close(a[keep], b[keep], atol=1e-4, rtol=0)
    assert hf.lm_head.decoder.weight.data_ptr() == hf.roberta_prelayernorm.embeddings.word_embeddings.weight.data_ptr()


@pytest.mark.parametrize("causal", [False, True])
def test_export_of_a_pre_ln_encoder(pretrained_pre, causal, tmp_path):
    """The non-MLM path (ELECTRA discriminator, CLM encoder) for norm=pre: the pre-LN checkpoint relabelled as such an
    objective (the export reads only the objective, the encoder's key and its config) becomes a RobertaPreLayerNormModel."""
    ckpt = torch.load(pretrained_pre, map_location="cpu", weights_only=False)
    info = ckpt["mlmlab"]
    info.update(objective="clm" if causal else "electra", encoder_config={**info["encoder_config"], "causal": causal})
    torch.save(ckpt, tmp_path / "relabelled.ckpt")
    out = export(str(tmp_path / "relabelled.ckpt"), str(tmp_path / "hf"))
    hf = transformers.AutoModel.from_pretrained(out).eval()
    assert type(hf) is transformers.RobertaPreLayerNormModel and hf.config.is_decoder == causal
    ours = Encoder(EncoderConfig(**info["encoder_config"])).eval()
    ours.load_state_dict(encoder_state(info, ckpt["state_dict"]))
    ids = torch.randint(5, info["encoder_config"]["vocab_size"], (3, 20), generator=torch.Generator().manual_seed(0))
    am = torch.ones_like(ids)
    am[1, 14:] = 0
    ids = ids.masked_fill(am == 0, 0)
    with torch.no_grad():
        a, b = ours(ids, am), hf(input_ids=ids, attention_mask=am).last_hidden_state
    keep = am.bool()
    torch.testing.assert_close(a[keep], b[keep], atol=1e-4, rtol=0)


def test_export_refuses_an_unknown_norm(pretrained_pre, tmp_path):
    ckpt = torch.load(pretrained_pre, map_location="cpu", weights_only=False)
    ckpt["mlmlab"]["encoder_config"]["norm"] = "sideways"
    torch.save(ckpt, tmp_path / "x.ckpt")
    with pytest.raises(ConfigError, match=r"model\.norm='sideways'.*allowed: post, pre"):
        export(str(tmp_path / "x.ckpt"), str(tmp_path / "hf"))


def test_export_cli_usage(tmp_path):
    from mlmlab.export import main

    assert main(["checkpoint=x"]) == 2
    assert main([f"checkpoint={tmp_path}/none.ckpt", f"out={tmp_path}/o"]) == 1


def test_export_to_a_folder_that_cannot_be_written_names_out(pretrained, tmp_path, capsys):
    from mlmlab.export import main

    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the folder should go: mkdir fails for any user (root included)
    ckpt = pretrained["mlm"] / "checkpoints" / "last.ckpt"
    assert main([f"checkpoint={ckpt}", f"out={blocker}/hf"]) == 1
    err = capsys.readouterr().err
    assert f"out='{blocker}/hf' cannot be written" in err and "Traceback" not in err
