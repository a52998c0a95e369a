"""What a pretraining checkpoint carries besides Lightning's state, so that it can be fine-tuned
(``python -m mlmlab.finetune``) or exported (``python -m mlmlab.export``) on its own: the tokenizer, the encoder's
config, where the encoder sits in the state dict, the objective and the whole resolved run config.
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
import torch

from mlmlab.errors import ConfigError

FORMAT = 1


def run_info(config: dict, tok, encoder_cfg: dict, module, wandb_group: str | None = None,
             wandb_id: str | None = None) -> dict:
    enc = module.encoder()
    key = next(name for name, m in module.named_modules() if m is enc)
    return {"format": FORMAT, "objective": config["objective"]["name"], "encoder_config": encoder_cfg,
            "encoder_key": key, "tokenizer": tok.to_str(), "config": config, "wandb_group": wandb_group,
            "wandb_id": wandb_id}


class RunInfo(pl.Callback):
    """Puts :func:`run_info` into every checkpoint the Trainer saves (under ``"mlmlab"``)."""

    def __init__(self, info: dict):
        self.info = info

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["mlmlab"] = self.info


def load_checkpoint(path: str, key: str = "checkpoint") -> tuple[dict, dict]:
    """``(info, state_dict)`` of a pretraining checkpoint; ConfigError naming ``key`` when it is not one."""
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ConfigError(f"{key}={path!r} does not exist (give the explicit path of a .ckpt file, e.g. "
                          "<run dir>/checkpoints/last.ckpt)")
    try:  # a trusted local file written by mlmlab.train (it holds plain Python objects besides tensors)
        ckpt = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ConfigError(f"{key}={path!r} could not be read as a checkpoint ({type(e).__name__}: {e})") from e
    info = ckpt.get("mlmlab") if isinstance(ckpt, dict) else None
    if not info or "encoder_key" not in info:
        raise ConfigError(f"{key}={path!r} is not an mlmlab pretraining checkpoint (no 'mlmlab' entry)")
    return info, ckpt["state_dict"]


def encoder_state(info: dict, state_dict: dict) -> dict:
    prefix = info["encoder_key"] + "."
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}


def checkpoint_tokenizer(info: dict, key: str = "checkpoint"):
    """The tokenizer the checkpoint was pretrained with; ConfigError if it does not fit the embedding matrix."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(info["tokenizer"])
    vocab, emb = tok.get_vocab_size(), info["encoder_config"]["vocab_size"]
    if vocab != emb:
        raise ConfigError(f"{key}: the tokenizer has {vocab} tokens but the encoder's embedding matrix has {emb} rows "
                          "(tokenizer and checkpoint do not match)")
    return tok


def language_model(info: dict, state_dict: dict):
    """The whole pretrained language model of a checkpoint (encoder + LM head; ELECTRA: discriminator + generator),
    for zero-shot scoring (mlmlab.zeroshot). ``objective=none`` checkpoints carry the untrained MLM head."""
    from mlmlab.data.tokenizer import SPECIAL_TOKENS
    from mlmlab.models.electra import ElectraForPretraining
    from mlmlab.models.encoder import BertForMLM, CausalLM, EncoderConfig

    c = EncoderConfig(**info["encoder_config"])
    objective = info["objective"]
    if objective == "electra":
        o = info["config"]["objective"]
        model = ElectraForPretraining(c, o["generator_size"], o.get("generator_layers"),
                                      tuple(range(len(SPECIAL_TOKENS))))
    else:
        model = CausalLM(c) if c.causal else BertForMLM(c)
    prefix = info["encoder_key"].rsplit(".", 1)[0] + "."
    model.load_state_dict({k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)})
    return model.eval()
