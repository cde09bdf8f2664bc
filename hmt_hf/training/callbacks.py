"""Training telemetry: throughput, peak memory, a JSON-lines log and a PNG loss curve per run.

Trainer's own reporting (`report_to`, the tqdm progress bar, `log_history`) is left as it is; this callback only
reads what Trainer logs and writes two files of its own in `output_dir`.
"""

from __future__ import annotations

import json
import math
import os
import time

from transformers import TrainerCallback

from ..peak_memory import peak_memory_mib, reset_peak_memory

TELEMETRY_FILE = "telemetry.jsonl"
LOSS_CURVE_FILE = "loss_curve.png"


class TelemetryCallback(TrainerCallback):
    """Records tokens/s, steps/s and peak memory at every training log, and plots the loss curve at the end.

    Files written by the main process in `args.output_dir` (a resumed run appends to the same files):

    - `telemetry.jsonl`: one JSON object per Trainer log: `{"step", "epoch", "elapsed_seconds", ...}` plus, for a
      training log, `loss`, `learning_rate`, `grad_norm`, `tokens_seen`, `tokens_per_second` and
      `steps_per_second` over the interval since the previous log, `peak_memory_mib` and `peak_memory_source`;
      for an evaluation log, its `eval_*` metrics and `eval_perplexity = exp(eval_loss)`.
    - `loss_curve.png`: training loss (and evaluation loss, when there is any) against the optimizer step, from
      `state.log_history`, written at the end of training.

    Tokens are counted by Trainer: set `TrainingArguments(include_num_input_tokens_seen="non_padding")` (the
    training script does, unless told otherwise); without it `tokens_per_second` is absent. On a CUDA device the
    peak is `torch.cuda.max_memory_allocated`, on CPU the process's peak RSS, both since training began
    (`hmt_hf.peak_memory`).

    After training, `summary()` gives the run's `tokens_per_second`, `peak_memory_mib` and the paths written.
    """

    def __init__(self, plot: bool = True):
        self.plot = plot
        self._start_time = None
        self._last_time = None
        self._last_step = 0
        self._last_tokens = 0
        self._start_tokens = 0
        self._device = None
        self._output_dir = None
        self._plot_path = None
        self._peak_since_start = False

    def on_train_begin(self, args, state, control, **kwargs):
        self._device = args.device
        self._output_dir = args.output_dir
        self._peak_since_start = reset_peak_memory(self._device)
        self._start_time = self._last_time = time.perf_counter()
        self._last_step = state.global_step  # a resumed run starts from its checkpoint's step and token count
        self._start_tokens = self._last_tokens = state.num_input_tokens_seen

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        now = time.perf_counter()
        record = {"step": state.global_step, "epoch": state.epoch}
        if self._start_time is not None:
            record["elapsed_seconds"] = round(now - self._start_time, 3)
        record.update({key: value for key, value in logs.items() if isinstance(value, (int, float, str))})
        if "eval_loss" in logs:
            record["eval_perplexity"] = _perplexity(logs["eval_loss"])
        if "loss" in logs and self._last_time is not None:
            seconds = max(now - self._last_time, 1e-9)
            steps = state.global_step - self._last_step
            record["steps_per_second"] = round(steps / seconds, 4)
            if args.include_num_input_tokens_seen not in ("no", False, None):
                tokens = state.num_input_tokens_seen
                record["tokens_seen"] = tokens
                record["tokens_per_second"] = round((tokens - self._last_tokens) / seconds, 2)
                self._last_tokens = tokens
            memory, source = peak_memory_mib(self._device, since_reset=self._peak_since_start)
            record["peak_memory_mib"] = round(memory, 1)
            record["peak_memory_source"] = source
            self._last_time, self._last_step = now, state.global_step
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, TELEMETRY_FILE), "a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.plot:
            self._plot_path = plot_loss_curve(state.log_history, os.path.join(args.output_dir, LOSS_CURVE_FILE))

    def summary(self) -> dict:
        """`tokens_per_second` over this run (absent without token counting), `peak_memory_mib`,
        `peak_memory_source`, and the paths of the files written."""
        result = {}
        if self._start_time is not None:
            seconds = max(time.perf_counter() - self._start_time, 1e-9)
            if self._last_tokens > self._start_tokens:
                result["tokens_per_second"] = round((self._last_tokens - self._start_tokens) / seconds, 2)
            memory, source = peak_memory_mib(self._device, since_reset=self._peak_since_start)
            result["peak_memory_mib"] = round(memory, 1)
            result["peak_memory_source"] = source
        if self._output_dir is not None:
            result["telemetry_file"] = os.path.join(self._output_dir, TELEMETRY_FILE)
        if self._plot_path is not None:
            result["loss_curve_file"] = self._plot_path
        return result


def _perplexity(loss: float) -> float:
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")


def plot_loss_curve(log_history: list[dict], path: str, title: str | None = None) -> str | None:
    """Plot training (and evaluation) loss against the step from Trainer's `log_history` into the PNG `path`.

    Returns the path, or None when the history holds no loss to plot.
    """
    train = [(entry["step"], entry["loss"]) for entry in log_history if "loss" in entry and "step" in entry]
    evaluation = [
        (entry["step"], entry["eval_loss"]) for entry in log_history if "eval_loss" in entry and "step" in entry
    ]
    if not train and not evaluation:
        return None
    # A bare Figure renders with Agg without pyplot: no global backend switch, no display needed.
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.2), dpi=110)
    axes = figure.add_subplot()
    if train:
        axes.plot(*zip(*train), label="training loss", color="tab:blue", linewidth=1.2)
    if evaluation:
        axes.plot(*zip(*evaluation), label="evaluation loss", color="tab:orange", marker="o", linewidth=1.2)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("loss (nats / token)")
    axes.set_title(title or os.path.basename(os.path.dirname(os.path.abspath(path))))
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path)
    return path
