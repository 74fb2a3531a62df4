#!/usr/bin/env bash
# The GPU check, by hand on a CUDA machine (nothing in CI needs one). Five steps, the most telling first:
#   1. 170M, compile + bf16, one GPU: our step vs transformers', tok/s and MFU, λ = 0 vs λ = 1 (bench.py);
#   2. train.py end to end on every GPU (DDP, compile, bf16, eval, checkpoint) for 170M with JREG (λ = 1);
#   3. 1B under FSDP2 (compile, bf16, gradient accumulation, sharded checkpoints): 10 steps, a resume to 20,
#      its peak memory beside bench.py --memory's estimate;
#   4. 170M, compile + bf16: the loss with full fp32 logits vs chunked, speed and peak memory beside the estimate;
#   5. 3.4B: one micro-batch (4 x 2048, or 2 x 2048 under 100 GiB) forward + backward (eager, bf16), its peak beside
#      the estimate.
# Each step runs under a time limit (STEP_S seconds, default 240) and the whole under BUDGET_S (default 540, inside
# one 10-minute call): a step that fails or runs out is said, with the end of its log, and the next one runs; a step
# with under a minute left is skipped. After every step $OUT/summary.md holds the table of what has finished, and
# $OUT/gpu_check.log every step's output as it comes; the random data and the run folders (tens of GB) go to $WORK.
#   bash gpu_check.sh                    OUT=DIR (default /tmp/jreg_gpu_check)  WORK=DIR (default /tmp/jreg_gpu_work)
#   STEPS="1 2" bash gpu_check.sh        some of the steps (default: all, in the order above)
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/jreg_gpu_check}; WORK=${WORK:-/tmp/jreg_gpu_work}; STEP_S=${STEP_S:-240}; STEPS=${STEPS:-1 2 3 4 5}
END=$((SECONDS + ${BUDGET_S:-540}))
export PYTHONUNBUFFERED=1                            # a step killed at its limit keeps what it printed
PY=$(command -v python || command -v python3)
mkdir -p "$OUT" "$WORK"
LOG="$OUT/gpu_check.log"
"$PY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), 'x', \
torch.cuda.device_count())" > "$WORK/device.txt" || { echo "error: no CUDA GPU visible" >&2; exit 1; }
cat "$WORK/device.txt" | tee "$LOG"
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())")
GPU_GIB=$("$PY" -c "import torch; print(round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))")

run() {  # run NAME COMMAND...: under the time limit, its output in $WORK/NAME.txt and the log; a failure is said
  local name=$1 t0=$SECONDS left=$((END - SECONDS)); shift
  if [ "$left" -lt 60 ]; then echo "$name: skipped (${left} s of BUDGET_S left)" | tee -a "$LOG"; return; fi
  local limit=$((left < STEP_S ? left : STEP_S))
  echo "== $name (limit $limit s): $*" >> "$LOG"
  timeout "$limit" "$@" 2>&1 | tee "$WORK/$name.txt" >> "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "== $name: $((SECONDS - t0)) s, exit $rc" >> "$LOG"
  echo "$name: $((SECONDS - t0)) s, exit $rc$([ $rc = 124 ] && echo ' (out of time)')"
  [ $rc = 0 ] || tail -n 20 "$WORK/$name.txt"
}

summary() {  # the table of what has finished, in $OUT/summary.md
  "$PY" - "$WORK" "$OUT/summary.md" <<'PY'
import json, os, re, statistics, sys
work, summary = sys.argv[1:]
text = lambda name: open(f"{work}/{name}.txt").read() if os.path.exists(f"{work}/{name}.txt") else ""
def log(run):
    return [json.loads(l) for l in open(f"{work}/{run}/log.jsonl") if '"loss"' in l]
def est(config):                                     # bench.py --memory: the total column, GiB, or n/a
    line = next((l for l in text("estimate").splitlines() if l.startswith(config + " ")), None)
    return f"{float(line.split()[-2]):.1f}" if line else "n/a"
def train_row(run, what, first):
    recs = [r for r in log(run) if r["step"] > first]
    return (f"steps {recs[0]['step']}-{recs[-1]['step']}, {statistics.median(r['tok_per_s'] for r in recs):,.0f} "
            f"tok/s, MFU {statistics.median(r['mfu'] or 0 for r in recs):.3f}, peak "
            f"{max(r['mem_gb'] for r in recs) / 1.0737:.1f} GiB (estimate {est(what)})")
rows = [("device", text("device").strip())]
runs = [("170m", "DDP x GPUs, compile, bf16", 5), ("170m_jreg", "DDP x GPUs, compile, bf16", 5),
        ("1b", "FSDP2, compile, bf16, accumulation 4, resumed at 10", 12)]
for run, how, first in runs:
    if os.path.exists(f"{work}/{run}/log.jsonl"):    # the step has run (a failure: its log says why)
        try:
            rows.append((f"train.py {run} ({how})", train_row(run, f"configs/{run}.py", first)))
        except Exception as e:
            rows.append((f"train.py {run} ({how})", f"no result ({type(e).__name__}: {e}); see gpu_check.log"))
for name in ("bench_170m", "probe_170m", "probe_3.4b"):
    rows += [(name, line.strip()) for line in text(name).splitlines()
             if re.search(r"ratio|ours/HF|overhead|step time|est/meas|full logits|chunked|bytes per logit|tok/s", line)]
table = "| check | result |\n|---|---|\n" + "".join(f"| {k} | {v.replace('|', '/')} |\n" for k, v in rows)
open(summary, "w").write(table)
PY
}

data() {  # random GPT-2 token shards for train.py, and bench.py --memory's estimates of the configs it trains
  [ -f "$WORK/data/manifest.json" ] || "$PY" - "$WORK/data" <<'PY'
import os, sys, numpy as np
from data import write_manifest, write_shard
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(0)
for name, n in (("rand_val_000000.bin", 2_000_000), ("rand_train_000001.bin", 50_000_000)):
    write_shard(f"{d}/{name}", rng.integers(0, 50257, n), tokenizer="gpt2", vocab_size=50257, eot_token=50256)
write_manifest(d, {"rand_val_000000.bin": "val", "rand_train_000001.bin": "train"})
PY
  for config in configs/1b.py configs/170m.py configs/170m_jreg.py; do   # one at a time: a config whose batch
    "$PY" bench.py --memory "$config" --world "$NGPU" --gpu_gib "$GPU_GIB" 2>&1   # the GPUs do not divide fails alone
  done > "$WORK/estimate.txt"
}

COMMON=(--data_dir="$WORK/data" --warmup_steps=5 --eval_batches=2)
for step in $STEPS; do
  case $step in
    1) run bench_170m "$PY" bench.py --preset 170m --device cuda --compile --dtype bfloat16 --micro_batch 16 \
           --seq_len 2048 --warmup 5 --repeats 10 ;;
    2) data
       for cfg in 170m_jreg; do             # (λ = 0 vs 1: step 1) 2 micro-batches of 32 x 2048 (the config's) per GPU
         rm -rf "${WORK:?}/$cfg"
         run "$cfg" torchrun --standalone --nproc_per_node="$NGPU" train.py "configs/$cfg.py" "${COMMON[@]}" \
             --out_dir="$WORK/$cfg" --batch_tokens=$((2 * 32 * 2048 * NGPU)) --max_steps=20 --eval_interval=10 \
             --ckpt_interval=20
       done ;;
    3) data
       rm -rf "${WORK:?}/1b"
       B1=(configs/1b.py "${COMMON[@]}" --out_dir="$WORK/1b" --batch_tokens=$((8 * 2048 * 4 * NGPU)) --eval_interval=0
           --ckpt_interval=10)
       run 1b torchrun --standalone --nproc_per_node="$NGPU" train.py "${B1[@]}" --max_steps=10
       run 1b_resume torchrun --standalone --nproc_per_node="$NGPU" train.py "${B1[@]}" --max_steps=20 ;;
    4) run probe_170m "$PY" bench.py --memory_probe --preset 170m --device cuda --compile --dtype bfloat16 \
           --micro_batch 16 --seq_len 2048 --warmup 3 --repeats 10 ;;
    5) MB=$("$PY" -c "print(4 if $GPU_GIB > 100 else 2)")  # 4 x 2048 with full logits: ~76 GiB, too near 80
       run probe_3.4b "$PY" bench.py --memory_probe --preset 3.4b --device cuda --dtype bfloat16 --micro_batch "$MB" \
           --seq_len 2048 --warmup 1 --repeats 2 ;;
    *) echo "error: STEPS: no step $step (1-5)" >&2; exit 1 ;;
  esac
  summary
done
cat "$OUT/summary.md"
