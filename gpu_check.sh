#!/usr/bin/env bash
# The GPU check: compile + bf16 + DDP on CUDA, tok/s and MFU with and without JREG, in well under 10 minutes.
#   bash gpu_check.sh            (on a machine with one or more CUDA GPUs and this repo's requirements)
set -euo pipefail
cd "$(dirname "$0")"
NGPU=$(python -c "import torch; print(torch.cuda.device_count())")
[ "$NGPU" -ge 1 ] || { echo "error: no CUDA GPU visible" >&2; exit 1; }
OUT=${OUT:-/tmp/jreg_gpu_check}
mkdir -p "$OUT"
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), 'x', torch.cuda.device_count())"

# 1. one GPU, 170M, compile + bf16: step time, tok/s and MFU for λ = 0 vs λ = 1 (and vs transformers' Llama)
python bench.py --preset 170m --device cuda --compile --dtype bfloat16 --micro_batch 16 --seq_len 2048 \
    --warmup 5 --repeats 15 | tee "$OUT/bench_170m.txt"

# 2. train.py end to end on every GPU (DDP, compile, bf16, eval, checkpoint, resume) on random-token shards
python - "$OUT/data" <<'PY'
import os, sys, numpy as np
from data import write_manifest, write_shard
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(0)
write_shard(f"{d}/rand_val_000000.bin", rng.integers(0, 50257, 2_000_000), tokenizer="gpt2", vocab_size=50257, eot_token=50256)
write_shard(f"{d}/rand_train_000001.bin", rng.integers(0, 50257, 50_000_000), tokenizer="gpt2", vocab_size=50257, eot_token=50256)
write_manifest(d, {"rand_val_000000.bin": "val", "rand_train_000001.bin": "train"})
PY
for cfg in 170m 170m_jreg; do
  rm -rf "$OUT/$cfg"
  torchrun --standalone --nproc_per_node="$NGPU" train.py "configs/$cfg.py" --data_dir="$OUT/data" \
      --out_dir="$OUT/$cfg" --max_steps=20 --warmup_steps=5 --eval_interval=10 --eval_batches=2 --ckpt_interval=10 \
      | tee "$OUT/$cfg.txt"
  torchrun --standalone --nproc_per_node="$NGPU" train.py "configs/$cfg.py" --data_dir="$OUT/data" \
      --out_dir="$OUT/$cfg" --max_steps=25 --warmup_steps=5 --eval_interval=10 --eval_batches=2 --ckpt_interval=10 \
      | tail -n 3                                                      # resumes from step 20
done
python - "$OUT" <<'PY'
import json, sys, statistics
for cfg in ("170m", "170m_jreg"):
    recs = [json.loads(l) for l in open(f"{sys.argv[1]}/{cfg}/log.jsonl") if '"loss"' in l]
    late = [r for r in recs if r["step"] > 5]
    print(f"{cfg:10s} steps {len(recs)} | tok/s {statistics.median(r['tok_per_s'] for r in late):,.0f} | "
          f"MFU {statistics.median(r['mfu'] or 0 for r in late):.3f} | mem {max(r['mem_gb'] or 0 for r in recs):.1f} GB")
PY
