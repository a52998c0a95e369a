"""The pretraining pieces built from the config: the masking recipe (``mask.*``: sampler, schedule, masker), the
LightningModule of ``objective.*`` and the model's record."""

from __future__ import annotations

from mlmlab.config import ConfigError, plain


def eval_suffix(rate: float, unit: str = "token") -> str:
    """The fixed-mask metrics' suffix: ``r15`` (token masks at 15%), ``r15w`` (whole-word masks)."""
    return f"r{round(rate * 100, 2):g}" + {"token": "", "word": "w"}[unit]


def eval_masks(blocks: dict, e, ctx, unit: str):
    """The fixed evaluation masks of ``eval.*`` (``e``) on the validation ``blocks``: Bernoulli per ``unit`` at
    ``eval.rate`` with ``eval.seed``, ``eval.replace`` split, uniform replacements (``ctx``: the data context) -- a
    MaskedBatch, the same for every run that shares the blocks and these settings (mlmlab.train, mlmlab.phase)."""
    from mlmlab.data.tokenizer import MASK
    from mlmlab.masking import mask_once
    from mlmlab.masking.replacement import UniformSampler

    return mask_once(blocks["input_ids"], blocks["special_tokens_mask"], e.rate, MASK,
                     (e.replace.mask, e.replace.random, e.replace.keep), UniformSampler(ctx), e.seed,
                     unit=unit, word_ids=blocks.get("word_ids") if unit == "word" else None)


def build_module(objective, optim, seed: int, suffix: str, encoder_cfg: dict, max_steps: int, recipe):
    """The pretraining LightningModule of ``objective`` (``objective.*``; objective=none: an MLM module that is never
    trained, so the random-init encoder gets the same fixed-mask evaluation and downstream path), with ``optim.*``,
    the init ``seed``, the fixed-mask metrics' ``suffix`` (:func:`eval_suffix`) and the run's ``MaskingRecipe``
    (:func:`build_recipe`; CLM uses none)."""
    from mlmlab.lit.clm import CLMModule
    from mlmlab.lit.electra import ElectraModule
    from mlmlab.lit.mlm import MLMModule

    if objective.name == "clm":
        from mlmlab.data.tokenizer import PAD

        return CLMModule(encoder_cfg, plain(optim), max_steps, PAD)
    cls = ElectraModule if objective.name == "electra" else MLMModule
    return cls(encoder_cfg, recipe, plain(optim), seed, max_steps, suffix, objective=plain(objective))


def build_recipe(mask, ctx, train_blocks: dict | None = None):
    """``mask.*`` (its typed owner, ``MaskConfig``, or the composed node) -> the run's MaskingRecipe: the one builder
    (the replacement sampler with its data-dependent checks, the rate schedule, the masker). ``ctx``: the data context
    (``mlmlab.data.vocab_stats.make_sampler_context``) or, without data, a plain ``SamplerContext`` (samplers that need
    no corpus statistics: uniform). ConfigError naming the key."""
    from mlmlab.config import build_schedule, mask_config
    from mlmlab.data.tokenizer import MASK
    from mlmlab.masking import MaskingRecipe
    from mlmlab.masking.selection import build_weights

    mask = mask_config(mask)
    sampler = build_sampler(mask, ctx, train_blocks) if train_blocks is not None else instantiate_sampler(mask, ctx)
    try:
        weights = build_weights(mask.select, ctx)
        return MaskingRecipe.from_config(mask, MASK, ctx.special_ids, sampler, build_schedule(mask), weights)
    except ValueError as err:
        raise ConfigError(str(err)) from err


def recipe_without_data(mask, vocab_size: int):
    """A MaskingRecipe with no corpus behind it (benchmarks and standalone use; uniform-style samplers only)."""
    from mlmlab.data.tokenizer import SPECIAL_TOKENS
    from mlmlab.masking.replacement import SamplerContext

    return build_recipe(mask, SamplerContext(vocab_size, tuple(range(len(SPECIAL_TOKENS)))))


def model_record(module, encoder_cfg: dict) -> dict:
    """Parameter counts: the encoder being studied (what is fine-tuned), and the whole pretraining model."""
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731  (parameters() counts a tied tensor once)
    rec = {"parameters": count(module.model), "encoder_parameters": count(module.encoder()), **encoder_cfg}
    gen = getattr(module.model, "generator", None)
    if gen is not None:
        shared = {id(p) for p in module.encoder().parameters()}
        rec["generator_parameters"] = sum(p.numel() for p in gen.parameters() if id(p) not in shared)
        rec["generator"] = {k: getattr(gen.config, k) for k in ("hidden_size", "num_layers", "num_heads",
                                                                 "intermediate_size")}
    return rec


def build_sampler(mask, ctx, train_blocks: dict):
    """The run's replacement sampler, with data-dependent checks of mask.*; raises ConfigError before training."""
    from mlmlab.data.corpus import iter_rows

    if mask.unit in ("word", "span", "pmi"):
        w = train_blocks.get("word_ids")
        if w is None or not any(bool((c >= 0).any()) for c in iter_rows(w)):
            raise ConfigError(f"mask.unit={mask.unit} needs word ids, but the tokenized corpus has none; "
                              "allowed with this data: mask.unit=token")
    return instantiate_sampler(mask, ctx)


def instantiate_sampler(mask, ctx):
    """``mask.sampler`` (a ``_target_`` node) with the data context ``ctx``; ConfigError naming the sampler."""
    from hydra.utils import instantiate

    try:
        return instantiate(mask.sampler, _partial_=True)(ctx=ctx)  # partial: ctx must not go through OmegaConf
    except Exception as e:
        cause = e.__cause__ or e
        if isinstance(cause, ConfigError):
            raise cause from e
        raise ConfigError(f"mask.sampler ({dict(mask.sampler).get('_target_')}): {cause}") from e
