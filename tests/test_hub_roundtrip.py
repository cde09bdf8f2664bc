"""push_to_hub, then loading from the Hub with trust_remote_code where hmt_hf is not installed, over real HTTP.

A Hub-compatible server (`tests/hub_server.py`) runs on loopback; fresh processes talk to it with the real
huggingface_hub/transformers client code, configured only through the environment (`HF_ENDPOINT`, `HF_TOKEN`), as a
user's would be. Any request that is not for the loopback server goes to a dead proxy and fails, so nothing here can
reach the real Hub.
"""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml
from hub_server import HubServer
from safetensors.torch import load as load_safetensors

REPO_ROOT = Path(__file__).resolve().parents[1]
REPO_ID = "test-user/tiny-hmt"
REMOTE_CODE_FILES = ("configuration_hmt.py", "modeling_hmt.py", "memory_hmt.py", "generation_hmt.py")
TEXT = (
    "to be or not to be that is the question whether tis nobler in the mind to suffer the slings and arrows of "
    "outrageous fortune or to take arms against a sea of troubles and by opposing end them"
)
# Variables that would point the client at another cache, token or endpoint than the ones the tests set.
CLIENT_VARIABLES = (
    "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_MODULES_CACHE", "HF_XET_CACHE",
    "HF_TOKEN_PATH", "HUGGING_FACE_HUB_TOKEN", "TRANSFORMERS_OFFLINE", "HF_HUB_ENABLE_HF_TRANSFER", "PYTHONPATH",
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "NO_PROXY", "no_proxy",
)  # fmt: skip

PUSH = """
import json, sys
import torch
from conftest import make_hmt
from huggingface_hub import HfApi, constants
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hmt_hf.hub import create_model_card

repo_id, text, reference_path = sys.argv[1:4]
specials = ["<pad>", "<s>", "</s>", "<unk>"]
vocab = {token: index for index, token in enumerate(specials + sorted(set(text.split())))}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
)
model = make_hmt()
ids = tokenizer(text, return_tensors="pt").input_ids
with torch.no_grad():
    logits = model(ids).logits
    generated = model.generate(ids[:, :13], max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
torch.save({"ids": ids, "logits": logits, "generated": generated}, reference_path)

model.push_to_hub(repo_id)
tokenizer.push_to_hub(repo_id)
card = create_model_card(
    model,
    repo_id=repo_id,
    datasets=["pg19"],
    eval_results=[{"dataset_name": "pg19", "metric_type": "perplexity", "metric_value": 99.5}],
)
card.push_to_hub(repo_id)

api = HfApi()
info = api.model_info(repo_id)
print(json.dumps({
    "endpoint": constants.ENDPOINT,
    "tokenizer_class": type(tokenizer).__name__,
    "library_name": info.card_data.library_name,
    "tags": info.tags,
    "sha": info.sha,
    "files": api.list_repo_files(repo_id),
}))
"""

LOAD = """
import json, sys
sys.modules["hmt_hf"] = None  # the package cannot be imported in this process
try:
    import hmt_hf  # noqa: F401
    package_importable = True
except ImportError:
    package_importable = False
import torch
from huggingface_hub import constants, snapshot_download
from transformers import AutoModelForCausalLM, AutoTokenizer

repo_id, text, output_path = sys.argv[1:4]
model = AutoModelForCausalLM.from_pretrained(repo_id, trust_remote_code=True).eval()
# AutoTokenizer reads config.json too, whose auto_map asks for trust_remote_code (or an interactive prompt).
tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)
ids = tokenizer(text, return_tensors="pt").input_ids
with torch.no_grad():
    logits = model(ids).logits
    generated = model.generate(ids[:, :13], max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
torch.save({"ids": ids, "logits": logits, "generated": generated}, output_path)
print()
print(json.dumps({
    "endpoint": constants.ENDPOINT,
    "package_importable": package_importable,
    "model_module": type(model).__module__,
    "model_class": type(model).__name__,
    "tokenizer_class": type(tokenizer).__name__,
    "snapshot": snapshot_download(repo_id),
}))
"""


PUSH_WITH_CLI = (
    PUSH.split("model.push_to_hub(repo_id)")[0]
    + """
from hmt_hf.cli import main
folder = reference_path + ".checkpoint"
model.save_pretrained(folder)
tokenizer.save_pretrained(folder)
create_model_card(model, repo_id=folder.rsplit("/", 1)[-1], training_text="Trained in a test.").save(folder + "/README.md")
assert main(["push", "--model_name_or_path", folder, "--repo_id", repo_id]) == 0
print(json.dumps({"tokenizer_class": type(tokenizer).__name__}))
"""
)


def run_against_hub(
    script: str, hub: HubServer, home: Path, cwd: Path, pythonpath: str | None = None, repo_id: str = REPO_ID
) -> dict:
    """Run `script` in a fresh interpreter whose only Hub is `hub`, with an empty cache in `home`; its last stdout
    line is JSON."""
    env = {key: value for key, value in os.environ.items() if key not in CLIENT_VARIABLES}
    env |= {
        "HF_ENDPOINT": hub.endpoint,
        "HF_TOKEN": hub.token,
        "HF_HOME": str(home),
        "HF_HUB_OFFLINE": "0",  # CI sets 1 globally; the only Hub these processes can see is the loopback server
        "HF_HUB_DISABLE_XET": "1",  # the server speaks LFS, not Xet (see hub_server.py)
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        # Anything but the loopback server goes to a closed port and fails instead of leaving the machine.
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    run = subprocess.run(
        [sys.executable, "-c", script, repo_id, TEXT, str(home / "tensors.pt")],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,  # a trust_remote_code prompt fails at once instead of waiting for an answer
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, f"{run.stderr[-4000:]}\nserver errors: {hub.errors}"
    assert not hub.errors, hub.errors
    assert "Do you wish to run the custom code?" not in run.stdout
    return {**json.loads(run.stdout.strip().splitlines()[-1]), "tensors": torch.load(home / "tensors.pt")}


@pytest.fixture(scope="module")
def hub():
    with HubServer() as server:
        yield server


@pytest.fixture(scope="module")
def pushed(hub, tmp_path_factory):
    """The tiny HMT, its tokenizer and its model card pushed with `push_to_hub`, by a process that imports hmt_hf
    from this checkout."""
    home = tmp_path_factory.mktemp("push_home")
    pythonpath = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")])
    return run_against_hub(PUSH, hub, home, cwd=REPO_ROOT, pythonpath=pythonpath)


@pytest.fixture(scope="module")
def loaded(hub, pushed, tmp_path_factory):
    """The pushed repo loaded back by a fresh process that cannot import hmt_hf, from outside the checkout."""
    home = tmp_path_factory.mktemp("load_home")
    start = len(hub.requests)
    result = run_against_hub(LOAD, hub, home, cwd=home)
    return {**result, "requests": hub.requests[start:]}


@pytest.mark.slow
def test_push_to_hub_uploads_weights_config_tokenizer_and_remote_code(hub, pushed):
    assert pushed["endpoint"] == hub.endpoint
    files = hub.list_files(REPO_ID)
    expected = {".gitattributes", "README.md", "config.json", "generation_config.json", "model.safetensors"}
    assert expected | {"tokenizer.json", "tokenizer_config.json"} | set(REMOTE_CODE_FILES) <= set(files)
    assert pushed["files"] == files  # list_repo_files, through the tree API
    config = json.loads(hub.read_file(REPO_ID, "config.json"))
    assert config["model_type"] == "hmt" and config["architectures"] == ["HMTForCausalLM"]
    assert config["auto_map"] == {
        "AutoConfig": "configuration_hmt.HMTConfig",
        "AutoModelForCausalLM": "modeling_hmt.HMTForCausalLM",
    }
    for name in REMOTE_CODE_FILES:
        assert hub.read_file(REPO_ID, name) == (REPO_ROOT / "hmt_hf" / name).read_bytes(), name
    # The weights went through the LFS batch API and the storage origin, as large files do on the Hub.
    assert hub.lfs_files(REPO_ID) == ["model.safetensors"]
    assert ("storage", "PUT", f"/upload/{hub.lfs_oid(REPO_ID, 'model.safetensors')}", 200) in hub.requests
    weights = load_safetensors(hub.read_file(REPO_ID, "model.safetensors"))
    assert any(key.startswith("memory.") for key in weights) and any(key.startswith("backbone.") for key in weights)
    reference = pushed["tensors"]["logits"]
    assert weights["backbone.lm_head.weight"].shape[0] == reference.shape[-1]


@pytest.mark.slow
def test_model_card_pushed_with_hub_metadata(hub, pushed):
    readme = hub.read_file(REPO_ID, "README.md").decode()
    metadata = yaml.safe_load(readme.split("---")[1])
    assert metadata["library_name"] == "transformers" and metadata["pipeline_tag"] == "text-generation"
    assert {"hmt", "custom_code"} <= set(metadata["tags"]) and metadata["datasets"] == ["pg19"]
    assert metadata["model-index"][0]["results"][0]["metrics"][0]["value"] == 99.5
    assert f'from_pretrained("{REPO_ID}", trust_remote_code=True)' in readme
    # model_info, as another client sees it.
    assert pushed["library_name"] == "transformers" and "hmt" in pushed["tags"]
    assert pushed["sha"] == hub.head(REPO_ID)


@pytest.mark.slow
def test_load_from_the_hub_with_trust_remote_code_and_without_the_package(hub, pushed, loaded):
    assert loaded["endpoint"] == hub.endpoint
    assert loaded["package_importable"] is False
    assert loaded["model_module"].startswith("transformers_modules.") and loaded["model_class"] == "HMTForCausalLM"
    assert loaded["tokenizer_class"] == pushed["tokenizer_class"]  # PreTrainedTokenizerFast (TokenizersBackend in v5)
    reference, remote = pushed["tensors"], loaded["tensors"]
    assert remote["ids"].shape == (1, len(TEXT.split())) and torch.equal(remote["ids"], reference["ids"])
    # Same weights, but tensors loaded from safetensors sit at other alignments than freshly built ones, so CPU
    # kernels may round differently in the last bits (a local save_pretrained/from_pretrained shows the same ~6e-8).
    torch.testing.assert_close(remote["logits"], reference["logits"], rtol=0, atol=1e-6)
    assert torch.equal(remote["generated"], reference["generated"])
    # Every file came over HTTP from the server: the weights by the Hub's redirect to storage.
    resolved = {
        path.split("/resolve/", 1)[1].split("/", 1)[1]
        for _, method, path, _ in loaded["requests"]
        if method == "GET" and "/resolve/" in path
    }
    assert {"config.json", "tokenizer.json", *REMOTE_CODE_FILES} <= resolved
    weights_oid = hub.lfs_oid(REPO_ID, "model.safetensors")
    assert any(
        "/resolve/" in path and path.endswith("/model.safetensors") and status == 302
        for _, _, path, status in loaded["requests"]
    )
    assert ("storage", "GET", f"/objects/{weights_oid}", 200) in loaded["requests"]
    # snapshot_download: the whole repo, byte for byte.
    snapshot = Path(loaded["snapshot"])
    files = hub.list_files(REPO_ID)
    assert sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file()) == files
    for name in files:
        assert (snapshot / name).read_bytes() == hub.read_file(REPO_ID, name), name


@pytest.mark.slow
def test_hmt_hf_push_then_load_without_the_package(hub, tmp_path):
    """`hmt-hf push` of a checkpoint folder, then a fresh process without hmt_hf loads it: same logits and
    generation; the card names the repository, not the local folder, and training leftovers stay behind."""
    repo = "test-user/pushed-with-cli"
    (tmp_path / "push").mkdir()
    (tmp_path / "load").mkdir()
    pythonpath = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")])
    pushed = run_against_hub(PUSH_WITH_CLI, hub, tmp_path / "push", REPO_ROOT, pythonpath, repo_id=repo)
    loaded = run_against_hub(LOAD, hub, tmp_path / "load", tmp_path, repo_id=repo)
    assert loaded["package_importable"] is False and loaded["model_class"] == "HMTForCausalLM"
    torch.testing.assert_close(loaded["tensors"]["logits"], pushed["tensors"]["logits"], rtol=0, atol=1e-6)
    assert torch.equal(loaded["tensors"]["generated"], pushed["tensors"]["generated"])
    files = set(hub.list_files(repo))
    assert {"README.md", "config.json", "model.safetensors", "tokenizer.json", *REMOTE_CODE_FILES} <= files
    readme = hub.read_file(repo, "README.md").decode()
    assert f'from_pretrained("{repo}", trust_remote_code=True)' in readme and "Trained in a test." in readme


def test_hub_server_refuses_what_the_hub_refuses():
    """The server checks what a real Hub checks, so the round trip above proves the client sent it."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def call(method, url, payload=None, token=None, data=None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        data = json.dumps(payload).encode() if payload is not None else data
        try:
            with opener.open(urllib.request.Request(url, data=data, headers=headers, method=method)) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    with HubServer() as hub:
        create = f"{hub.endpoint}/api/repos/create"
        assert call("POST", create, {"name": "m"})[0] == 401  # no token
        assert call("POST", create, {"name": "m"}, token="hf_wrong")[0] == 401
        status, _, body = call("POST", create, {"name": "m"}, token=hub.token)
        assert status == 200 and json.loads(body)["url"] == f"{hub.endpoint}/test-user/m"
        assert call("POST", create, {"name": "m"}, token=hub.token)[0] == 409
        head = hub.head("test-user/m")
        status, headers, _ = call("HEAD", f"{hub.endpoint}/test-user/m/resolve/main/missing.json")
        assert status == 404 and headers["X-Error-Code"] == "EntryNotFound" and headers["X-Repo-Commit"] == head
        assert call("GET", f"{hub.endpoint}/api/models/test-user/none")[1]["X-Error-Code"] == "RepoNotFound"
        assert (
            call("GET", f"{hub.endpoint}/api/models/test-user/m/revision/dev")[1]["X-Error-Code"] == "RevisionNotFound"
        )
        # An LFS object must match its sha256, and a commit may only reference uploaded objects.
        oid = "0" * 64
        assert call("PUT", f"{hub.storage_endpoint}/upload/{oid}", {"not": "it"})[0] == 400
        lines = [{"key": "header", "value": {"summary": "x"}}, {"key": "lfsFile", "value": {"path": "w", "oid": oid}}]
        commit = "".join(json.dumps(line) + "\n" for line in lines).encode()
        status, headers, _ = call(
            "POST", f"{hub.endpoint}/api/models/test-user/m/commit/main", token=hub.token, data=commit
        )
        assert status == 422 and "was not uploaded" in headers["X-Error-Message"]
        assert hub.list_files("test-user/m") == [".gitattributes"] and hub.head("test-user/m") == head
        assert not hub.errors
