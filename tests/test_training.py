"""Training: examples/train_hmt.py and hmt_hf.training on a real (tiny, random) backbone folder with a real tokenizer.

The backbone folder holds a tiny Llama and a character-level tokenizer, saved like any Hub checkpoint; the documents
are Python standard-library sources (always present, real text). Runs use one torch thread: on a shared 2-core
machine two threads stall on each other (a 10-step run went from 0.5 s to 13 s).
"""

import importlib.util
import json
import math
import os
import signal
import string
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_backbones import tiny_config
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback

import hmt_hf  # noqa: F401
from hmt_hf import HMTForCausalLM
from hmt_hf.training import (
    DataTrainingArguments,
    HMTArguments,
    apply_stage,
    get_step_decay_schedule,
    hmt_lora_config,
    lora_target_modules,
    plot_loss_curve,
    search_parameters,
    stage_plan,
)

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "train_hmt.py"
STDLIB_DOCUMENTS = [
    "textwrap",
    "string",
    "shlex",
    "fnmatch",
    "glob",
    "bisect",
    "heapq",
    "colorsys",
    "calendar",
    "base64",
]
SEARCH_KEYS = ("memory.memory_search.query_proj.weight", "memory.memory_search.key_proj.weight")


# ---------------------------------------------------------------------------------------------------- fixtures
def train_script():
    """examples/train_hmt.py as a module (its `main(argv, callbacks)` runs in this process)."""
    if "train_hmt" not in sys.modules:
        spec = importlib.util.spec_from_file_location("train_hmt", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["train_hmt"] = module
        spec.loader.exec_module(module)
    return sys.modules["train_hmt"]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A real fast tokenizer, one token per printable ASCII character, with pad/bos/eos/unk."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    characters = sorted(set(string.printable) - set("\x0b\x0c\r"))
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + characters)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A backbone folder (tiny Llama + tokenizer), train/validation jsonl documents, a datasets cache folder."""
    root = tmp_path_factory.mktemp("training")
    torch.manual_seed(0)
    backbone = AutoModelForCausalLM.from_config(tiny_config("llama"))
    backbone.save_pretrained(root / "backbone")
    tokenizer = char_tokenizer()
    assert tokenizer.decode(tokenizer("def f(x):\n\treturn x").input_ids) == "def f(x):\n\treturn x"
    tokenizer.save_pretrained(root / "backbone")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    documents = [(stdlib / f"{name}.py").read_text(encoding="utf-8")[:5000] for name in STDLIB_DOCUMENTS]
    for split, rows in (("train", documents[:8]), ("validation", documents[8:])):
        with open(root / f"{split}.jsonl", "w", encoding="utf-8") as file:
            file.writelines(json.dumps({"text": text}) + "\n" for text in rows)
    return root


pytestmark = pytest.mark.usefixtures("one_thread")


def run_args(workspace: Path, output_dir: Path, **overrides) -> dict:
    """Arguments of a short run: L=16 segments, stage 1 on 2-segment windows, stage 2 on 3-segment windows."""
    args = {
        "model_name_or_path": str(workspace / "backbone"),
        "train_file": str(workspace / "train.jsonl"),
        "validation_file": str(workspace / "validation.jsonl"),
        "cache_dir": str(workspace / "datasets_cache"),
        "output_dir": str(output_dir),
        "segment_length": 16,
        "sensory_memory_size": 4,
        "representation_length": 8,
        "num_memory_embeddings": 4,
        "stage": "both",
        "stage1_bptt_depth": 2,
        "bptt_depth": 3,
        "stage1_max_steps": 6,
        "max_steps": 6,
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 4,
        "learning_rate": 3e-3,
        "lr_decay_steps": 3,
        "lr_decay_gamma": 0.7,
        "logging_steps": 1,
        "save_strategy": "no",
        "eval_strategy": "no",
        "max_eval_samples": 8,
        "report_to": "none",
        "seed": 0,
        "use_cpu": True,
        "do_train": True,
        "do_eval": True,
        "disable_tqdm": True,
    }
    args.update(overrides)
    return args


def write_args(args: dict, path: Path) -> str:
    path.write_text(json.dumps(args))
    return str(path)


def train(workspace: Path, output_dir: Path, callbacks=(), **overrides) -> dict:
    """Run examples/train_hmt.py in this process with a single .json argument file, as users do."""
    args_file = write_args(run_args(workspace, output_dir, **overrides), output_dir.parent / f"{output_dir.name}.json")
    return train_script().main([args_file], callbacks=callbacks)


def subprocess_env() -> dict:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    return env


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def training_logs(folder: Path) -> list[dict]:
    history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
    return [
        {k: entry[k] for k in ("step", "loss", "learning_rate", "grad_norm")} for entry in history if "loss" in entry
    ]


def assert_same_weights(first: dict, second: dict, atol: float = 0.0):
    assert first.keys() == second.keys()
    for name in first:
        torch.testing.assert_close(first[name], second[name], atol=atol, rtol=0.0 if atol == 0 else 1e-4, msg=name)


class RecordInitialWeights(TrainerCallback):
    """Copies of the model's weights and of the optimizer's parameter count when each stage's training begins."""

    def __init__(self):
        self.stages = []

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.stages.append(
            {
                "output_dir": args.output_dir,
                "use_memory_search": model.config.use_memory_search,
                "state": {name: tensor.detach().clone() for name, tensor in model.state_dict().items()},
                "optimized": sum(p.numel() for group in optimizer.param_groups for p in group["params"]),
                "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                "checkpointing": model.is_activation_checkpointing,
            }
        )


# ---------------------------------------------------------------------------------------------------- library pieces
def test_step_decay_schedule_warmup_decay_and_resume():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    schedule = get_step_decay_schedule(optimizer, step_size=3, gamma=0.5, num_warmup_steps=2)
    rates = []
    for _ in range(9):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates == pytest.approx([0.0, 0.5, 1, 1, 1, 0.5, 0.5, 0.5, 0.25])

    # A new scheduler (same arguments) loaded from the state dict continues exactly (what Trainer does on resume).
    resumed_optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    resumed = get_step_decay_schedule(resumed_optimizer, step_size=3, gamma=0.5, num_warmup_steps=2)
    resumed.load_state_dict(schedule.state_dict())
    resumed_optimizer.param_groups[0]["lr"] = resumed.get_last_lr()[0]
    for _ in range(4):
        resumed_optimizer.step()
        resumed.step()
        optimizer.step()
        schedule.step()
        assert resumed.get_last_lr() == schedule.get_last_lr()
    assert schedule.get_last_lr() == pytest.approx([0.125])

    with pytest.raises(ValueError, match="gamma"):
        get_step_decay_schedule(optimizer, gamma=1.5)


def test_hmt_trainer_uses_step_decay_unless_told_otherwise(tmp_path):
    from conftest import make_hmt
    from transformers import TrainingArguments

    from hmt_hf.training import HMTTrainer

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", warmup_steps=5)
    trainer = HMTTrainer(model=make_hmt(), args=args, lr_decay_steps=7, lr_decay_gamma=0.5)
    trainer.create_optimizer_and_scheduler(num_training_steps=100)
    factor = trainer.lr_scheduler.lr_lambdas[0]
    assert [factor(step) for step in (0, 4, 5, 11, 12, 19)] == pytest.approx([0, 0.8, 1, 1, 0.5, 0.25])
    plain = HMTTrainer(model=make_hmt(), args=args, lr_decay_steps=None)
    plain.create_optimizer_and_scheduler(num_training_steps=100)
    linear = plain.lr_scheduler.lr_lambdas[0]  # TrainingArguments' lr_scheduler_type (linear decay to 0)
    assert linear(5) == pytest.approx(1) and linear(100) == pytest.approx(0)


def test_memory_learning_rate_applies_to_the_memory_parameters_only(tmp_path):
    from conftest import make_hmt
    from transformers import TrainingArguments

    from hmt_hf.training import HMTTrainer

    model = make_hmt()
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", learning_rate=1e-4)
    trainer = HMTTrainer(model=model, args=args, lr_decay_steps=2, lr_decay_gamma=0.5, memory_learning_rate=3e-3)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    memory = {id(p) for p in model.memory.parameters()}
    rates = {id(p): group["lr"] for group in trainer.optimizer.param_groups for p in group["params"]}
    assert set(rates) == {id(p) for p in model.parameters()}  # every parameter, once
    assert {rates[i] for i in memory} == {3e-3}
    assert {rate for i, rate in rates.items() if i not in memory} == {1e-4}
    for _ in range(2):  # the schedule decays both alike
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    assert sorted(set(trainer.lr_scheduler.get_last_lr())) == pytest.approx([5e-5, 1.5e-3])
    with pytest.raises(ValueError, match="memory_learning_rate"):
        HMTArguments(memory_learning_rate=0.0)
    with pytest.raises(ValueError, match="memory_learning_rate"):
        HMTTrainer(model=model, args=args, memory_learning_rate=-1e-3)


def test_apply_stage_freezes_only_memory_search_parameters():
    from conftest import make_hmt
    from peft import get_peft_model

    model = make_hmt()
    apply_stage(model, 1)
    assert model.config.use_memory_search is False
    frozen = {id(p) for p in search_parameters(model.memory)}
    assert frozen and all(not p.requires_grad for p in search_parameters(model.memory))
    others = [p for p in model.parameters() if id(p) not in frozen]
    assert all(p.requires_grad for p in others)  # backbone, initial memory: trained in stage 1
    # Stage 1 really leaves them without gradient: nothing is lost by freezing them.
    ids = torch.randint(0, 128, (2, 30))
    model(ids, labels=ids).loss.backward()
    assert model.memory.memory_search.initial_memory.grad is not None
    apply_stage(model, 2)
    assert model.config.use_memory_search is True
    assert all(p.requires_grad for p in model.parameters())

    # With LoRA: stage 2 unfreezes the trained copy of the memory module, never peft's frozen original.
    peft_model = get_peft_model(make_hmt(), hmt_lora_config(make_hmt(), r=2))
    for number in (1, 2):
        apply_stage(peft_model, number)
        trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad and "memory" in n}
        assert all("modules_to_save" in name for name in trainable)
        assert any("query_proj" in name for name in trainable) == (number == 2)
        assert peft_model.get_base_model().config.use_memory_search == (number == 2)
    with pytest.raises(ValueError, match="stage"):
        apply_stage(peft_model, 3)


def test_lora_targets_stay_in_the_backbone():
    from conftest import make_hmt

    model = make_hmt()
    pattern = lora_target_modules(model)
    import re

    matched = [name for name, _ in model.named_modules() if re.fullmatch(pattern, name)]
    assert matched and all(name.startswith("backbone.") for name in matched)
    assert {name.rsplit(".", 1)[-1] for name in matched} == {"q_proj", "v_proj"}  # peft's Llama default
    config = hmt_lora_config(model)
    assert config.modules_to_save == ["memory"] and config.task_type == "CAUSAL_LM"
    with pytest.raises(ValueError, match="No backbone module is named"):
        lora_target_modules(model, ["query_proj"])  # the memory search's projection is not a backbone module


def test_stage_plan_and_argument_errors():
    assert [(s.number, s.bptt_depth, s.use_memory_search) for s in stage_plan("both", 15, 2)] == [
        (1, 2, False),
        (2, 15, True),
    ]
    with pytest.raises(ValueError, match="bptt_depth"):
        HMTArguments(stage="2", bptt_depth=1)
    with pytest.raises(ValueError, match="--stage"):
        HMTArguments(stage="3")
    with pytest.raises(ValueError, match="No data"):
        DataTrainingArguments()


def test_example_argument_file_parses_to_the_paper_recipe():
    model_args, data_args, hmt_args, training_args = train_script().parse_args(
        [str(REPO / "examples/train_args_example.json")]
    )
    assert (hmt_args.stage, hmt_args.stage1_bptt_depth, hmt_args.bptt_depth) == ("both", 2, 15)
    assert (hmt_args.lr_schedule, hmt_args.lr_decay_steps, hmt_args.lr_decay_gamma) == ("step_decay", 100, 0.9)
    assert model_args.model_name_or_path == "smollm2" and training_args.activation_checkpointing
    assert data_args.dataset_name == "data/books" and training_args.do_train and training_args.do_eval


def test_plot_loss_curve_writes_a_png(tmp_path):
    history = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}, {"step": 2, "eval_loss": 2.7}]
    path = plot_loss_curve(history, str(tmp_path / "curve.png"))
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_loss_curve([{"step": 1, "learning_rate": 0.1}], str(tmp_path / "none.png")) is None


# ---------------------------------------------------------------------------------------------------- the script
def test_two_stage_training_carries_weights_and_lowers_heldout_loss(workspace, tmp_path):
    recorder = RecordInitialWeights()
    output = tmp_path / "run"
    results = train(workspace, output, callbacks=[recorder], eval_on_start=True)
    stage1, stage2 = recorder.stages
    assert (stage1["output_dir"], stage2["output_dir"]) == (str(output / "stage1"), str(output / "stage2"))
    assert (stage1["use_memory_search"], stage2["use_memory_search"]) == (False, True)

    # Stage 1 optimizes everything but the memory-search parameters; stage 2 everything.
    search_size = sum(stage1["state"][key].numel() for key in SEARCH_KEYS)
    search_size += stage1["state"]["memory.representation_encoder.summary_prompt"].numel()
    assert stage1["optimized"] == stage1["trainable"] == stage2["trainable"] - search_size
    assert stage2["optimized"] == stage2["trainable"]

    # Stage 2 starts from exactly the weights stage 1 saved; those differ from the start of stage 1, except the
    # frozen memory-search parameters, which only stage 2 changes.
    saved1, saved2 = weights(output / "stage1"), weights(output / "stage2")
    assert_same_weights(saved1, {k: v for k, v in stage2["state"].items() if k in saved1})
    query = "backbone.model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(saved1[query], stage1["state"][query])
    for key in SEARCH_KEYS:
        assert torch.equal(saved1[key], stage1["state"][key])
        assert not torch.equal(saved2[key], saved1[key])
    assert json.loads((output / "stage1" / "config.json").read_text())["use_memory_search"] is False
    assert json.loads((output / "stage2" / "config.json").read_text())["use_memory_search"] is True

    # Held-out loss: lower after each stage than before training; perplexity = exp(eval_loss), as run_clm.
    start_loss = json.loads((output / "stage1" / "trainer_state.json").read_text())["log_history"][0]["eval_loss"]
    assert results["stage1"]["eval_loss"] < start_loss - 0.3
    assert results["stage2"]["eval_loss"] < start_loss - 0.3
    assert results["stage2"]["perplexity"] == pytest.approx(math.exp(results["stage2"]["eval_loss"]))
    eval_results = json.loads((output / "stage2" / "eval_results.json").read_text())
    assert eval_results["perplexity"] == pytest.approx(results["stage2"]["perplexity"])

    # Telemetry of each stage: one record per training step with throughput and memory, and a PNG loss curve.
    for stage in ("stage1", "stage2"):
        records = [json.loads(line) for line in (output / stage / "telemetry.jsonl").read_text().splitlines()]
        steps = [r for r in records if "loss" in r]
        assert [r["step"] for r in steps] == list(range(1, 7))
        assert all(r["train_tokens_per_second"] > 0 and r["peak_memory_mib"] > 0 for r in steps)
        assert [r["num_input_tokens_seen"] for r in steps] == sorted({r["num_input_tokens_seen"] for r in steps})
        assert [r["learning_rate"] for r in steps] == pytest.approx([3e-3] * 3 + [2.1e-3] * 3)  # x0.7 every 3
        assert (output / stage / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"
        assert results[stage]["peak_memory_mib"] > 0 and results[stage]["tokens_per_second"] > 0

    # The result is an ordinary HMT checkpoint.
    reloaded = AutoModelForCausalLM.from_pretrained(output / "stage2")
    assert isinstance(reloaded, HMTForCausalLM) and reloaded.config.segment_length == 16


def test_same_budget_baselines_train_on_the_same_windows(workspace, tmp_path):
    """--method chunked / rmt: the same windows, steps, tokens and LR schedule as the HMT run; chunked trains only
    the backbone (on independent L-token chunks) and saves it alone, RMT never searches and has no sensory memory."""
    runs = {method: tmp_path / method for method in ("hmt", "chunked", "rmt")}
    recorders = {method: RecordInitialWeights() for method in runs}
    results = {method: train(workspace, folder, callbacks=[recorders[method]], method=method)
               for method, folder in runs.items()}  # fmt: skip
    for stage in ("stage1", "stage2"):
        seen = {m: json.loads((runs[m] / stage / "trainer_state.json").read_text())["num_input_tokens_seen"]
                for m in runs}  # fmt: skip
        assert seen["hmt"] == seen["chunked"] == seen["rmt"] > 0
        schedules = {m: [entry["learning_rate"] for entry in training_logs(runs[m] / stage)] for m in runs}
        assert schedules["hmt"] == schedules["chunked"] == schedules["rmt"]

    # Chunked: only the backbone is optimized; the memory stays as initialized; the saved backbone alone is the
    # trained model, and it scores exactly like the HMT checkpoint without memory.
    chunked_start = recorders["chunked"].stages[0]
    memory_size = sum(v.numel() for k, v in chunked_start["state"].items() if k.startswith("memory."))
    backbone_size = sum(v.numel() for k, v in chunked_start["state"].items() if k.startswith("backbone."))
    assert chunked_start["optimized"] == chunked_start["trainable"] == backbone_size and memory_size > 0
    saved = weights(runs["chunked"] / "stage2")
    for key, value in chunked_start["state"].items():
        if key.startswith("memory."):
            assert torch.equal(saved[key], value), key
    backbone = AutoModelForCausalLM.from_pretrained(runs["chunked"] / "backbone").eval()
    hmt = AutoModelForCausalLM.from_pretrained(runs["chunked"] / "stage2").eval()
    assert not isinstance(backbone, HMTForCausalLM)
    ids = torch.randint(3, 60, (1, 16))
    torch.testing.assert_close(backbone(ids).logits, hmt(ids, use_memory=False).logits)
    assert results["chunked"]["stage2"]["eval_loss"] != results["hmt"]["stage2"]["eval_loss"]

    # Each stage folder gets the package's HMT card: the run's budget and held-out perplexity as model-index.
    hmt_card = (runs["hmt"] / "stage2" / "README.md").read_text()
    assert "Hierarchical Memory Transformer" in hmt_card and "model-index" in hmt_card
    assert f"{results['hmt']['stage2']['perplexity']:.3f}" in hmt_card and "6 optimizer steps" in hmt_card
    assert "chunked baseline" in (runs["chunked"] / "stage2" / "README.md").read_text()

    # RMT: no sensory memory, no memory search in either stage, so the search parameters never move.
    assert [stage["use_memory_search"] for stage in recorders["rmt"].stages] == [False, False]
    config = json.loads((runs["rmt"] / "stage2" / "config.json").read_text())
    assert (config["use_sensory_memory"], config["use_memory_search"]) == (False, False)
    rmt_start, rmt_saved = recorders["rmt"].stages[0]["state"], weights(runs["rmt"] / "stage2")
    for key in SEARCH_KEYS:
        assert torch.equal(rmt_saved[key], rmt_start[key])
    assert not torch.equal(
        rmt_saved["memory.memory_search.initial_memory"], rmt_start["memory.memory_search.initial_memory"]
    )


def test_hmt_hf_train_runs_the_script_and_reports_bad_paths_in_one_line(workspace, tmp_path, capsys):
    from hmt_hf.cli import main as cli_main

    args = run_args(workspace, tmp_path / "run", stage="1", stage1_max_steps=2, max_steps=2, do_eval=False)
    assert cli_main(["train", write_args(args, tmp_path / "args.json")]) == 0
    assert (tmp_path / "run" / "model.safetensors").is_file()
    for flag, value in (("model_name_or_path", "/no/such/backbone"), ("train_file", str(tmp_path / "none.jsonl"))):
        bad = {**args, flag: value, "output_dir": str(tmp_path / "bad")}
        capsys.readouterr()
        assert cli_main(["train", write_args(bad, tmp_path / "bad.json")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == f"error: --{flag} {value}: no such file or folder." and "Traceback" not in "".join(err)
        assert not (tmp_path / "bad").exists()


def test_hmt_hf_convert_then_generate(workspace, tmp_path, capsys):
    from hmt_hf.cli import main as cli_main

    out = tmp_path / "hmt"
    flags = ["--model_name_or_path", str(workspace / "backbone"), "--output-dir", str(out), "--segment_length", "16"]
    assert cli_main(["convert", *flags, "--sensory_memory_size", "4", "--attention_sink", "false"]) == 0
    assert "memory parameters" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(model, HMTForCausalLM)
    assert (model.config.segment_length, model.config.sensory_memory_size, model.config.attention_sink) == (
        16,
        4,
        False,
    )
    assert (out / "tokenizer.json").is_file() and "UNTRAINED" in (out / "README.md").read_text()
    # Bad input: one line, exit 2, nothing written.
    assert cli_main(["convert", *flags]) == 2  # the folder is not empty now
    assert "--overwrite_output_dir" in capsys.readouterr().err
    assert cli_main(["convert", "--model_name_or_path", "/no/such", "--output_dir", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == "error: --model_name_or_path /no/such: no such folder."
    assert not (tmp_path / "x").exists()

    # hmt-hf generate on the converted checkpoint: streamed text equals greedy generate, for a prompt from a file
    # that spans several segments (read into memory) and from the command line.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = "def f(x):\n\treturn x * 2\n" * 4  # 88 characters: 5 segments of 16 tokens, and an open one
    (tmp_path / "prompt.txt").write_text(prompt)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    expected = tokenizer.decode(model.eval().generate(ids, max_new_tokens=20, do_sample=False)[0, ids.shape[1] :])
    for source in (["--prompt_file", str(tmp_path / "prompt.txt")], ["--prompt", prompt]):
        assert cli_main(["generate", "--model_name_or_path", str(out), *source, "--max_new_tokens", "20"]) == 0
        assert capsys.readouterr().out.rstrip("\n") == expected.rstrip("\n")
    both = ["--prompt", "a", "--prompt_file", str(tmp_path / "prompt.txt")]
    assert cli_main(["generate", "--model_name_or_path", str(out), *both]) == 2
    assert capsys.readouterr().err.strip() == "error: pass exactly one of --prompt TEXT or --prompt_file PATH."


def test_hmt_hf_evaluate_scores_the_checkpoint_and_its_baselines(workspace, tmp_path, capsys):
    """`hmt-hf evaluate`: the HMT's numbers equal its own forward pass on the same sample; bits per byte is the total
    NLL over the UTF-8 bytes of the scored text; a JSON config file works; bad input is one line, nothing loads."""
    import math

    from transformers import AutoTokenizer

    from hmt_hf.cli import main as cli_main

    out = tmp_path / "hmt"
    assert cli_main(["convert", "--model_name_or_path", str(workspace / "backbone"), "--output_dir", str(out),
                     "--segment_length", "16", "--sensory_memory_size", "4"]) == 0  # fmt: skip
    text = (workspace / "train.jsonl").read_text().splitlines()[0]
    document = json.loads(text)["text"][:400]
    (tmp_path / "doc.txt").write_text(document)
    config = {"model_name_or_path": str(out), "dataset_name": str(tmp_path / "doc.txt"), "lengths": "48",
              "num_samples": 1, "output_dir": str(tmp_path / "eval")}  # fmt: skip
    capsys.readouterr()
    assert cli_main(["evaluate", write_args(config, tmp_path / "eval.json")]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    rows = {(r["model"], r["protocol"]): r for r in metrics["results"]}
    assert len(rows) == 12 and "HMT (paper retrieval)" in printed and (tmp_path / "eval" / "summary.md").is_file()
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    sample = tokenizer(document, return_tensors="pt").input_ids[:, :48]
    with torch.no_grad():
        loss = model(sample, labels=sample).loss.item()
    hmt = rows[("HMT (paper retrieval)", "all_tokens")]
    assert hmt["perplexity"] == pytest.approx(math.exp(loss), rel=1e-4)
    scored_bytes = len(tokenizer.decode(sample[0, 1:]).encode("utf-8"))
    assert hmt["bits_per_byte"] == pytest.approx(loss * 47 / (math.log(2) * scored_bytes), rel=1e-3)
    assert rows[("chunked (the HMT's backbone, L=16)", "all_tokens")]["change_vs_reference"] == 0
    capsys.readouterr()
    for bad, message in (
        (["--dataset_name", str(tmp_path / "none.txt")], f"error: --dataset_name {tmp_path / 'none.txt'}: no such"),
        (["--lengths", "a,b"], "error: --lengths 'a,b': give comma-separated integers"),
    ):
        flags = {"--model_name_or_path": str(out), "--dataset_name": str(tmp_path / "doc.txt")}
        flags.update(dict(zip(bad[::2], bad[1::2])))
        assert cli_main(["evaluate", *[x for pair in flags.items() for x in pair]]) == 2
        assert capsys.readouterr().err.strip().startswith(message)
    assert cli_main(["evaluate", "--model_name_or_path", "/no/such", "--dataset_name", str(tmp_path / "doc.txt")]) == 2
    assert capsys.readouterr().err.strip() == "error: --model_name_or_path /no/such: no such folder."
    plain = str(workspace / "backbone")  # a causal LM that is not an HMT: refused from its config, nothing loads
    assert cli_main(["evaluate", "--model_name_or_path", plain, "--dataset_name", str(tmp_path / "doc.txt")]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("is not an HMT (model_type='llama'); convert it first with `hmt-hf convert`.")
    )


def test_resume_skips_a_checkpoint_that_was_not_saved_completely(tmp_path):
    """A run killed while saving leaves `checkpoint-N` without trainer_state.json; `last` resumes from the newest
    complete one instead of failing."""
    from hmt_hf.training.run import last_complete_checkpoint, resolve_checkpoint

    assert last_complete_checkpoint(str(tmp_path / "missing")) is None
    for step, complete in ((5, True), (10, True), (15, False)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if complete:
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-notes").mkdir()
    assert resolve_checkpoint("last", str(tmp_path), []) == (str(tmp_path / "checkpoint-10"), False)


def test_gradient_accumulation_and_activation_checkpointing_match(workspace, tmp_path):
    """Batch 2 = 2 x 1 with accumulation (Trainer's num_items_in_batch reaches the loss), and activation checkpointing
    changes nothing but memory: same losses and same final weights."""
    common = {"stage": "2", "max_steps": 4, "do_eval": False}
    train(workspace, tmp_path / "batch2", **common)
    train(workspace, tmp_path / "accumulated", per_device_train_batch_size=1, gradient_accumulation_steps=2, **common)
    recorder = RecordInitialWeights()
    train(workspace, tmp_path / "checkpointed", callbacks=[recorder], activation_checkpointing=True, **common)
    assert recorder.stages[0]["checkpointing"] is True
    reference, reference_logs = weights(tmp_path / "batch2"), training_logs(tmp_path / "batch2")
    for other in ("accumulated", "checkpointed"):
        # Adam turns float rounding in tiny gradients into ~1e-6 weight differences; a wrongly scaled loss would
        # show in the gradient norm, which Adam's update hides.
        assert_same_weights(reference, weights(tmp_path / other), atol=1e-5)
        logs = training_logs(tmp_path / other)
        for key in ("loss", "grad_norm"):
            assert [entry[key] for entry in logs] == pytest.approx([entry[key] for entry in reference_logs], rel=1e-5)


def test_bf16_mixed_precision_trains_on_cpu(workspace, tmp_path):
    results = train(workspace, tmp_path / "bf16", stage="2", max_steps=3, bf16=True)
    assert math.isfinite(results["stage2"]["train_loss"]) and math.isfinite(results["stage2"]["eval_loss"])
    state = weights(tmp_path / "bf16")
    assert all(tensor.dtype == torch.float32 for tensor in state.values())  # autocast: weights stay fp32


def test_lora_training_saves_memory_with_adapter_and_merges(workspace, tmp_path):
    """Both stages through LoRA: the memory module is trained and saved with each stage's adapter (stage 1 leaves the
    memory-search parameters as they were), stage 2 continues the stage-1 adapter, AutoPeftModelForCausalLM and
    PeftModel reload it, and merge_and_unload gives a plain HMT with the same logits that saves and reloads."""
    from peft import AutoPeftModelForCausalLM, PeftModel

    output = tmp_path / "lora"
    results = train(
        workspace, output, use_lora=True, lora_r=4, save_merged_model=True, learning_rate=1e-2, stage1_max_steps=3
    )
    assert math.isfinite(results["stage2"]["eval_loss"])
    base = AutoModelForCausalLM.from_pretrained(output / "base_model")
    base_memory = base.memory.state_dict()
    for stage in ("stage1", "stage2"):
        adapter = load_file(str(output / stage / "adapter_model.safetensors"))
        memory = {key.split(".memory.", 1)[1]: value for key, value in adapter.items() if ".memory." in key}
        assert sorted(memory) == sorted(base_memory)  # T, W_q, W_k, initial memory
        assert any("lora_B" in key and value.abs().max() > 0 for key, value in adapter.items())  # trained LoRA
        assert not torch.equal(memory["memory_search.initial_memory"], base_memory["memory_search.initial_memory"])
        search_changed = not torch.equal(
            memory["memory_search.query_proj.weight"], base_memory["memory_search.query_proj.weight"]
        )
        assert search_changed == (stage == "stage2")

    ids = torch.randint(4, 100, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        auto = AutoPeftModelForCausalLM.from_pretrained(output / "stage2").eval()
        logits = auto(input_ids=ids).logits
        peft = PeftModel.from_pretrained(base, output / "stage2").eval()
        torch.testing.assert_close(peft(input_ids=ids).logits, logits, rtol=0, atol=0)
        merged = AutoModelForCausalLM.from_pretrained(output / "merged").eval()
        assert type(merged) is HMTForCausalLM and not any("lora" in name for name, _ in merged.named_modules())
        assert merged.config.use_memory_search is True
        torch.testing.assert_close(merged(ids).logits, logits, rtol=1e-5, atol=1e-5)
        merged.save_pretrained(tmp_path / "resaved")
        resaved = AutoModelForCausalLM.from_pretrained(tmp_path / "resaved").eval()
        torch.testing.assert_close(resaved(ids).logits, merged(ids).logits, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------- resume, processes
CRASHING_RUN = """
import os, sys
sys.path.insert(0, {examples!r})
from transformers import TrainerCallback
import train_hmt

class Crash(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if args.output_dir.endswith("stage2") and state.global_step == {crash_step}:
            os._exit(3)  # a hard crash: no cleanup, no save

train_hmt.main([{args_file!r}], callbacks=[Crash()])
"""


@pytest.mark.slow
def test_resume_after_crash_matches_uninterrupted_run(workspace, tmp_path):
    """A run killed in stage 2 and resumed with --resume_from_checkpoint last ends with the same weights and the same
    loss curve as an uninterrupted run: weights, optimizer, LR schedule, RNG and data order all come back."""
    schedule = {"max_steps": 8, "save_strategy": "steps", "save_steps": 2, "warmup_steps": 2, "lr_decay_steps": 2}
    train(workspace, tmp_path / "uninterrupted", **schedule)

    crashed = tmp_path / "crashed"
    args_file = write_args(run_args(workspace, crashed, **schedule), tmp_path / "crashed.json")
    script = CRASHING_RUN.format(examples=str(SCRIPT.parent), crash_step=5, args_file=args_file)
    done = run_in_own_session([sys.executable, "-c", script], timeout=300)
    assert done.returncode == 3, done.stderr[-3000:]
    assert (crashed / "stage1" / "train_results.json").is_file()
    assert sorted(p.name for p in (crashed / "stage2").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert not (crashed / "stage2" / "model.safetensors").exists()

    train(workspace, crashed, resume_from_checkpoint="last", **schedule)
    for stage in ("stage1", "stage2"):
        assert_same_weights(weights(tmp_path / "uninterrupted" / stage), weights(crashed / stage))
        assert training_logs(crashed / stage) == training_logs(tmp_path / "uninterrupted" / stage)
    rates = [entry["learning_rate"] for entry in training_logs(crashed / "stage2")]
    assert rates == pytest.approx([0, 1.5e-3, 3e-3, 3e-3, 2.1e-3, 2.1e-3, 1.47e-3, 1.47e-3])


@pytest.fixture(scope="module")
def one_process_reference(workspace, tmp_path_factory):
    """Both stages in one process with batch 2: what two processes with batch 1 each must reproduce."""
    output = tmp_path_factory.mktemp("one_process") / "run"
    train(workspace, output, **DISTRIBUTED_RUN)
    return output


DISTRIBUTED_RUN = {"stage1_max_steps": 3, "max_steps": 3, "do_eval": False}


def run_in_own_session(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run `argv` in a new process group; on timeout kill the whole group, so no launcher's worker outlives it."""
    process = subprocess.Popen(
        argv, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{' '.join(argv)} timed out after {timeout} s:\n{stdout[-2000:]}{stderr[-4000:]}")
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def run_two_processes(launcher: list[str], workspace: Path, output: Path):
    args = run_args(workspace, output, per_device_train_batch_size=1, **DISTRIBUTED_RUN)
    args_file = write_args(args, output.parent / "two_processes.json")
    done = run_in_own_session([*launcher, str(SCRIPT), args_file], timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout + done.stderr


def assert_matches_one_process(output: Path, reference: Path, log: str):
    assert "Process rank 0" in log and "Process rank 1" in log and "distributed True" in log
    for stage in ("stage1", "stage2"):
        state = json.loads((output / stage / "trainer_state.json").read_text())
        assert state["train_batch_size"] == 1 and state["global_step"] == 3
        assert_same_weights(weights(reference / stage), weights(output / stage), atol=1e-5)
        reference_losses = [entry["loss"] for entry in training_logs(reference / stage)]
        assert [entry["loss"] for entry in training_logs(output / stage)] == pytest.approx(reference_losses, abs=1e-5)


@pytest.mark.slow
def test_torchrun_two_processes_match_one_process(workspace, tmp_path, one_process_reference):
    """DDP over gloo with 2 processes x batch 1 = 1 process x batch 2, through both stages (stage 1 freezes the
    memory-search parameters, stage 2 wraps the same model in DDP again)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531"]
    log = run_two_processes(launcher, workspace, tmp_path / "torchrun")
    assert_matches_one_process(tmp_path / "torchrun", one_process_reference, log)


@pytest.mark.slow
def test_accelerate_launch_two_cpu_processes_match_one_process(workspace, tmp_path, one_process_reference):
    """`accelerate launch --cpu --num_processes 2` starts ONE process (its CPU launcher goes through mpirun only); two
    CPU processes start with the multi-process launcher, and `--use_cpu` (in the argument file) makes them gloo DDP."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", "29532"]  # fmt: skip
    log = run_two_processes(launcher, workspace, tmp_path / "accelerate")
    assert_matches_one_process(tmp_path / "accelerate", one_process_reference, log)


def test_accelerate_configs_parse():
    import yaml

    folder = REPO / "examples" / "accelerate_configs"
    configs = {path.stem: yaml.safe_load(path.read_text()) for path in folder.glob("*.yaml")}
    assert configs["ddp"]["distributed_type"] == "MULTI_GPU"
    assert configs["fsdp"]["distributed_type"] == "FSDP"
    # No layer class named: accelerate wraps the backbone's _no_split_modules (e.g. LlamaDecoderLayer).
    assert configs["fsdp"]["fsdp_config"]["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert "fsdp_transformer_layer_cls_to_wrap" not in configs["fsdp"]["fsdp_config"]
    deepspeed_json = REPO / configs["deepspeed_zero2"]["deepspeed_config"]["deepspeed_config_file"]
    assert json.loads(deepspeed_json.read_text())["zero_optimization"]["stage"] == 2
    from conftest import make_hmt

    assert make_hmt()._no_split_modules == {"LlamaDecoderLayer"}  # what FSDP wraps, taken from the backbone


def test_small_cpu_argument_file_parses():
    model_args, data_args, hmt_args, training_args = train_script().parse_args(
        [str(REPO / "examples/train_args_cpu_small.json")]
    )
    assert (hmt_args.stage, hmt_args.stage1_bptt_depth, hmt_args.bptt_depth) == ("both", 2, 4)
    assert (hmt_args.stage1_max_steps, training_args.max_steps) == (30, 20)
    assert data_args.dataset_name == "data/books" and data_args.eval_max_length == 2048
