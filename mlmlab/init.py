"""``init.*``: start pretraining from an existing encoder instead of a random init (continued, domain-adaptive
pretraining: Gururangan et al. 2020, FinBERT, BioBERT).

Where the start comes from (one of):

- ``init.checkpoint=<path>``: an mlmlab pretraining checkpoint (a ``.ckpt`` file, or a run dir holding
  ``checkpoints/last.ckpt``), or a local transformers directory of a BERT (``BertForMaskedLM``) or
  RoBERTa-PreLayerNorm masked LM (what ``python -m mlmlab.export`` writes), or a hub name (``org/model``) where the hub
  is reachable (downloaded with ``huggingface_hub.snapshot_download``);
- ``init.pretrain=[<overrides>]``: the checkpoint of ``python -m mlmlab.train <overrides>``, run once (without
  fine-tuning or W&B) and cached under ``paths.cache_dir/init/<hash of the overrides>``, so every arm of a sweep and
  every later sweep continues the same encoder (``experiment=dapt_finance`` uses this).

The start brings its tokenizer (the job tokenizes its corpus with it; a ``tokenizer.*`` override that contradicts it is
an error) and its shape (``model.*`` is taken from it; a ``model.*`` override that contradicts it is an error). The
encoder weights load into every objective (ELECTRA: the discriminator, whose embeddings its generator shares); an MLM
start also brings its LM head into ``objective=mlm`` / ``none``. ``results.json`` names the start (``init``: kind, path,
sha256 of its weights file). Its special tokens must sit at mlmlab's ids (``[PAD] [UNK] [CLS] [SEP] [MASK]`` = 0..4),
as in every mlmlab tokenizer and export; another layout is a one-line error.

Written here rather than through ``transformers.AutoModel`` because the job's own encoder is what trains; transformers
only reads the directory (its config and weights), and the name mapping is :mod:`mlmlab.export`'s, inverted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mlmlab.errors import ConfigError

log = logging.getLogger(__name__)

# model.* keys that are the encoder's shape: taken from the start (the rest -- dropout, grad_checkpointing -- are how
# this job trains it)
SHAPE_KEYS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings",
              "type_vocab_size", "layer_norm_eps", "norm", "position")
INIT_VERSION = 1


@dataclass
class InitConfig:
    """``init.*``: where the encoder starts (null: a random init of ``seed``)."""

    checkpoint: str | None = None  # an mlmlab .ckpt / run dir, a local transformers dir, or a hub name
    # overrides of `python -m mlmlab.train` whose checkpoint is the start, made once and cached (the presets use it)
    pretrain: list[str] | None = None


@dataclass
class Start:
    """An encoder to start from: its tokenizer, shape, weights (ours: ``bert.*``, and ``cls.*`` when it has an MLM
    head) and what identifies it (``record``)."""

    tok: Any
    encoder_cfg: dict
    state: dict
    record: dict
    tokenizer_cfg: dict = field(default_factory=dict)  # what is known of tokenizer.* (vocab_size, lowercase)

    @property
    def encoder_state(self) -> dict:
        return {k[5:]: v for k, v in self.state.items() if k.startswith("bert.")}

    @property
    def head_state(self) -> dict:
        return {k[4:]: v for k, v in self.state.items() if k.startswith("cls.")}

    def model(self):
        """The start as a model (the MLM head random where it has none): the language model of the "start" row."""
        from mlmlab.models.encoder import BertForMLM, EncoderConfig

        m = BertForMLM(EncoderConfig(**{**self.encoder_cfg, "causal": False}))
        m.bert.load_state_dict(self.encoder_state)
        if self.head_state:
            m.cls.load_state_dict(self.head_state, strict=False)
        return m.eval()


def is_set(init) -> bool:
    return init is not None and (init.checkpoint is not None or bool(init.pretrain))


def check(init) -> None:
    """The rules of ``init.*`` that need no file: one source at most, overrides as strings."""
    if init is None:
        return
    if init.checkpoint is not None and init.pretrain:
        raise ConfigError(f"set init.checkpoint or init.pretrain, not both (init.checkpoint={init.checkpoint!r}, "
                          f"init.pretrain={list(init.pretrain)})")
    if init.checkpoint is not None and not str(init.checkpoint).strip():
        raise ConfigError("init.checkpoint='' is empty; give a checkpoint, a transformers directory or a hub name, or "
                          "null (random init)")
    if init.pretrain is not None:
        bad = [o for o in init.pretrain if not isinstance(o, str) or "=" not in o]
        if bad or not init.pretrain:
            raise ConfigError(f"init.pretrain={list(init.pretrain)} must be a non-empty list of key=value overrides "
                              "of python -m mlmlab.train (e.g. [experiment=real_en_fast,seed=0])")
        for o in init.pretrain:
            if o.split("=", 1)[0].lstrip("+~").startswith(("init.", "paths.output_dir", "hydra")):
                raise ConfigError(f"init.pretrain: {o!r} is set by the start's own job; allowed: any other override")


# ------------------------------------------------------------------------------------------------------- reading


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def locate(spec: str, key: str = "init.checkpoint") -> tuple[str, Path]:
    """``(kind, path)`` of a start: ``mlmlab`` (a .ckpt file), ``hf`` (a transformers directory); a hub name is
    downloaded first. ConfigError naming ``key`` when it is none of them."""
    p = Path(str(spec)).expanduser()
    if p.is_dir():
        if (p / "checkpoints" / "last.ckpt").is_file():
            return "mlmlab", p / "checkpoints" / "last.ckpt"
        if (p / "config.json").is_file():
            return "hf", p
        raise ConfigError(f"{key}={spec!r} is a folder with neither checkpoints/last.ckpt (an mlmlab run) nor "
                          "config.json (a transformers directory)")
    if p.is_file():
        return "mlmlab", p
    if HUB_NAME.match(str(spec)) and not str(spec).startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            return "hf", Path(snapshot_download(str(spec), allow_patterns=["*.json", "*.safetensors", "*.txt"]))
        except Exception as e:
            raise ConfigError(f"{key}={spec!r} is not a local file or folder, and the hub could not give it "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:160]})") from None
    raise ConfigError(f"{key}={spec!r} does not exist; give an mlmlab checkpoint (.ckpt or run dir), a transformers "
                      "directory, or a hub name (org/model)")


def check_special_ids(tok, key: str) -> None:
    from mlmlab.data.tokenizer import SPECIAL_TOKENS

    wrong = [(s, tok.token_to_id(s)) for i, s in enumerate(SPECIAL_TOKENS) if tok.token_to_id(s) != i]
    if wrong:
        raise ConfigError(f"{key}: the tokenizer's special tokens are not at mlmlab's ids ({', '.join(f'{s}={i}' for s, i in wrong)}; "
                          f"needed: {', '.join(f'{s}={i}' for i, s in enumerate(SPECIAL_TOKENS))}); allowed: an mlmlab "
                          "checkpoint or its export (python -m mlmlab.export)")


def read_mlmlab(path: Path, key: str) -> Start:
    from mlmlab.checkpoint import checkpoint_tokenizer, load_checkpoint

    info, sd = load_checkpoint(str(path), key)
    tok = checkpoint_tokenizer(info, key)
    check_special_ids(tok, key)
    enc = dict(info["encoder_config"])
    prefix = info["encoder_key"] + "."
    state = {"bert." + k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    if info["objective"] in ("mlm", "none"):  # the MLM head beside the encoder ("model.cls.*")
        head = info["encoder_key"].rsplit(".", 1)[0] + ".cls."
        state.update({"cls." + k[len(head):]: v for k, v in sd.items() if k.startswith(head)})
    tcfg = (info.get("config") or {}).get("tokenizer") or {}
    step, total = info.get("global_step"), info.get("max_steps")
    run = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    status = None
    if (run / "results.json").is_file():
        try:
            status = json.loads((run / "results.json").read_text()).get("status")
        except (OSError, ValueError):
            status = "unreadable"
    if status not in (None, "ok") or (status is None and step is not None and total is not None and step < total):
        raise ConfigError(f"{key}={str(path)!r} is the checkpoint of an unfinished run (status {status!r} in "
                          f"{run / 'results.json'}, step {step} of {total}); a start is a finished run: resume it "
                          f"(python -m mlmlab.train ... resume={run}) and start from its final checkpoint")
    return Start(tok, enc, state, {"kind": "mlmlab", "objective": info["objective"], "step": step,
                                   "max_steps": total, "run_status": status},
                 {k: tcfg[k] for k in ("name", "vocab_size", "lowercase", "min_frequency") if k in tcfg})


def read_hf(path: Path, key: str) -> Start:
    """A transformers directory of ``BertForMaskedLM`` / ``RobertaPreLayerNormForMaskedLM`` (or their headless
    models): its config -> our EncoderConfig, its weights -> our names (:func:`mlmlab.export.to_prelayernorm`
    inverted), its ``tokenizer.json`` without the post-processor (mlmlab adds [CLS]/[SEP] itself)."""
    from tokenizers import Tokenizer

    from mlmlab.data.tokenizer import PAD
    from mlmlab.export import PRE_LN_NAMES

    cfg = json.loads((path / "config.json").read_text())
    mt = cfg.get("model_type")
    if mt not in ("bert", "roberta-prelayernorm"):
        raise ConfigError(f"{key}={str(path)!r}: model_type={mt!r} cannot be loaded; allowed: bert, "
                          "roberta-prelayernorm (a BERT- or RoBERTa-PreLayerNorm-style masked LM)")
    if cfg.get("hidden_act", "gelu") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"{key}={str(path)!r}: hidden_act={cfg.get('hidden_act')!r}, position_embedding_type="
                          f"{cfg.get('position_embedding_type')!r}; allowed: gelu, absolute (mlmlab's encoder)")
    pre = mt == "roberta-prelayernorm"
    positions = cfg["max_position_embeddings"] - (cfg.get("pad_token_id", PAD) + 1 if pre else 0)
    enc = {"vocab_size": cfg["vocab_size"], "hidden_size": cfg["hidden_size"], "num_layers": cfg["num_hidden_layers"],
           "num_heads": cfg["num_attention_heads"], "intermediate_size": cfg["intermediate_size"],
           "max_position_embeddings": positions, "type_vocab_size": cfg.get("type_vocab_size", 2),
           "dropout": cfg.get("hidden_dropout_prob", 0.1), "attention_dropout": cfg.get("attention_probs_dropout_prob", 0.1),
           "layer_norm_eps": cfg.get("layer_norm_eps", 1e-12), "initializer_range": cfg.get("initializer_range", 0.02),
           "norm": "pre" if pre else "post", "position": "learned", "causal": False, "grad_checkpointing": False}
    weights = _hf_weights(path, key)
    state = {}
    for k, v in weights.items():
        if pre:
            k = next((frm + k[len(to):] for frm, to in PRE_LN_NAMES if k.startswith(to)), k)
            if k.endswith("embeddings.position_embeddings.weight"):
                v = v[cfg.get("pad_token_id", PAD) + 1:]
        if not k.startswith(("bert.", "cls.")):  # a headless model (AutoModel): the encoder's names without bert.
            k = "bert." + k
        if k.endswith("position_ids") or ".pooler." in k:
            continue
        state[k] = v
    if "cls.predictions.bias" in state:  # one parameter under two names (BertLMPredictionHead): saved once
        state.setdefault("cls.predictions.decoder.bias", state["cls.predictions.bias"])
    tfile = path / "tokenizer.json"
    if not tfile.is_file():
        raise ConfigError(f"{key}={str(path)!r} has no tokenizer.json (a fast tokenizer's file); mlmlab tokenizes "
                          "with the start's own tokenizer")
    tok = Tokenizer.from_file(str(tfile))
    tok.post_processor = None  # mlmlab writes [CLS] ... [SEP] itself (blocks, fine-tuning inputs)
    tok.no_padding()
    tok.no_truncation()
    check_special_ids(tok, key)
    if tok.get_vocab_size() != enc["vocab_size"]:
        raise ConfigError(f"{key}={str(path)!r}: the tokenizer has {tok.get_vocab_size()} tokens but the embedding "
                          f"matrix {enc['vocab_size']} rows")
    lower = None
    norm = json.loads(tok.to_str()).get("normalizer") or {}
    if norm.get("type") == "BertNormalizer":
        lower = bool(norm.get("lowercase"))
    return Start(tok, enc, state, {"kind": "hf", "model_type": mt},
                 {"name": "wordpiece", "vocab_size": tok.get_vocab_size(), **({"lowercase": lower} if lower is not None
                                                                            else {})})


def _hf_weights(path: Path, key: str) -> dict:
    st = sorted(path.glob("*.safetensors"))
    if st:
        from safetensors.torch import load_file

        out: dict = {}
        for f in st:
            out.update(load_file(str(f)))
        return out
    pt = path / "pytorch_model.bin"
    if pt.is_file():
        return torch.load(pt, map_location="cpu", weights_only=True)
    raise ConfigError(f"{key}={str(path)!r} has no weights (model.safetensors or pytorch_model.bin)")


def read(kind: str, path: Path, key: str = "init.checkpoint") -> Start:
    start = read_mlmlab(path, key) if kind == "mlmlab" else read_hf(path, key)
    weights = path if path.is_file() else next(iter(sorted(path.glob("*.safetensors"))), path / "pytorch_model.bin")
    start.record.update(path=str(path.resolve()), sha256=sha256_file(weights), weights_file=weights.name)
    _check_loadable(start, key)
    return start


def _check_loadable(start: Start, key: str) -> None:
    """The weights fill mlmlab's encoder of that shape exactly (and its MLM head, when there is one)."""
    from mlmlab.models.encoder import BertForMLM, EncoderConfig

    try:
        m = BertForMLM(EncoderConfig(**{**start.encoder_cfg, "causal": False}))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{key}: the start's shape is not an mlmlab encoder ({e})") from None
    missing, unexpected = m.bert.load_state_dict(start.encoder_state, strict=False)
    if missing or unexpected:
        raise ConfigError(f"{key}: the weights do not fill mlmlab's encoder (missing {missing[:4]}, unexpected "
                          f"{unexpected[:4]})")
    if start.head_state:
        missing, unexpected = m.cls.load_state_dict(start.head_state, strict=False)
        missing = [k for k in missing if k != "predictions.decoder.weight"]  # tied to the word embeddings
        if missing or unexpected:
            raise ConfigError(f"{key}: the MLM head's weights do not fit (missing {missing[:4]}, unexpected "
                              f"{unexpected[:4]})")


# ------------------------------------------------------------------------------------------- the start of a preset


def pretrain_key(overrides: list[str]) -> dict:
    """The start's cache key: its overrides (in order: a later override wins) and this module's format version. The
    weights' sha256 in every results.json says which encoder a run continued, whatever made it."""
    return {"kind": "init_pretrain", "overrides": list(overrides), "version": INIT_VERSION}


def child_error(stderr: str) -> str:
    """The start's job's own error from its stderr: its ``error: ...`` line without the record's path (a temporary
    folder, deleted), else its last line that is not Hydra's pointer to HYDRA_FULL_ERROR."""
    lines = [x.strip() for x in stderr.strip().splitlines() if x.strip()]
    mine = [x for x in lines if x.startswith("error: ")]
    if mine:
        return re.sub(r" \(record: [^)]*\)$", "", mine[-1][len("error: "):])
    rest = [x for x in lines if "HYDRA_FULL_ERROR" not in x and not x.startswith("See https://hydra.cc")]
    return rest[-1] if rest else "(no output)"


def pretrained_start(overrides: list[str], cache_dir: str, data_dir: str | None) -> Path:
    """``init.pretrain``: the checkpoint of ``python -m mlmlab.train <overrides>`` (no fine-tuning, no W&B, one
    pretraining), made once under a file lock and cached (``<cache_dir>/init/<hash>/last.ckpt``, content-hashed like
    every cache entry)."""
    import os
    import subprocess
    import sys
    import tempfile

    from mlmlab.data.cache import cached_file

    def build(tmp: Path) -> None:
        with tempfile.TemporaryDirectory(dir=tmp.parent, prefix=".run") as run:
            # hydra.run.dir: the start's job writes only in this temporary folder (no outputs/<date>/<time> left in
            # the user's folder); HYDRA_FULL_ERROR=0: its error is its own one line, kept (the folder is deleted)
            # the cache dir expanded: Hydra's override grammar refuses a value that starts with "~"
            cmd = [sys.executable, "-m", "mlmlab.train", *overrides, "downstream.tasks=[]",
                   "downstream.random_init_baseline=false", "logger=none", f"paths.output_dir={run}",
                   f"hydra.run.dir={run}", f"paths.cache_dir={os.path.expanduser(cache_dir)}",
                   "trainer.enable_progress_bar=false"]
            env = {**os.environ, "HYDRA_FULL_ERROR": "0", **({"MLMLAB_DATA_DIR": str(data_dir)} if data_dir else {})}
            log.info("init.pretrain: making the start once: %s", " ".join(cmd[1:]))
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise ConfigError(f"init.pretrain={overrides}: the start's job failed: {child_error(r.stderr)}")
            (Path(run) / "checkpoints" / "last.ckpt").replace(tmp)
            for f in ("results.json", "train_log.jsonl"):
                if (Path(run) / f).exists():
                    (Path(run) / f).replace(tmp.parent / f)

    return cached_file(cache_dir, "init", pretrain_key(list(overrides)), "last.ckpt", build)


_MEMO: dict = {}


def resolve(init, cache_dir: str, data_dir: str | None) -> Start | None:
    """The job's start (None: random init); read once per process (the job's check and its body share it)."""
    if not is_set(init):
        return None
    memo_key = (init.checkpoint, tuple(init.pretrain or ()), str(cache_dir))
    if memo_key not in _MEMO:
        _MEMO.clear()  # one start at a time in memory
        _MEMO[memo_key] = _resolve(init, cache_dir, data_dir)
    return _MEMO[memo_key]


def _resolve(init, cache_dir: str, data_dir: str | None) -> Start:
    if init.pretrain:
        path = pretrained_start(list(init.pretrain), cache_dir, data_dir)
        start = read("mlmlab", path, "init.pretrain")
        start.record.update(pretrain=list(init.pretrain), cache_key=path.parent.name)
        return start
    kind, path = locate(init.checkpoint)
    start = read(kind, path)
    start.record["source"] = str(init.checkpoint)
    return start


# ------------------------------------------------------------------------------------------- the job's config


def command_line(overrides: list[str] | None, group: str) -> dict[str, str]:
    """``{key: value}`` of the command-line overrides under ``group`` (``model.hidden_size=128`` -> hidden_size)."""
    out = {}
    for o in overrides or []:
        k, _, v = o.lstrip("+~").partition("=")
        if k == group:
            out[""] = v
        elif k.startswith(group + "."):
            out[k[len(group) + 1:]] = v
    return out


def adopt(model, tokenizer, start: Start, overrides: list[str] | None) -> dict:
    """Put the start's shape into ``model.*`` and what is known of its tokenizer into ``tokenizer.*`` (the two composed
    groups, changed in place: the record then says what ran); a command-line override of either that contradicts the
    start is a ConfigError. Returns what changed ({key: [composed, start]})."""
    from omegaconf import open_dict

    changed: dict = {}
    for group, node, values in (("model", model, {k: start.encoder_cfg[k] for k in SHAPE_KEYS if k in start.encoder_cfg}),
                                ("tokenizer", tokenizer, start.tokenizer_cfg)):
        given = command_line(overrides, group)
        if "" in given and group == "tokenizer":
            raise ConfigError(f"tokenizer={given['']}: with init.* the tokenizer is the start's; drop the override")
        for k, v in values.items():
            if k not in node:
                continue
            if k in given and str(node[k]) != str(v):
                raise ConfigError(f"{group}.{k}={node[k]} contradicts the start ({group}.{k}={v} in "
                                  f"{start.record.get('source') or start.record.get('path')}); drop the override or "
                                  "start from another encoder")
            if node[k] != v:
                changed[f"{group}.{k}"] = [node[k], v]
                with open_dict(node):
                    node[k] = v
    if any(k.startswith("model.") for k in changed) and model.get("name") != "start":
        # the preset's name no longer describes the shape: the record says the shape is the start's
        changed["model.name"] = [model.name, "start"]
        with open_dict(model):
            model.name = "start"
    if changed:
        log.info("init: shape and tokenizer from the start: %s", changed)
    return changed


def load_into(module, start: Start, objective: str) -> None:
    """The start's weights into the pretraining module: the encoder always (ELECTRA: the discriminator), the MLM head
    too for objective=mlm / none when the start has one."""
    enc = module.encoder()
    enc.load_state_dict(start.encoder_state)
    if objective in ("mlm", "none") and start.head_state:
        missing, unexpected = module.model.cls.load_state_dict(start.head_state, strict=False)
        assert not unexpected and all(k == "predictions.decoder.weight" for k in missing), (missing, unexpected)
        module.model.cls.predictions.decoder.weight = module.model.bert.embeddings.word_embeddings.weight
