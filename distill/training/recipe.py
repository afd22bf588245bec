"""distill's training recipe where it differs from TRL's defaults, held as TRL's own argument classes with other
field defaults (as TRL's GRPOConfig sets its own over TrainingArguments): the parser, `--help`, the docs
reference and the trainer see one default per key, and a config or a flag overrides it like any TRL default.

The defaults are plain dicts, light to import: the pipeline fingerprints and `--check`s with them. The classes are
made on first use (`recipe.SFTConfig`, `recipe.ModelConfig`, `recipe.GRPOConfig`), because importing TRL costs
seconds that `distill eval` or `distill --help` should not pay; they are attributes of this module, so the
arguments a checkpoint pickles (training_args.bin) load again.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import typing
from typing import Any

# The paper's recipe: LoRA r 8, alpha 16 on all linear layers, lr 1e-4, 10 epochs, cosine; bf16 and gradient
# checkpointing only when a config asks, as a CPU run pays for both. SFTConfig's keys and ModelConfig's.
SFT: dict[str, Any] = {
    "model_name_or_path": "smollm2-135m-instruct", "completion_only_loss": True,
    "use_peft": True, "lora_r": 8, "lora_alpha": 16, "lora_target_modules": "all-linear",
    "learning_rate": 1e-4, "num_train_epochs": 10, "lr_scheduler_type": "cosine",
    "eval_strategy": "epoch", "save_strategy": "epoch", "save_total_limit": 2, "logging_first_step": True,
    "bf16": False, "gradient_checkpointing": False, "gradient_checkpointing_kwargs": {"use_reentrant": False},
    "ddp_find_unused_parameters": False,
}

# improve's GRPO run: a checkpoint every 10 steps (one kept: a resumed run needs only the last), a log line every
# step, no tracker unless `grpo` names one. What follows from the improve config (the plans per question, the
# planner's sampling, the seed, the device) is improve's to set.
GRPO: dict[str, Any] = {
    "report_to": "none", "save_strategy": "steps", "save_steps": 10, "save_total_limit": 1, "logging_steps": 1,
}

_CLASSES = {"SFTConfig": SFT, "ModelConfig": SFT, "GRPOConfig": GRPO}


def import_trl():
    """TRL, imported without its side effect: its import sets VLLM_LOGGING_LEVEL=ERROR, which every vLLM server
    the pipeline starts later would inherit (their logs lost every vLLM line); later imports do not run that
    code again."""
    saved = os.environ.get("VLLM_LOGGING_LEVEL")
    import trl

    if saved is None:
        os.environ.pop("VLLM_LOGGING_LEVEL", None)
    else:
        os.environ["VLLM_LOGGING_LEVEL"] = saved
    return trl


def with_defaults(base: type, defaults: dict[str, Any]) -> type:
    """`base` with `defaults` as the defaults of the fields it has (their types and help kept), named as `base`."""
    hints = typing.get_type_hints(base)
    fields = []
    for f in dataclasses.fields(base):
        if f.name in defaults:
            value = defaults[f.name]
            # a list field's parser default is read from its factory only (transformers' HfArgumentParser)
            factory = isinstance(value, (dict, list)) or _is_list(hints[f.name])
            default = {"default_factory": functools.partial(copy.deepcopy, value)} if factory else {"default": value}
            fields.append((f.name, hints[f.name], dataclasses.field(metadata=f.metadata, **default)))
    cls = dataclasses.make_dataclass(base.__name__, fields, bases=(base,))
    cls.__module__, cls.__doc__ = __name__, f"TRL's {base.__name__} with distill's recipe as its defaults."
    return cls


def turned_off(cls: type) -> list[str]:
    """The switches TRL turns on and the recipe turns off: TRL's parser gives a `--no_<name>` flag only to a switch
    whose default is on, so the parser adds these back (a command line that worked on TRL's defaults still does)."""
    base = dataclasses.fields(cls.__mro__[1]) if cls.__module__ == __name__ else ()
    return [f.name for f in base if f.default is True and _CLASSES[cls.__name__].get(f.name) is False]


def _is_list(hint: Any) -> bool:
    return any(typing.get_origin(t) is list for t in (hint, *typing.get_args(hint)))


def trl_class(name: str) -> type:
    """TRL's own class of that name: the defaults `train_config.yaml` leaves out are TRL's, not the recipe's."""
    return getattr(import_trl(), name)


def __getattr__(name: str) -> type:
    if name not in _CLASSES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = globals()[name] = with_defaults(trl_class(name), _CLASSES[name])
    return cls
