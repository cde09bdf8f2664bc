"""Peak memory, measured one way everywhere (training telemetry, the efficiency experiment, the benchmarks).

On a CUDA device: `torch.cuda.max_memory_allocated`, reset with `reset_peak_memory_stats`. On CPU: the process's
peak resident set size, Linux `VmHWM` reset through `/proc/self/clear_refs` so one phase is read alone; where that
reset is unsupported, `getrusage`'s lifetime peak (it includes model loading, e.g. de-quantising a GGUF).
"""

from __future__ import annotations

import contextlib
import re
import resource
import sys
from pathlib import Path

import torch


def _proc_status_mib(field: str) -> float | None:
    with contextlib.suppress(OSError):
        match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
        if match:
            return int(match.group(1)) / 1024
    return None


def rss_mib() -> float | None:
    """Current resident set size in MiB (Linux; None elsewhere)."""
    return _proc_status_mib("VmRSS")


def lifetime_peak_rss_mib() -> float:
    """Peak RSS of this process's whole life, from `getrusage`."""
    scale = 1 if sys.platform != "darwin" else 1 / 1024  # kB on Linux, bytes on macOS
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1024


def reset_peak_memory(device: torch.device | str | None = None) -> bool:
    """Start a new peak: CUDA's peak statistics, or the kernel's peak-RSS counter. Returns False where the CPU
    counter cannot be reset (non-Linux): `peak_memory_mib` then reads the lifetime peak."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_memory_mib(device: torch.device | str | None = None, since_reset: bool = True) -> tuple[float, str]:
    """`(MiB, source)`: the peak since the last `reset_peak_memory` (or the process's lifetime peak when
    `since_reset=False` or unsupported); `source` says which counter was read."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_memory_allocated"
    peak = _proc_status_mib("VmHWM") if since_reset else None
    if peak is not None:
        return peak, "process_peak_rss"
    return lifetime_peak_rss_mib(), "process_lifetime_peak_rss"


class PeakMemory:
    """`with PeakMemory(device) as memory: ...` then `memory.peak_mib` and `memory.kind` (the counter read)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.peak_mib: float | None = None
        self.kind: str | None = None
        self._reset = False

    def __enter__(self):
        self._reset = reset_peak_memory(self.device)
        return self

    def __exit__(self, *exc):
        self.peak_mib, self.kind = peak_memory_mib(self.device, since_reset=self._reset)
        return False
