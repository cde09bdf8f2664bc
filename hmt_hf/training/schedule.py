"""The paper's learning-rate schedule: optional linear warm-up, then the LR times `gamma` every `step_size` steps."""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


class StepDecayLR(LRScheduler):
    """`lr(step) = base_lr * warmup(step) * gamma ** ((step - num_warmup_steps) // step_size)`.

    During the first `num_warmup_steps` steps the LR rises linearly from 0 (transformers' warm-up convention);
    the decays count from the end of the warm-up. The paper (App. D) uses `gamma=0.9` (or 0.7) every 100 steps,
    no warm-up. The LR is a closed-form function of the step, and `state_dict()` holds the step and every
    constructor argument, so a run resumed from a checkpoint continues the schedule exactly.

    Args:
        optimizer: the wrapped optimizer; each parameter group's initial `lr` is its base LR.
        step_size: optimizer steps between two decays.
        gamma: multiplicative factor per decay, in (0, 1].
        num_warmup_steps: linear warm-up length in optimizer steps.
        last_epoch: index of the last step taken (`-1` when starting), as for every torch scheduler.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        step_size: int = 100,
        gamma: float = 0.9,
        num_warmup_steps: int = 0,
        last_epoch: int = -1,
    ):
        if step_size < 1:
            raise ValueError(f"step_size={step_size} must be >= 1.")
        if not 0 < gamma <= 1:
            raise ValueError(f"gamma={gamma} must be in (0, 1].")
        if num_warmup_steps < 0:
            raise ValueError(f"num_warmup_steps={num_warmup_steps} must be >= 0.")
        self.step_size = step_size
        self.gamma = gamma
        self.num_warmup_steps = num_warmup_steps
        super().__init__(optimizer, last_epoch)

    def lr_factor(self, step: int) -> float:
        """Multiplier of the base LR at optimizer step `step` (0-based)."""
        if step < self.num_warmup_steps:
            return step / self.num_warmup_steps
        return self.gamma ** ((step - self.num_warmup_steps) // self.step_size)

    def get_lr(self) -> list[float]:
        factor = self.lr_factor(max(self.last_epoch, 0))
        return [base_lr * factor for base_lr in self.base_lrs]

    def _get_closed_form_lr(self) -> list[float]:
        return self.get_lr()


def get_step_decay_schedule(
    optimizer: Optimizer, step_size: int = 100, gamma: float = 0.9, num_warmup_steps: int = 0, last_epoch: int = -1
) -> StepDecayLR:
    """[`StepDecayLR`] with transformers' `get_*_schedule` signature style."""
    return StepDecayLR(optimizer, step_size, gamma, num_warmup_steps, last_epoch)
