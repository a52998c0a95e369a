"""What the machine can do, for choices made before training: native bf16 on the CPU, and ``trainer.precision=auto``."""

from __future__ import annotations

import functools
from pathlib import Path

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 instructions that make bf16 matmuls faster than fp32


@functools.cache
def cpu_bf16_supported() -> bool:
    """Whether this CPU computes bf16 natively (Linux ``/proc/cpuinfo`` flags; Apple silicon counts as supported).
    Without it torch emulates bf16 and autocast is slower than fp32."""
    import platform

    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return True
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return any(f in flags for f in BF16_CPU_FLAGS)


def on_cpu(accelerator: str) -> bool:
    if accelerator == "cpu":
        return True
    if accelerator in ("auto", "gpu", "cuda"):
        import torch

        return not torch.cuda.is_available()
    return False


def resolve_precision(precision: str, accelerator: str) -> str:
    """``auto``: ``bf16-mixed`` where the device computes bf16 natively (a CUDA GPU with bf16, a CPU with avx512_bf16 /
    amx_bf16), else ``32-true``. Any other value is returned as it is."""
    if str(precision) != "auto":
        return str(precision)
    if on_cpu(accelerator):
        return "bf16-mixed" if cpu_bf16_supported() else "32-true"
    import torch

    return "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
