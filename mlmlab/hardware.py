"""What the machine can do, for choices made before training: native bf16 on the CPU, and ``trainer.precision=auto``."""

from __future__ import annotations

import functools
import os
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


@functools.cache
def cpu_kind() -> str:
    """The CPU's kind as it bears on numerics: vendor, model name and the vector / bf16 instruction sets (fp32 kernels
    and their rounding differ between an avx2-only EPYC, an avx512 EPYC and an AMX Xeon). Keys caches of results that
    are compared across machines (the random-init rows)."""
    import platform

    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.system()}-{platform.machine()}-{platform.processor()}"
    field = lambda name: next((line.split(":", 1)[1].strip() for line in text.splitlines()  # noqa: E731
                               if line.startswith(name)), "")
    flags = set(field("flags").split())
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    return f"{field('vendor_id')} | {field('model name')} | {' '.join(isa)}"


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


def job_threads(setting, parallel_jobs: int | None, cores: int | None = None) -> tuple[int | None, str | None]:
    """``trainer.threads`` -> (torch threads for this job or None to keep torch's default, a warning or None).
    ``auto``: for a job alone (``parallel_jobs`` None) torch's default; for one of ``parallel_jobs`` jobs at once (the
    joblib launcher's ``n_jobs``) the machine's cores split evenly between them, at least 1. A setting whose
    jobs x threads exceed the cores gets a warning naming both numbers: jobs that share cores slow each other far more
    than their share (2-20x measured here, not 2x)."""
    cores = cores or os.cpu_count() or 1
    jobs = max(1, parallel_jobs or 1)
    if str(setting) == "auto" and parallel_jobs is None:
        return None, None
    threads = max(1, cores // jobs) if str(setting) == "auto" else int(setting)
    if jobs * threads > cores:
        return threads, (f"{jobs} parallel jobs x {threads} threads = {jobs * threads} threads on {cores} cores: the jobs "
                         f"will fight over cores; use trainer.threads=auto or hydra.launcher.n_jobs <= {cores // threads or 1}")
    return threads, None


def apply_threads(threads: int) -> None:
    """Make this process and the processes it starts use ``threads`` threads: torch's intra-op pool, and the OpenMP /
    MKL / tokenizers pools of children (data workers, subprocesses) through the environment."""
    import torch

    torch.set_num_threads(threads)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ[var] = str(threads)
