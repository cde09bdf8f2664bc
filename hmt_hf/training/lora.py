"""LoRA for HMT through peft: adapters on the backbone, the memory module trained and saved in full.

peft does not know `model_type="hmt"`, so the target modules are taken from peft's table for the *backbone's*
model type and restricted to the backbone (`"all-linear"` would also catch the memory-search projections, which
must be trained in full). The memory parameters are in one module, `model.memory`, which `modules_to_save`
trains and saves with the adapter. `merge_and_unload()` then gives a plain [`HMTForCausalLM`].
"""

from __future__ import annotations

import re


def lora_target_modules(model, target_modules: list[str] | None = None) -> str:
    """A regex (peft matches a string `target_modules` with `re.fullmatch` against module names) selecting the
    backbone modules to adapt.

    Args:
        model: an [`HMTForCausalLM`].
        target_modules: module names (last name component, e.g. `["q_proj", "v_proj"]`); by default peft's
            `TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING[text_config.model_type]`.
    """
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    model_type = model.config.text_config.model_type
    if target_modules is None:
        target_modules = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type)
        if target_modules is None:
            raise ValueError(
                f"peft has no default LoRA target modules for backbone model_type={model_type!r}; pass them "
                "explicitly (e.g. --lora_target_modules q_proj v_proj), naming linear layers of the backbone."
            )
    names = "|".join(re.escape(name) for name in target_modules)
    pattern = rf"{re.escape(model.base_model_prefix)}\.(.*\.)?({names})"
    backbone_prefix = model.base_model_prefix + "."
    if not any(re.fullmatch(pattern, name) for name, _ in model.named_modules() if name.startswith(backbone_prefix)):
        raise ValueError(
            f"No backbone module is named any of {list(target_modules)} (backbone: "
            f"{type(getattr(model, model.base_model_prefix)).__name__}); pass names of its linear layers."
        )
    return pattern


def hmt_lora_config(
    model,
    r: int = 8,
    lora_alpha: int = 16,
    lora_dropout: float = 0.05,
    target_modules: list[str] | None = None,
    **lora_kwargs,
):
    """A `peft.LoraConfig` for an HMT: LoRA on the backbone's `target_modules` (see [`lora_target_modules`]),
    the memory module trained and saved whole (`modules_to_save=["memory"]`), task type CAUSAL_LM.

    Use it with `peft.get_peft_model(model, hmt_lora_config(model))`. The adapter folder then holds the LoRA
    weights and the memory parameters; `AutoPeftModelForCausalLM.from_pretrained(folder)` reloads it (with
    `hmt_hf` imported, so the "hmt" model type is registered), and `merge_and_unload()` gives a plain HMT.
    """
    from peft import LoraConfig

    modules_to_save = list(lora_kwargs.pop("modules_to_save", None) or [])
    if "memory" not in modules_to_save:
        modules_to_save.append("memory")
    return LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        target_modules=lora_target_modules(model, target_modules),
        modules_to_save=modules_to_save,
        task_type="CAUSAL_LM",
        **lora_kwargs,
    )
