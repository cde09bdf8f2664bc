"""`HMTTrainer`: transformers' `Trainer` with the paper's step-decay learning-rate schedule."""

from __future__ import annotations

from transformers import Trainer

from .schedule import StepDecayLR


class HMTTrainer(Trainer):
    """A `Trainer` whose LR schedule is, by default, the paper's: linear warm-up over `args.warmup_steps` (none by
    default), then the LR times `lr_decay_gamma` every `lr_decay_steps` optimizer steps ([`StepDecayLR`]).

    Everything else is `Trainer` (optimizer, mixed precision, activation checkpointing, DDP/FSDP/DeepSpeed through
    accelerate, checkpoints and `resume_from_checkpoint`, `report_to`). The schedule's state is saved in every
    checkpoint like any scheduler's, so a resumed run continues it exactly.

    Args:
        lr_decay_steps: optimizer steps between two decays; `None` keeps Trainer's own schedule
            (`args.lr_scheduler_type`).
        lr_decay_gamma: multiplicative factor per decay.
        *args, **kwargs: passed to `Trainer`.
    """

    def __init__(self, *args, lr_decay_steps: int | None = 100, lr_decay_gamma: float = 0.9, **kwargs):
        self.lr_decay_steps = lr_decay_steps
        self.lr_decay_gamma = lr_decay_gamma
        super().__init__(*args, **kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_decay_steps is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        self.lr_scheduler = StepDecayLR(
            self.optimizer if optimizer is None else optimizer,
            step_size=self.lr_decay_steps,
            gamma=self.lr_decay_gamma,
            num_warmup_steps=self.args.get_warmup_steps(num_training_steps),
        )
        self._created_lr_scheduler = True
        return self.lr_scheduler
