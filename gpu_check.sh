#!/usr/bin/env bash
# The GPU check, by hand on a CUDA machine (nothing in CI needs one); it ends with one table. On one H200 it is
# planned to take about 10 minutes (not yet measured):
#   1. 170M, compile + bf16, one GPU: our step vs transformers', tok/s and MFU, λ = 0 vs λ = 1 (bench.py);
#   2. 170M, compile + bf16: the loss with full fp32 logits vs chunked, speed and peak memory beside the estimate;
#   3. train.py end to end on every GPU (DDP, compile, bf16, eval, checkpoint) for 170M, λ = 0 and λ = 1;
#   4. 1B under FSDP2 (compile, bf16, gradient accumulation, sharded checkpoints): 10 steps, a resume to 20,
#      its peak memory beside bench.py --memory's estimate;
#   5. 3.4B: one micro-batch forward + backward (eager, bf16), its peak beside the estimate.
#   bash gpu_check.sh            (OUT=DIR for another folder than /tmp/jreg_gpu_check; every log stays there)
set -euo pipefail
cd "$(dirname "$0")"
NGPU=$(python -c "import torch; print(torch.cuda.device_count())")
[ "$NGPU" -ge 1 ] || { echo "error: no CUDA GPU visible" >&2; exit 1; }
OUT=${OUT:-/tmp/jreg_gpu_check}
mkdir -p "$OUT"
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), 'x', torch.cuda.device_count())" \
    | tee "$OUT/device.txt"
GPU_GIB=$(python -c "import torch; print(round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))")

python bench.py --preset 170m --device cuda --compile --dtype bfloat16 --micro_batch 16 --seq_len 2048 \
    --warmup 5 --repeats 10 | tee "$OUT/bench_170m.txt"                                               # 1
python bench.py --memory_probe --preset 170m --device cuda --compile --dtype bfloat16 --micro_batch 16 \
    --seq_len 2048 --warmup 3 --repeats 10 | tee "$OUT/probe_170m.txt"                                # 2

python - "$OUT/data" <<'PY'
import os, sys, numpy as np
from data import write_manifest, write_shard
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(0)
write_shard(f"{d}/rand_val_000000.bin", rng.integers(0, 50257, 2_000_000), tokenizer="gpt2", vocab_size=50257, eot_token=50256)
write_shard(f"{d}/rand_train_000001.bin", rng.integers(0, 50257, 50_000_000), tokenizer="gpt2", vocab_size=50257, eot_token=50256)
write_manifest(d, {"rand_val_000000.bin": "val", "rand_train_000001.bin": "train"})
PY
COMMON=(--data_dir="$OUT/data" --warmup_steps=5 --eval_batches=2)
for cfg in 170m 170m_jreg; do                                                                         # 3
  rm -rf "$OUT/$cfg"
  torchrun --standalone --nproc_per_node="$NGPU" train.py "configs/$cfg.py" "${COMMON[@]}" --out_dir="$OUT/$cfg" \
      --max_steps=20 --eval_interval=10 --ckpt_interval=20 > "$OUT/$cfg.txt" 2>&1
done
rm -rf "$OUT/1b"                                                                                      # 4
B1=(configs/1b.py "${COMMON[@]}" --out_dir="$OUT/1b" --batch_tokens=$((8 * 2048 * 4 * NGPU)) --eval_interval=0 --ckpt_interval=10)
torchrun --standalone --nproc_per_node="$NGPU" train.py "${B1[@]}" --max_steps=10 > "$OUT/1b.txt" 2>&1
torchrun --standalone --nproc_per_node="$NGPU" train.py "${B1[@]}" --max_steps=20 > "$OUT/1b_resume.txt" 2>&1
python bench.py --memory configs/1b.py configs/170m.py configs/170m_jreg.py --world "$NGPU" --gpu_gib "$GPU_GIB" \
    > "$OUT/estimate.txt"
python bench.py --memory_probe --preset 3.4b --device cuda --dtype bfloat16 --micro_batch 4 --seq_len 2048 \
    --warmup 1 --repeats 2 > "$OUT/probe_3.4b.txt" 2>&1 || echo "3.4B probe failed: $OUT/probe_3.4b.txt"  # 5

python - "$OUT" <<'PY'
import json, re, statistics, sys
out = sys.argv[1]
text = lambda name: open(f"{out}/{name}").read()
def log(run):
    return [json.loads(l) for l in open(f"{out}/{run}/log.jsonl") if '"loss"' in l]
def est(config):                                     # bench.py --memory: the total column, GiB
    line = next(l for l in text("estimate.txt").splitlines() if l.startswith(config + " "))
    return float(line.split()[-2])
rows = [("device", text("device.txt").strip())]
for run in ("170m", "170m_jreg"):
    recs = [r for r in log(run) if r["step"] > 5]
    rows.append((f"train.py {run} (DDP x GPUs, compile, bf16)",
                 f"{statistics.median(r['tok_per_s'] for r in recs):,.0f} tok/s, MFU "
                 f"{statistics.median(r['mfu'] or 0 for r in recs):.3f}, peak {max(r['mem_gb'] for r in recs) / 1.0737:.1f}"
                 f" GiB (estimate {est('configs/' + run + '.py'):.1f})"))
b1 = log("1b")
rows.append(("train.py 1b (FSDP2, compile, bf16, accumulation 4)",
             f"steps {[r['step'] for r in b1][0]}-{b1[-1]['step']} after a resume at 10, "
             f"{statistics.median(r['tok_per_s'] for r in b1 if r['step'] > 12):,.0f} tok/s, MFU "
             f"{statistics.median(r['mfu'] or 0 for r in b1 if r['step'] > 12):.3f}, peak "
             f"{max(r['mem_gb'] for r in b1) / 1.0737:.1f} GiB (estimate {est('configs/1b.py'):.1f})"))
for name in ("bench_170m.txt", "probe_170m.txt", "probe_3.4b.txt"):
    for line in text(name).splitlines():
        if re.search(r"ratio|λ = 1|step time|est/meas|full logits|chunked|bytes per logit|tok/s", line):
            rows.append((name[:-4], line.strip()))
print("\n| check | result |\n|---|---|")
for k, v in rows:
    print(f"| {k} | {v.replace('|', '/')} |")
PY
