#!/usr/bin/env bash
# The GPU check (issue "Time to an answer", item 6): one script, <= 5 minutes on one GPU, JSON out. It runs
#   1. benchmarks/bench_gpu.py --compile: the step at the small and bert-base shapes (seq 128), ours (bf16 autocast,
#      SDPA without attention mask, fused AdamW, + compile) against HF BertForMaskedLM (sdpa), tokens/s and MFU
#      against the device's measured bf16 matmul peak;
#   2. the default job end to end on the device (benchmarks/bench_e2e.py --overrides trainer=gpu);
#   3. a 1-device DDP job (trainer=ddp trainer.devices=1, debug=fast): the DDP code path on the accelerator.
# Without a GPU the same three steps run on the CPU at smoke size (how tests/test_performance.py keeps the script
# working); the JSON says which device ran.
#   bash benchmarks/gpu_check.sh [out dir]        # default benchmarks/results/gpu_check
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/gpu_check}
mkdir -p "$out"
export WANDB_MODE=offline
gpu=$(python -c "import torch; print(int(torch.cuda.is_available()))")
if [ "$gpu" = 1 ]; then
  bench=(--compile); e2e=(--overrides trainer=gpu); ddp=(trainer=ddp trainer.devices=1)
else
  bench=(--quick); e2e=(--quick --no-step); ddp=(trainer=ddp trainer.accelerator=cpu trainer.devices=1 trainer.precision=32-true)
fi
status=()
timeout 150 python benchmarks/bench_gpu.py "${bench[@]}" --out "$out/bench_gpu.json" && status+=(step=ok) || status+=(step=failed)
timeout 100 python benchmarks/bench_e2e.py "${e2e[@]}" --timeout 90 --out "$out/bench_e2e.json" && status+=(e2e=ok) || status+=(e2e=failed)
timeout 60 python -m mlmlab.train debug=fast "${ddp[@]}" logger=none trainer.enable_progress_bar=false \
  "hydra.run.dir=$out/ddp" > "$out/ddp.log" 2>&1 && status+=(ddp=ok) || status+=(ddp=failed)
python - "$out" "${status[@]}" <<'PY'
import json, sys, time
from pathlib import Path
out, status = Path(sys.argv[1]), dict(s.split("=") for s in sys.argv[2:])
def load(p):
    p = out / p
    return json.loads(p.read_text()) if p.is_file() else None
ddp = load("ddp/results.json")
summary = {"created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "status": status,
           "step": load("bench_gpu.json"), "e2e": load("bench_e2e.json"),
           "ddp": None if ddp is None else {k: ddp.get(k) for k in ("status", "metrics", "timings_s", "precision")}}
(out / "gpu_check.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
print(f"gpu_check: {status} -> {out / 'gpu_check.json'}")
sys.exit(0 if all(v == "ok" for v in status.values()) else 1)
PY
