"""Training telemetry: peak memory beside Trainer's own logs (throughput included), in a JSON-lines log, and a PNG
loss curve per run.

Trainer's own reporting (`report_to`, the tqdm progress bar, `log_history`) is left as it is; this callback only
reads what Trainer logs and writes two files of its own in `output_dir`.
"""

from __future__ import annotations

import json
import math
import os

from transformers import TrainerCallback

from ..peak_memory import peak_memory_mib, reset_peak_memory

TELEMETRY_FILE = "telemetry.jsonl"
LOSS_CURVE_FILE = "loss_curve.png"


class TelemetryCallback(TrainerCallback):
    """Adds peak memory (and the evaluation perplexity) to every Trainer log, keeps them in a JSON-lines file, and
    plots the loss curve at the end. Throughput is Trainer's own: with `include_num_input_tokens_seen` on (the
    training script turns it on), every training log carries `num_input_tokens_seen`, `train_runtime` and
    `train_tokens_per_second` (over this session, since training (re)started).

    Files written by the main process in `args.output_dir` (a resumed run appends to the same files):

    - `telemetry.jsonl`: one JSON object per Trainer log: the log's values plus `step`, `epoch`, and for a training
      log `peak_memory_mib` and `peak_memory_source`, for an evaluation log `eval_perplexity = exp(eval_loss)`.
    - `loss_curve.png`: training (and evaluation) loss against the optimizer step, from `state.log_history`.

    On a CUDA device the peak is `torch.cuda.max_memory_allocated`, on CPU the process's peak RSS, both since training
    began (`hmt_hf.peak_memory`). After training, `summary()` gives `tokens_per_second` (Trainer's last),
    `peak_memory_mib` and the paths written.
    """

    def __init__(self, plot: bool = True):
        self.plot = plot
        self._device = None
        self._output_dir = None
        self._plot_path = None
        self._peak_since_start = False
        self._tokens_per_second = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._device = args.device
        self._output_dir = args.output_dir
        self._peak_since_start = reset_peak_memory(self._device)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch}
        record.update({key: value for key, value in logs.items() if isinstance(value, (int, float, str))})
        if "eval_loss" in logs:
            record["eval_perplexity"] = _perplexity(logs["eval_loss"])
        if "loss" in logs and self._device is not None:
            memory, record["peak_memory_source"] = peak_memory_mib(self._device, since_reset=self._peak_since_start)
            record["peak_memory_mib"] = round(memory, 1)
        self._tokens_per_second = logs.get("train_tokens_per_second", self._tokens_per_second)
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, TELEMETRY_FILE), "a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.plot:
            self._plot_path = plot_loss_curve(state.log_history, os.path.join(args.output_dir, LOSS_CURVE_FILE))

    def summary(self) -> dict:
        """`tokens_per_second` (Trainer's, at its last log; absent without token counting), `peak_memory_mib`,
        `peak_memory_source`, and the paths of the files written."""
        result = {}
        if self._tokens_per_second:
            result["tokens_per_second"] = self._tokens_per_second
        if self._device is not None:
            memory, result["peak_memory_source"] = peak_memory_mib(self._device, since_reset=self._peak_since_start)
            result["peak_memory_mib"] = round(memory, 1)
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
