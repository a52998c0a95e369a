"""The pretraining pieces built from the config: the masking recipe (``mask.*``: sampler, schedule, masker), the
LightningModule of ``objective.*`` and the model's record."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from mlmlab.config import ConfigError, eval_units


def eval_suffix(rate: float, unit: str = "token") -> str:
    """The fixed-mask metrics' suffix: ``r15`` (token masks at 15%), ``r15w`` (whole-word masks)."""
    return f"r{round(rate * 100, 2):g}" + {"token": "", "word": "w"}[unit]


def build_module(cfg: DictConfig, encoder_cfg: dict, max_steps: int, recipe=None):
    """The pretraining LightningModule of ``cfg.objective`` (objective=none: an MLM module that is never trained, so the
    random-init encoder gets the same fixed-mask evaluation and downstream path). ``recipe``: the run's
    ``MaskingRecipe`` (stage 2); None builds it from ``mask.*`` without data (samplers that need no corpus statistics)."""
    from mlmlab.lit.clm import CLMModule
    from mlmlab.lit.electra import ElectraModule
    from mlmlab.lit.mlm import MLMModule

    optim = OmegaConf.to_container(cfg.optim)
    if cfg.objective.name == "clm":
        from mlmlab.data.tokenizer import PAD

        return CLMModule(encoder_cfg, optim, max_steps, PAD)
    if recipe is None:
        recipe = recipe_without_data(cfg, encoder_cfg["vocab_size"])
    cls = ElectraModule if cfg.objective.name == "electra" else MLMModule
    return cls(encoder_cfg, recipe, optim, cfg.seed, max_steps, eval_suffix(cfg.eval.rate, eval_units(cfg)[0]),
               objective=OmegaConf.to_container(cfg.objective))


def build_recipe(cfg: DictConfig, ctx, train_blocks: dict | None = None):
    """``mask.*`` -> the run's MaskingRecipe: the one builder (the replacement sampler with its data-dependent checks,
    the rate schedule, the masker). ``ctx``: the data context (``mlmlab.data.vocab_stats.make_sampler_context``) or,
    without data, a plain ``SamplerContext`` (samplers that need no corpus statistics: uniform). ConfigError naming the
    key."""
    from mlmlab.config import build_schedule, mask_config
    from mlmlab.data.tokenizer import MASK
    from mlmlab.masking import MaskingRecipe

    sampler = build_sampler(cfg, ctx, train_blocks) if train_blocks is not None else instantiate_sampler(cfg, ctx)
    try:
        return MaskingRecipe.from_config(mask_config(cfg.mask), MASK, ctx.special_ids, sampler,
                                         build_schedule(cfg.mask))
    except ValueError as err:
        raise ConfigError(str(err)) from err


def recipe_without_data(cfg: DictConfig, vocab_size: int):
    """A MaskingRecipe with no corpus behind it (benchmarks and standalone use; uniform-style samplers only)."""
    from mlmlab.data.tokenizer import SPECIAL_TOKENS
    from mlmlab.masking.replacement import SamplerContext

    return build_recipe(cfg, SamplerContext(vocab_size, tuple(range(len(SPECIAL_TOKENS)))))


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


def build_sampler(cfg: DictConfig, ctx, train_blocks: dict):
    """The run's replacement sampler, with data-dependent checks of mask.*; raises ConfigError before training."""
    from mlmlab.data.corpus import iter_rows

    m = cfg.mask
    if m.unit in ("word", "span"):
        w = train_blocks.get("word_ids")
        if w is None or not any(bool((c >= 0).any()) for c in iter_rows(w)):
            raise ConfigError(f"mask.unit={m.unit} needs word ids, but the tokenized corpus has none; "
                              "allowed with this data: mask.unit=token")
    return instantiate_sampler(cfg, ctx)


def instantiate_sampler(cfg: DictConfig, ctx):
    """``mask.sampler`` (a ``_target_`` node) with the data context ``ctx``; ConfigError naming the sampler."""
    from hydra.utils import instantiate

    try:
        return instantiate(cfg.mask.sampler, _partial_=True)(ctx=ctx)  # partial: ctx must not go through OmegaConf
    except Exception as e:
        cause = e.__cause__ or e
        if isinstance(cause, ConfigError):
            raise cause from e
        raise ConfigError(f"mask.sampler ({cfg.mask.sampler.get('_target_')}): {cause}") from e
