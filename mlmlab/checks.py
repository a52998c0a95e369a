"""What only the command line and the composition show, checked before a job does any data work: ``check_job``
(a preset that overrides a chosen group, a budget beside ``trainer.max_steps``, the start's shape against the
overrides, then ``validate``) and ``check_argv`` (what Hydra's override grammar would reject without a hint)."""

from __future__ import annotations

from omegaconf import DictConfig

from mlmlab.config import ConfigError, validate


def check_job(cfg: DictConfig) -> None:
    """``validate(cfg)``, and what only the composition shows: ``downstream=none`` chosen on the command line while a
    preset (``experiment=real_en`` ...) sets its own ``downstream.tasks`` after the group, so the job would still
    fine-tune; ELECTRA under a preset's mask; ``trainer.max_steps`` on the command line beside a budget; the
    ``init.checkpoint`` start's shape and tokenizer against the overrides."""
    from hydra.core.hydra_config import HydraConfig

    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    if choices.get("downstream") == "none" and cfg.downstream.get("tasks"):
        raise ConfigError(f"downstream=none was chosen, but a preset sets downstream.tasks={list(cfg.downstream.tasks)}"
                          " after it; for pretraining only use downstream.tasks=[]")
    if choices.get("objective") == "electra" and choices.get("mask") != "electra" and choices.get("experiment") \
            and not any(o.lstrip("+~").startswith("mask=") for o in HydraConfig.get().overrides.task):
        # the preset's defaults come after the objective's, so its mask wins silently: ELECTRA at the preset's masking
        raise ConfigError(f"objective=electra with experiment={choices['experiment']}: the preset's mask="
                          f"{choices.get('mask')} replaces ELECTRA's; add mask=electra for ELECTRA's recipe "
                          f"(15%, 85/15) or mask={choices.get('mask')} to keep the preset's")
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    budget = [f"trainer.budget.{k}={v:g}" for k, v in cfg.trainer.budget.items() if v is not None]
    steps = [o for o in overrides if o.lstrip("+~").startswith("trainer.max_steps=")]
    if budget and steps:  # a preset's trainer.max_steps is its length without a budget; the command line's is a choice
        raise ConfigError(f"{steps[0]} and {budget[0]} both set the length of training; set one (a budget replaces "
                          f"trainer.max_steps: add trainer.budget.{budget[0].split('.')[2].split('=')[0]}=null to "
                          "train the steps)")
    init = cfg.get("init")
    if init is not None and init.checkpoint is not None:  # its shape and tokenizer, checked before any data work
        from mlmlab import init as init_

        init_.check(init)  # (validate checks it again; here it must hold before the start is read)
        start = init_.resolve(init, cfg.paths.cache_dir, cfg.paths.get("data_dir"))
        init_.adopt(cfg.model, cfg.tokenizer, start,
                    list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else [])
    validate(cfg)


def check_argv(argv: list[str]) -> str | None:
    """What Hydra's override grammar would reject without a hint: ``init.pretrain=[a=b,...]`` with the items unquoted
    (each item is itself an override, so its ``=`` needs quotes). The one-line error, or None."""
    for arg in argv:
        key, _, value = arg.lstrip("+~").partition("=")
        if key == "init.pretrain" and value.startswith("[") and "=" in value and not any(q in value for q in "'\""):
            items = ",".join(f"'{x.strip()}'" for x in value.strip("[]").split(","))
            return (f"init.pretrain={value}: quote each item, which is itself an override: "
                    f"\"init.pretrain=[{items}]\"")
    return None
