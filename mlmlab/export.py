"""``python -m mlmlab.export checkpoint=<path> out=<dir>``: a pretraining checkpoint as a Hugging Face directory.

The directory (``config.json``, weights, tokenizer files) loads with ``transformers.AutoModelForMaskedLM`` /
``AutoTokenizer.from_pretrained(dir)`` and gives the same logits as our model on right-padded inputs. The transformers
class follows ``model.norm``:

- ``post`` (BERT; checkpoints without a ``norm`` key): parameter names already follow ``BertForMaskedLM``
  (``tests/test_encoder.py``), so the weights load as they are.
- ``pre``: ``RobertaPreLayerNormForMaskedLM``, the same pre-LN block; :func:`to_prelayernorm` renames ``bert.*`` to
  ``roberta_prelayernorm.*`` and the head ``cls.predictions.*`` to ``lm_head.*``, and shifts the position table: RoBERTa
  numbers the real tokens from ``pad_token_id + 1`` (pad tokens get ``pad_token_id``), so its table is ours with
  ``pad_token_id + 1`` rows (zeros) in front.

MLM checkpoints export the whole masked LM. ELECTRA checkpoints export the discriminator and CLM checkpoints the causal
encoder (``is_decoder``), as a ``BertModel`` / ``RobertaPreLayerNormModel`` without pooler (``AutoModel``; there is no
head a transformers class would read the same way). Needs ``transformers`` (the ``dev`` extra).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from mlmlab.cli import Opt
from mlmlab.cli import run as cli_run
from mlmlab.errors import ConfigError

HF_NORMS = ("post", "pre")


def _norm(encoder_cfg: dict) -> str:
    position = encoder_cfg.get("position", "learned")
    if position != "learned":  # no transformers BERT class applies rotary positions to this block
        raise ConfigError(f"model.position={position!r} cannot be exported; allowed: learned")
    norm = encoder_cfg.get("norm", "post")  # checkpoints from before model.norm are post-LN
    if norm not in HF_NORMS:
        raise ConfigError(f"model.norm={norm!r} cannot be exported; allowed: {', '.join(HF_NORMS)}")
    return norm


def hf_config(encoder_cfg: dict, **extra):
    """The transformers config of our encoder: ``BertConfig`` (norm=post) or ``RobertaPreLayerNormConfig`` (norm=pre,
    with ``pad_token_id + 1`` more positions, see :func:`to_prelayernorm`)."""
    import transformers

    from mlmlab.data.tokenizer import CLS, PAD, SEP

    c = encoder_cfg
    kw = dict(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], num_hidden_layers=c["num_layers"],
        num_attention_heads=c["num_heads"], intermediate_size=c["intermediate_size"],
        max_position_embeddings=c["max_position_embeddings"], type_vocab_size=c["type_vocab_size"],
        hidden_dropout_prob=c["dropout"], attention_probs_dropout_prob=c["attention_dropout"],
        layer_norm_eps=c["layer_norm_eps"], initializer_range=c["initializer_range"], hidden_act="gelu",
        pad_token_id=PAD, **extra)
    if _norm(c) == "post":
        return transformers.BertConfig(**kw)
    kw["max_position_embeddings"] += PAD + 1
    return transformers.RobertaPreLayerNormConfig(bos_token_id=CLS, eos_token_id=SEP, **kw)


# our pre-LN names -> RobertaPreLayerNormForMaskedLM's (prefix renames; the layers' names already agree)
PRE_LN_NAMES = (("bert.", "roberta_prelayernorm."), ("cls.predictions.transform.dense.", "lm_head.dense."),
                ("cls.predictions.transform.LayerNorm.", "lm_head.layer_norm."),
                ("cls.predictions.decoder.", "lm_head.decoder."), ("cls.predictions.bias", "lm_head.bias"))


def to_prelayernorm(state: dict, pad_token_id: int = 0) -> dict:
    """A pre-LN state dict (``BertForMLM``'s, or an ``Encoder``'s) under transformers' RoBERTa-PreLayerNorm names
    (``RobertaPreLayerNormForMaskedLM`` / ``RobertaPreLayerNormModel``). The position table gets ``pad_token_id + 1``
    zero rows in front: RoBERTa gives real token ``i`` (right padding) position ``pad_token_id + 1 + i``."""
    out = {}
    for k, v in state.items():
        new = next((to + k[len(frm):] for frm, to in PRE_LN_NAMES if k.startswith(frm)), k)
        if new.endswith("embeddings.position_embeddings.weight"):
            v = torch.cat([v.new_zeros(pad_token_id + 1, v.shape[1]), v])
        out[new] = v
    return out


def hf_tokenizer(tok):
    """The checkpoint's tokenizer as a transformers fast tokenizer that encodes exactly as mlmlab feeds the model:
    ``[CLS] a [SEP]`` and ``[CLS] a [SEP] b [SEP]`` with token types 0 / 1 (mlmlab.downstream.encode_examples; the
    pretraining blocks are ``[CLS] ... [SEP]`` too). mlmlab itself encodes without special tokens and adds them, so
    the template is set on a copy for the export only."""
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    from mlmlab.data.tokenizer import CLS, SEP, SPECIAL_TOKENS

    pad, unk, cls, sep, mask = SPECIAL_TOKENS
    tok = Tokenizer.from_str(tok.to_str())
    tok.post_processor = TemplateProcessing(single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
                                            special_tokens=[(cls, CLS), (sep, SEP)])
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
    try:  # a folder that cannot be made or written: named now, before any conversion
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".mlmlab_write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"out={out!r} cannot be written ({type(e).__name__}: {e.strerror or e}); give a folder "
                          "you can create files in") from e
    enc = info["encoder_config"]
    pre = _norm(enc) == "pre"
    if info["objective"] == "mlm":
        prefix = info["encoder_key"].rsplit(".", 1)[0] + "."  # "model.": bert.* and cls.* under it
        weights = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        model = (transformers.RobertaPreLayerNormForMaskedLM if pre else transformers.BertForMaskedLM)(hf_config(enc))
    else:
        weights = encoder_state(info, state_dict)
        model = (transformers.RobertaPreLayerNormModel if pre else transformers.BertModel)(
            hf_config(enc, is_decoder=bool(enc.get("causal"))), add_pooling_layer=False)
    if pre:
        from mlmlab.data.tokenizer import PAD

        weights = to_prelayernorm(weights, PAD)
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


OPTIONS = {"checkpoint": Opt("a pretraining checkpoint (<run>/checkpoints/last.ckpt)", required=True),
           "out": Opt("the Hugging Face directory to write", required=True)}


def main(argv: list[str] | None = None) -> int:
    """``key=value`` arguments like every entry point (:mod:`mlmlab.cli`)."""
    return cli_run(_main, argv, OPTIONS, "python -m mlmlab.export")


def _main(args) -> int:
    try:
        path = export(args.checkpoint, args.out)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
