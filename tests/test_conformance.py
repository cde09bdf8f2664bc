"""The same contract, checked on tiny random configs of many decoder-only architectures."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import make_hmt
from tiny_backbones import TINY_BACKBONES
from transformers import AutoModelForCausalLM

ARCHITECTURES = sorted(TINY_BACKBONES)
ATOL = 1e-5


def random_ids(batch=2, length=29, seed=1):
    return torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_loss_and_every_memory_parameter_gets_a_finite_gradient(model_type):
    model = make_hmt(model_type).train()
    ids = random_ids()
    out = model(ids, labels=ids)
    assert out.logits.shape == (2, 29, 128)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    out.loss.backward()
    for name, parameter in model.memory.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, f"{name} got no gradient signal"


@pytest.mark.parametrize("model_type", ARCHITECTURES)
@torch.no_grad()
def test_streaming_in_multiples_of_the_segment_equals_one_call(model_type):
    model = make_hmt(model_type)
    ids = random_ids()
    whole = model(ids)
    first = model(ids[:, :8])
    second = model(ids[:, 8:24], memory=first.memory)
    third = model(ids[:, 24:], memory=second.memory)
    streamed = torch.cat([first.logits, second.logits, third.logits], 1)
    torch.testing.assert_close(streamed, whole.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(third.memory.memories, whole.memory.memories, atol=ATOL, rtol=0)
    assert whole.memory.cache_size.tolist() == [3, 3]


@pytest.mark.parametrize("model_type", ARCHITECTURES)
@pytest.mark.parametrize("side", ["right", "left"])
@torch.no_grad()
def test_padded_batch_equals_each_document_alone(model_type, side):
    model = make_hmt(model_type)
    long_doc, short_doc = random_ids(1, 29, seed=2), random_ids(1, 19, seed=3)
    pad = torch.zeros(1, 10, dtype=torch.long)
    ones, zeros = torch.ones(1, 19, dtype=torch.long), torch.zeros(1, 10, dtype=torch.long)
    if side == "right":
        padded, short_mask, short_slice = torch.cat([short_doc, pad], 1), torch.cat([ones, zeros], 1), slice(0, 19)
    else:
        padded, short_mask, short_slice = torch.cat([pad, short_doc], 1), torch.cat([zeros, ones], 1), slice(10, 29)
    batch = model(
        torch.cat([long_doc, padded]),
        attention_mask=torch.cat([torch.ones(1, 29, dtype=torch.long), short_mask]),
    )
    alone_long, alone_short = model(long_doc), model(short_doc)
    torch.testing.assert_close(batch.logits[0], alone_long.logits[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(batch.logits[1, short_slice], alone_short.logits[0], atol=ATOL, rtol=0)
    assert (batch.logits[1, slice(19, 29) if side == "right" else slice(0, 10)] == 0).all()
    # Padding never enters memory: the short document's state equals its state alone.
    assert batch.memory.cache_size.tolist() == [3, 3]
    torch.testing.assert_close(batch.memory.memories[1], alone_short.memory.memories[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(batch.memory.recent_embeds[1], alone_short.memory.recent_embeds[0])


@pytest.mark.parametrize("model_type", ARCHITECTURES)
@torch.no_grad()
def test_memory_off_is_exactly_the_chunked_backbone(model_type):
    model = make_hmt(model_type)
    ids = random_ids()
    chunked = torch.cat([model.backbone(ids[:, i : i + 8]).logits for i in range(0, 29, 8)], 1)
    assert torch.equal(model(ids, use_memory=False).logits, chunked)


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    """Every architecture saved with save_pretrained, with reference inputs and logits beside it."""
    root = tmp_path_factory.mktemp("saved")
    saved = {}
    for model_type in ARCHITECTURES:
        model = make_hmt(model_type)
        path = root / model_type
        model.save_pretrained(path)
        ids = random_ids()
        with torch.no_grad():
            generated = model.generate(ids[:1, :13], max_new_tokens=12, do_sample=False, pad_token_id=0)
            torch.save({"ids": ids, "logits": model(ids).logits, "generated": generated}, path / "reference.pt")
        saved[model_type] = path
    return saved


@pytest.mark.parametrize("model_type", ARCHITECTURES)
@torch.no_grad()
def test_save_and_load_with_auto_class_gives_identical_logits(model_type, saved_models):
    path = saved_models[model_type]
    files = set(os.listdir(path))
    expected = {"model.safetensors", "config.json", "configuration_hmt.py", "modeling_hmt.py", "memory_hmt.py"}
    assert expected | {"generation_hmt.py"} <= files
    config = json.loads((path / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_hmt.HMTConfig",
        "AutoModelForCausalLM": "modeling_hmt.HMTForCausalLM",
    }
    assert config["text_config"]["model_type"] == model_type
    loaded = AutoModelForCausalLM.from_pretrained(path).eval()
    assert type(loaded).__name__ == "HMTForCausalLM"
    reference = torch.load(path / "reference.pt")
    assert torch.equal(loaded(reference["ids"]).logits, reference["logits"])


REMOTE_LOAD = """
import json, sys, torch
sys.modules["hmt_hf"] = None  # the package cannot be imported in this process
from transformers import AutoModelForCausalLM
results = {}
for name, path in json.loads(sys.argv[1]).items():
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    reference = torch.load(path + "/reference.pt")
    with torch.no_grad():
        logits = model(reference["ids"]).logits
        generated = model.generate(reference["ids"][:1, :13], max_new_tokens=12, do_sample=False, pad_token_id=0)
    results[name] = {
        "module": type(model).__module__,
        "max_abs_diff": (logits - reference["logits"]).abs().max().item(),
        "same_generation": torch.equal(generated, reference["generated"]),
    }
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def remote_code_results(saved_models, tmp_path_factory):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path_factory.mktemp("modules"))}
    paths = json.dumps({name: str(path) for name, path in saved_models.items()})
    run = subprocess.run(
        [sys.executable, "-c", REMOTE_LOAD, paths], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_remote_code_load_without_the_package(model_type, remote_code_results):
    result = remote_code_results[model_type]
    assert result["module"].startswith("transformers_modules."), result
    assert result["max_abs_diff"] == 0.0
    assert result["same_generation"]
