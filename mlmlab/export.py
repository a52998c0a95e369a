"""``python -m mlmlab.export checkpoint=<path> out=<dir>``: a pretraining checkpoint as a Hugging Face directory.

The directory (``config.json``, weights, tokenizer files) loads with ``transformers.AutoModelForMaskedLM`` /
``AutoTokenizer.from_pretrained(dir)`` and gives the same logits as our model: parameter names already follow
``BertForMaskedLM`` (``tests/test_encoder.py``). MLM checkpoints export the whole masked LM. ELECTRA checkpoints export
the discriminator and CLM checkpoints the causal encoder, as a ``BertModel`` (``AutoModel``; there is no head a
transformers class would read the same way). Needs ``transformers`` (the ``dev`` extra).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mlmlab.config import ConfigError

USAGE = "usage: python -m mlmlab.export checkpoint=<path/to/last.ckpt> out=<dir>"


def hf_config(encoder_cfg: dict, **extra):
    import transformers

    c = encoder_cfg
    return transformers.BertConfig(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], num_hidden_layers=c["num_layers"],
        num_attention_heads=c["num_heads"], intermediate_size=c["intermediate_size"],
        max_position_embeddings=c["max_position_embeddings"], type_vocab_size=c["type_vocab_size"],
        hidden_dropout_prob=c["dropout"], attention_probs_dropout_prob=c["attention_dropout"],
        layer_norm_eps=c["layer_norm_eps"], initializer_range=c["initializer_range"], hidden_act="gelu",
        pad_token_id=0, **extra)


def hf_tokenizer(tok):
    import transformers

    from mlmlab.data.tokenizer import SPECIAL_TOKENS

    pad, unk, cls, sep, mask = SPECIAL_TOKENS
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=pad, unk_token=unk, cls_token=cls,
                                                sep_token=sep, mask_token=mask,
                                                model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def export(checkpoint: str, out: str) -> Path:
    """Write the HF directory for ``checkpoint`` to ``out``; returns ``out``."""
    try:
        import transformers
    except ImportError as e:
        raise ConfigError("mlmlab.export needs transformers: pip install -e '.[dev]' (or pip install transformers)") from e
    from mlmlab.checkpoint import checkpoint_tokenizer, encoder_state, load_checkpoint

    info, state_dict = load_checkpoint(checkpoint)
    tok = checkpoint_tokenizer(info)
    out_dir = Path(out).expanduser()
    enc = info["encoder_config"]
    if info["objective"] == "mlm":
        prefix = info["encoder_key"].rsplit(".", 1)[0] + "."  # "model.": bert.* and cls.* under it
        weights = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        model = transformers.BertForMaskedLM(hf_config(enc))
    else:
        weights = encoder_state(info, state_dict)
        model = transformers.BertModel(hf_config(enc, is_decoder=bool(enc.get("causal"))), add_pooling_layer=False)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ConfigError(f"checkpoint={checkpoint!r}: weights do not map onto {type(model).__name__} "
                          f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    if info["objective"] == "mlm":
        model.tie_weights()
    model.save_pretrained(out_dir)
    hf_tokenizer(tok).save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    args = dict(a.split("=", 1) for a in (sys.argv[1:] if argv is None else argv) if "=" in a)
    bad = [a for a in (sys.argv[1:] if argv is None else argv) if "=" not in a]
    if bad or set(args) != {"checkpoint", "out"}:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        path = export(args["checkpoint"], args["out"])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
