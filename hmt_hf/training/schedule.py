"""The paper's learning-rate schedule: optional linear warm-up, then the LR times `gamma` every `step_size` steps."""

from __future__ import annotations

import functools

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def step_decay_factor(step: int, step_size: int, gamma: float, num_warmup_steps: int) -> float:
    """Multiplier of the base LR at optimizer step `step` (0-based): `warmup(step) * gamma ** ((step - warm-up) //
    step_size)`, with transformers' linear warm-up from 0."""
    if step < num_warmup_steps:
        return step / num_warmup_steps
    return gamma ** ((step - num_warmup_steps) // step_size)


def get_step_decay_schedule(
    optimizer: Optimizer, step_size: int = 100, gamma: float = 0.9, num_warmup_steps: int = 0, last_epoch: int = -1
) -> LambdaLR:
    """A `LambdaLR` with the paper's schedule (App. D: `gamma=0.9` or 0.7 every 100 steps, no warm-up), in the style
    of transformers' `get_*_schedule` functions. The LR is a closed-form function of the step, so a run resumed from a
    checkpoint (the scheduler's `last_epoch` restored by Trainer) continues the schedule exactly."""
    if step_size < 1:
        raise ValueError(f"step_size={step_size} must be >= 1.")
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma={gamma} must be in (0, 1].")
    if num_warmup_steps < 0:
        raise ValueError(f"num_warmup_steps={num_warmup_steps} must be >= 0.")
    factor = functools.partial(step_decay_factor, step_size=step_size, gamma=gamma, num_warmup_steps=num_warmup_steps)
    return LambdaLR(optimizer, factor, last_epoch)
