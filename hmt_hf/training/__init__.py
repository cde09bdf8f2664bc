"""Training HMT with transformers' Trainer: the paper's two-stage recipe, its LR schedule, LoRA, telemetry.

`examples/train_hmt.py` is the command-line entry point built from these pieces:

- `arguments`: `ModelArguments`, `DataTrainingArguments`, `HMTArguments` (for `HfArgumentParser`).
- `stages`: `TrainingStage`, `stage_plan`, `apply_stage` (stage 1: no memory search, short unrolls; stage 2: memory
  search, long unrolls).
- `schedule`: `get_step_decay_schedule` (a `LambdaLR`: LR x gamma every N steps, after an optional warm-up).
- `trainer`: `HMTTrainer` (a `Trainer` using that schedule).
- `lora`: `hmt_lora_config`, `lora_target_modules` (LoRA on the backbone, `modules_to_save=["memory"]`).
- `callbacks`: `TelemetryCallback` (tokens/s, peak memory, `telemetry.jsonl`, `loss_curve.png`), `plot_loss_curve`.
"""

from ..peak_memory import peak_memory_mib
from .arguments import DataTrainingArguments, HMTArguments, ModelArguments
from .callbacks import TelemetryCallback, plot_loss_curve
from .lora import hmt_lora_config, lora_target_modules
from .schedule import get_step_decay_schedule
from .stages import TrainingStage, apply_stage, search_parameters, stage_plan
from .trainer import HMTTrainer

__all__ = [
    "DataTrainingArguments",
    "HMTArguments",
    "HMTTrainer",
    "ModelArguments",
    "TelemetryCallback",
    "TrainingStage",
    "apply_stage",
    "get_step_decay_schedule",
    "hmt_lora_config",
    "lora_target_modules",
    "peak_memory_mib",
    "plot_loss_curve",
    "search_parameters",
    "stage_plan",
]
