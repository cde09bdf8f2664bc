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
        use_memory: `False` trains and evaluates the plain chunked backbone (every call gets `use_memory=False`):
            the same-budget baseline of an HMT run.
        *args, **kwargs: passed to `Trainer`.
    """

    def __init__(
        self,
        *args,
        lr_decay_steps: int | None = 100,
        lr_decay_gamma: float = 0.9,
        use_memory: bool = True,
        **kwargs,
    ):
        self.lr_decay_steps = lr_decay_steps
        self.lr_decay_gamma = lr_decay_gamma
        self.use_memory = use_memory
        super().__init__(*args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs: bool = False, **kwargs):
        if not self.use_memory:
            inputs = {**inputs, "use_memory": False}
        if "labels" in inputs and (model.training or self.args.prediction_loss_only):
            # Only the loss is used: the model then keeps one position's logits, not (B, T, V) beside the loss.
            inputs = {"logits_to_keep": 1, **inputs}
        return super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)

    def _get_num_items_in_batch(self, batch_samples: list, device):
        # Trainer counts every label; an HMT scoring only each window's last segment divides its summed loss by
        # this count, so count what it scores (then the logged loss is a mean and accumulation stays exact).
        model = self.accelerator.unwrap_model(self.model)
        model = model.get_base_model() if hasattr(model, "get_base_model") else model
        if getattr(model.config, "loss_on_last_segment_only", False) and hasattr(model, "scored_targets"):
            batch_samples = [
                {**batch, "shift_labels": model.scored_targets(batch["labels"], batch.get("attention_mask"))}
                if "labels" in batch
                else batch
                for batch in batch_samples
            ]
        return super()._get_num_items_in_batch(batch_samples, device)

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
