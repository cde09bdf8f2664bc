"""`HMTTrainer`: transformers' `Trainer` with the paper's step-decay learning-rate schedule and an optional learning
rate of its own for the memory parameters."""

from __future__ import annotations

import math

from transformers import Trainer
from transformers.utils import logging

from .schedule import get_step_decay_schedule

logger = logging.get_logger(__name__)


class HMTTrainer(Trainer):
    """A `Trainer` whose LR schedule is, by default, the paper's: linear warm-up over `args.warmup_steps` (none by
    default), then the LR times `lr_decay_gamma` every `lr_decay_steps` optimizer steps ([`get_step_decay_schedule`]).

    Everything else is `Trainer` (optimizer, mixed precision, activation checkpointing, DDP/FSDP/DeepSpeed through
    accelerate, checkpoints and `resume_from_checkpoint`, `report_to`). The schedule's state is saved in every
    checkpoint like any scheduler's, so a resumed run continues it exactly.

    Args:
        lr_decay_steps: optimizer steps between two decays; `None` keeps Trainer's own schedule
            (`args.lr_scheduler_type`).
        lr_decay_gamma: multiplicative factor per decay.
        use_memory: `False` trains and evaluates the plain chunked backbone (every call gets `use_memory=False`):
            the same-budget baseline of an HMT run.
        memory_learning_rate: peak learning rate of the parameters HMT adds (`model.memory`: T, W_q, W_k, the
            initial memory, the search temperature and the memory gain); `None` uses `args.learning_rate`. They start
            from scratch while the backbone is fine-tuned, so at a fine-tuning LR they barely move (see
            `create_optimizer`). The schedule scales both learning rates alike.
        *args, **kwargs: passed to `Trainer`.
    """

    def __init__(
        self,
        *args,
        lr_decay_steps: int | None = 100,
        lr_decay_gamma: float = 0.9,
        use_memory: bool = True,
        memory_learning_rate: float | None = None,
        **kwargs,
    ):
        if memory_learning_rate is not None and not memory_learning_rate > 0:
            raise ValueError(f"memory_learning_rate={memory_learning_rate} must be > 0 (or None).")
        self.memory_learning_rate = memory_learning_rate
        self.lr_decay_steps = lr_decay_steps
        self.lr_decay_gamma = lr_decay_gamma
        self.use_memory = use_memory
        super().__init__(*args, **kwargs)

    def _unwrapped(self, model=None):
        """The model itself (an `HMTForCausalLM` in an HMT run), out of accelerate's wrappers and PEFT."""
        model = self.accelerator.unwrap_model(self.model if model is None else model)
        return model.get_base_model() if hasattr(model, "get_base_model") else model

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
        model = self._unwrapped()
        if getattr(model.config, "loss_on_last_segment_only", False) and hasattr(model, "scored_targets"):
            batch_samples = [
                {**batch, "shift_labels": model.scored_targets(batch["labels"], batch.get("attention_mask"))}
                if "labels" in batch
                else batch
                for batch in batch_samples
            ]
        return super()._get_num_items_in_batch(batch_samples, device)

    def create_optimizer(self, model=None):
        """Trainer's optimizer, with the memory parameters in param groups of their own at `memory_learning_rate`.

        Measured on SmolLM2-135M (240 stage-2 steps at the backbone's 5e-5): W_q and W_k moved by 1.5% of their norm
        and the search temperature by 0.01%, so memory search stayed uniform (`reports/books_cpu_240`)."""
        if self.optimizer is not None or self.memory_learning_rate is None:
            return super().create_optimizer(model)
        optimizer = super().create_optimizer(model)
        hmt = self._unwrapped(model)
        memory = {id(p) for p in hmt.memory.parameters()}
        if not any(id(p) in memory for group in optimizer.param_groups for p in group["params"]):
            if any(p.requires_grad for p in hmt.memory.parameters()):
                logger.warning(
                    "memory_learning_rate=%s is not applied: no memory parameter is in this optimizer's groups (a "
                    "custom or layer-wise optimizer, or FSDP without use_orig_params).",
                    self.memory_learning_rate,
                )
            return optimizer
        groups = list(optimizer.param_groups)
        optimizer.param_groups.clear()
        for group in groups:
            for in_memory in (False, True):
                params = [p for p in group["params"] if (id(p) in memory) is in_memory]
                if params:
                    lr = self.memory_learning_rate if in_memory else group["lr"]
                    optimizer.add_param_group({**group, "params": params, "lr": lr})
        return optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_decay_steps is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        self.lr_scheduler = get_step_decay_schedule(
            self.optimizer if optimizer is None else optimizer,
            step_size=self.lr_decay_steps,
            gamma=self.lr_decay_gamma,
            num_warmup_steps=self.args.get_warmup_steps(num_training_steps),
        )
        self._created_lr_scheduler = True
        return self.lr_scheduler

    def create_model_card(self, language=None, license=None, tags=None, model_name=None, finetuned_from=None,
                          tasks=None, dataset_tags=None, dataset=None, dataset_args=None):  # fmt: skip
        """The HMT card of `hmt_hf.hub.create_model_card` (configuration, parameter overhead, this run's training
        budget and held-out perplexity as `model-index`) instead of Trainer's generic one; `push_to_hub` uploads it."""
        model = self._unwrapped()
        if not self.is_world_process_zero() or getattr(model.config, "model_type", None) != "hmt":
            return super().create_model_card(language, license, tags, model_name, finetuned_from, tasks,
                                             dataset_tags, dataset, dataset_args)  # fmt: skip
        import os

        from ..data.documents import looks_like_local_path
        from ..hub import create_model_card

        datasets = [d for d in ([dataset] if isinstance(dataset, str) else dataset or []) if d]
        hub_datasets = [d for d in datasets if not looks_like_local_path(d) and not os.path.exists(d)]
        base_model = finetuned_from or getattr(model.config.text_config, "_name_or_path", None)
        if base_model and (looks_like_local_path(base_model) or os.path.exists(base_model)):
            base_model = None
        history = self.state.log_history
        train = next((entry for entry in reversed(history) if "train_runtime" in entry), {})
        evaluation = next((entry for entry in reversed(history) if "eval_loss" in entry), None)
        what = (
            "The same-budget **chunked baseline**: the backbone trained on independent "
            f"{model.config.segment_length}-token chunks (HMT forward with `use_memory=False`; memory unused)"
            if not self.use_memory
            else f"HMT training with memory search {'on' if model.config.use_memory_search else 'off'}"
        )
        training_text = (
            f"{what}, with `hmt_hf` (`hmt-hf train`): {self.state.global_step} optimizer steps, "
            f"{int(self.state.num_input_tokens_seen or 0):,} tokens, {train.get('train_runtime', 0):.0f} s of "
            f"training; AdamW, learning rate {self.args.learning_rate}"
            + (f" (memory parameters {self.memory_learning_rate})" if self.memory_learning_rate is not None else "")
            + f", batch {self.args.per_device_train_batch_size}"
            f" x {self.args.gradient_accumulation_steps} accumulation x {self.args.world_size} processes; data: "
            f"{', '.join(datasets) or 'not recorded'}."
        )
        results, evaluation_text = [], None
        if evaluation is not None:
            perplexity = math.exp(min(evaluation["eval_loss"], 700))
            results.append({
                "dataset_name": datasets[0] if datasets else "held-out documents", "dataset_split": "validation",
                "metric_type": "perplexity", "metric_value": round(perplexity, 3),
                "metric_name": "held-out perplexity, every token (paper retrieval mode)",
            })  # fmt: skip
            evaluation_text = (
                f"Held-out perplexity {perplexity:.3f} (every token of the validation documents, in pieces; "
                f"retrieval mode `{model.config.retrieval_mode}`), after step {evaluation.get('step')}."
            )
        card = create_model_card(
            model,
            self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir)),
            base_model=base_model,
            datasets=hub_datasets or None,
            eval_results=results,
            training_text=training_text,
            evaluation_text=evaluation_text,
            license=license,
            tags=[tags] if isinstance(tags, str) else tags,
        )
        card.save(os.path.join(self.args.output_dir, "README.md"))
