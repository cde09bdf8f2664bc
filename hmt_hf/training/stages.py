"""The paper's two training stages (§4, App. D) applied to a live model, and the same-budget baselines.

Stage 1 trains the recurrent memory and the sensory memory without memory search, on short unrolls (2 segments);
stage 2 switches memory search on and trains on long unrolls (up to 15 segments), from the stage-1 weights.

A baseline trains on exactly the same windows, steps and schedule (`METHODS`): `"rmt"` keeps the memory token but
never searches (its config has no sensory memory), `"chunked"` trains the plain backbone on independent
`segment_length`-token chunks (the HMT forward with `use_memory=False`; the memory parameters are frozen).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..memory_hmt import HMTMemory

STAGE1_DEFAULT_DEPTH = 2
STAGE2_DEFAULT_DEPTH = 15
METHODS = ("hmt", "rmt", "chunked")


@dataclass(frozen=True)
class TrainingStage:
    """One stage of the recipe.

    Args:
        number: 1 or 2.
        bptt_depth: segments per training window; backpropagation runs through all of them.
        use_memory_search: whether `P_n` comes from memory search (stage 2) or is the previous memory embedding.
    """

    number: int
    bptt_depth: int

    @property
    def use_memory_search(self) -> bool:
        return self.number == 2

    @property
    def name(self) -> str:
        return f"stage{self.number}"


def stage_plan(stage: str, bptt_depth: int = STAGE2_DEFAULT_DEPTH, stage1_bptt_depth: int = STAGE1_DEFAULT_DEPTH):
    """The stages to run for `--stage` "1", "2" or "both", as a list of [`TrainingStage`]."""
    stages = {"1": [1], "2": [2], "both": [1, 2]}.get(str(stage))
    if stages is None:
        raise ValueError(f"stage={stage!r} is invalid: use '1', '2' or 'both'.")
    return [TrainingStage(n, stage1_bptt_depth if n == 1 else bptt_depth) for n in stages]


def search_parameters(memory: HMTMemory) -> list:
    """The parameters that only memory search reads: `T` (Eq. 1), `W_q` and `W_k` (Eq. 2)."""
    return [
        memory.representation_encoder.summary_prompt,
        *memory.memory_search.query_proj.parameters(),
        *memory.memory_search.key_proj.parameters(),
    ]


def apply_stage(model, stage: TrainingStage | int, method: str = "hmt"):
    """Switch a model (an [`HMTForCausalLM`], or a peft model around one) to a training stage, in place.

    Stage 1 sets `config.use_memory_search = False` and freezes the parameters only memory search reads (`T`,
    `W_q`, `W_k`): they would get no gradient, which DistributedDataParallel rejects unless it searches for unused
    parameters every step, and the optimizer would carry state for them. Stage 2 sets `use_memory_search = True`
    and makes them trainable again exactly where the rest of their memory module is trainable (`initial_memory`,
    read in both stages, decides): with LoRA the trained copy of the memory module is unfrozen and peft's frozen
    original stays frozen.

    `method="rmt"` keeps stage 1's settings in both stages (no memory search); `method="chunked"` also freezes every
    memory parameter (the chunked forward reads none of them). Returns the model.
    """
    number = stage.number if isinstance(stage, TrainingStage) else int(stage)
    if number not in (1, 2):
        raise ValueError(f"stage={number!r} is invalid: use 1 or 2.")
    if method not in METHODS:
        raise ValueError(f"method={method!r} is invalid: use one of {METHODS}.")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "model_type", None) != "hmt":
        raise TypeError(f"apply_stage needs an HMTForCausalLM (or a peft model of one), not {type(base).__name__}.")
    search = number == 2 and method == "hmt"
    base.config.use_memory_search = search
    memories = [module for module in model.modules() if isinstance(module, HMTMemory)]
    for memory in memories:
        if method == "chunked":
            memory.requires_grad_(False)
            continue
        trainable = search and memory.memory_search.initial_memory.requires_grad
        for parameter in search_parameters(memory):
            parameter.requires_grad_(trainable)
    return model
