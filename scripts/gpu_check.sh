#!/usr/bin/env bash
# The GPU check, by hand on a CUDA machine (nothing in CI needs one; tests/test_gpu_check.py runs its dry run). GPU
# time comes rarely and in one ~10-minute call, so nothing here may waste it: the train.py paths, which only a GPU
# machine tests, run first, after the cheap eager probes (steps 5 and 6 run first: a budget cut short loses an
# expensive compiled step, not them); every step has a time limit; a failed step is said with the end of its log and the next
# one runs; and $OUT/summary.md is rewritten after every step, so a call killed midway keeps what finished. The steps:
#   0. the versions (torch, CUDA, transformers, the GPUs, git and torchrun on PATH) and the free disk, printed first;
#      the probe: every module and tool the steps need (a C compiler and Python's headers for the compiled kernels),
#      and one tiny op compiled and run on the GPU, each missing piece one line, in seconds (the call stops there);
#      random-token shards and the two train.py runs' configs as resolved (file + overrides); bench.py --memory's
#      estimate of both, once;
#   1. train.py configs/170m_jreg.py, DDP on every GPU: compile, bf16, eval, checkpoint; 20 steps;
#   2. train.py configs/1b.py, FSDP2 on every GPU: compile, bf16, 4 micro-batches accumulated, sharded checkpoints at
#      steps 10 and 20; the step-20 one removed, the same command resumes from step 10 and redoes 11-20, whose losses
#      must equal the first run's: exactly on a CPU, to RESUME_RTOL (5e-3) on a GPU, where flash attention's backward,
#      cuBLAS and NCCL reductions are not deterministic (DRY_RUN: first that command on a disk that takes 1 MB a file,
#      which must fail at its checkpoint in one error line and leave the step-10 one to resume);
#   3. bench.py, the 170M shape on one GPU, compiled, bf16: training steps λ = 0 vs λ = 1 interleaved (the JREG
#      overhead), tok/s and MFU. No λ = 0 train.py run: this step measures the overhead, for a cold compile fewer;
#   4. bench.py --memory_probe, 170M: peak memory beside the estimate, the full-logits loss vs the chunked one;
#   5. bench.py --memory_probe, 3.4B: one micro-batch forward + backward (eager; 4 x 2048, 2 x 2048 under 100 GiB);
#   6. bench.py --loss_chunks 1024 8192, 170M width, bf16, eager: the loss alone (head + cross-entropy, forward +
#      backward) at the old and the new default loss_chunk, time and bytes per logit (on a CPU 8192 is the slower).
#
#   bash scripts/gpu_check.sh              OUT=DIR (default out/gpu_check)  WORK=DIR (default out/gpu_check_work)
#   STEPS="1 2" bash scripts/gpu_check.sh  some of the steps, in this order (default: 5 6 1 2 3 4; step 0 always runs)
#   HF=1 bash scripts/gpu_check.sh         step 3 also times transformers' LlamaForCausalLM (off: more cold compiles)
#   DRY_RUN=1 bash scripts/gpu_check.sh    the whole script on a CPU, same commands, small sizes: 2 processes on gloo,
#                                          the tiny preset on byte tokens, fp32, eager (so not FSDP's compiled
#                                          blocks), 64-token sequences, fewer steps (about 80 s on a 2-core CPU)
# Time: BUDGET_S (default 540 s) for the whole, STEP_S (default 240 s) a step; a step with under 60 s left is skipped.
# Files: $OUT/summary.md (the table), $OUT/gpu_check.log (every step's output as it comes), $OUT/steps/NAME.txt (one
# step's output), $OUT/runs/NAME.jsonl (a train.py run's log.jsonl), $OUT/configs/ (the resolved configs),
# $OUT/estimate.txt. $WORK holds the shards, the run folders and the compile caches (TORCHINDUCTOR_CACHE_DIR,
# TRITON_CACHE_DIR: kept between the steps and the calls, so only the first compile of a graph is cold); each run
# folder (checkpoints: tens of GB on the GPU sizes; the 170M run keeps the newest, the 1B run two) is removed when its
# step is done. A train.py run's first step says how long it compiled (compile_s), in its log and the summary's notes.
# Exit status: 0 when every step ran and passed.
set -uo pipefail
# The defaults lie in the repository's out/, which git ignores and no other user of the machine shares; OUT and WORK
# given relative are taken from where the script was called, so they are resolved before the cd.
REPO=$(dirname "$0")/..
OUT=$(realpath -m "${OUT:-$REPO/out/gpu_check}"); WORK=$(realpath -m "${WORK:-$REPO/out/gpu_check_work}")
cd "$(dirname "$0")/.."                              # the repository: train.py, configs/, scripts/bench.py
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # scripts/bench.py imports the core modules from here
STEP_S=${STEP_S:-240}; STEPS=${STEPS:-5 6 1 2 3 4}
for step in $STEPS; do    # a typo fails now, not after minutes of GPU time
  case $step in [1-6]) ;; *) echo "error: STEPS: no step $step (1-6)" >&2; exit 1 ;; esac
done
DRY_RUN=${DRY_RUN:-0}; HF=${HF:-0}
END=$((SECONDS + ${BUDGET_S:-540}))
export PYTHONUNBUFFERED=1                            # a step killed at its limit keeps what it printed
export DRY_RUN HF
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$WORK/inductor_cache} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$WORK/triton_cache}

# The python that has torch: the lent machine's image may have it under python or python3 only.
PY=""
for candidate in python python3; do
  if command -v "$candidate" > /dev/null && "$candidate" -c 'import torch' 2> /dev/null; then PY=$candidate; break; fi
done
[ -n "$PY" ] || { echo "error: neither python nor python3 can import torch" >&2; exit 1; }

mkdir -p "$OUT" "$WORK"
rm -rf "$OUT/steps" "$OUT/runs" "$OUT/configs"        # this call's files only: never a stale step in the summary
rm -f "$OUT/steps.tsv" "$OUT/estimate.txt" "$OUT/summary.md" "$OUT/env.txt"
mkdir -p "$OUT/steps" "$OUT/runs" "$OUT/configs"
LOG="$OUT/gpu_check.log"
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }

# ---- versions first: if anything below fails, the log still says what the machine was
read -r NGPU GPU_GIB < <("$PY" - "$OUT/env.txt" <<'PY'
import importlib.metadata, shutil, sys, torch
try:
    tf = importlib.metadata.version("transformers")
except importlib.metadata.PackageNotFoundError:
    tf = "absent"
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
gpu = f"{torch.cuda.get_device_name(0)} x {n}" if n else "none"
on_path = lambda name: "yes" if shutil.which(name) else "absent"
open(sys.argv[1], "w").write(
    f"torch {torch.__version__} | CUDA {torch.version.cuda} | transformers {tf} | GPU {gpu} | "
    f"python {sys.version.split()[0]} ({sys.executable}) | git on PATH: {on_path('git')} | "
    f"torchrun on PATH: {on_path('torchrun')}\n")
print(n, round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if n else 0)
PY
)
[ -s "$OUT/env.txt" ] || { echo "error: $PY could not report its torch and GPU (see above)" >&2; exit 1; }
say "$(cat "$OUT/env.txt")"
say "free disk: $(df -Ph "$WORK" 2> /dev/null | awk 'NR == 2 { print $4 }') in $WORK (a 1B checkpoint is ~12 GB; two exist while the second is written)"
if [ "$DRY_RUN" = 1 ]; then
  say "DRY_RUN=1: the CPU dry run (2 processes on gloo, tiny preset, fp32, eager, small sizes)"
elif [ "${NGPU:-0}" -lt 1 ]; then
  echo "error: no CUDA GPU visible to $PY (DRY_RUN=1 runs the CPU dry run)" | tee -a "$LOG" >&2; exit 1
fi

# ---- the sizes: all that differs between the GPU run and the dry run (the commands below are the same)
if [ "$DRY_RUN" = 1 ]; then
  NPROC=2; SEQ=64; MB_170=4; MB_1B=2; DATA=(bytes 257 256 50000)      # byte tokens: a 320-row head, not 50,304
  STEPS_170=6; STEPS_1B=3                       # 170M: eval halfway and at the end; 1B: resumed at STEPS_1B
  TRAIN_MODE=(--model=tiny --tokenizer=bytes --vocab_size=320 --device=cpu --compile=False --dtype=float32)
  # one thread: two OpenMP threads on a 2-core CPU shared with anything else spin and run several times slower
  BENCH_MODE=(--device cpu --no-compile --dtype float32 --seq_len 64 --micro_batch 2 --vocab_size 320 --threads 1)
  BENCH_TIMES=(--warmup 1 --repeats 2); PRESET_170=tiny; PRESET_BIG=tiny; MB_BIG=1
  BIG_MODE=(--device cpu --vocab_size 320 --threads 1)
  CHUNKS=(16 128); CHUNK_MODE=(--device cpu --dtype float32 --seq_len 64 --micro_batch 2 --vocab_size 320 --threads 1)
else
  NPROC=$NGPU; SEQ=2048; MB_170=32; MB_1B=8; DATA=(gpt2 50257 50256 50000000)   # tokenizer, vocab, EOT, tokens
  STEPS_170=20; STEPS_1B=10
  # 32 and 8: the configs' micro-batches per GPU
  TRAIN_MODE=()                                 # the configs' own: cuda:LOCAL_RANK, compile, bf16 autocast
  BENCH_MODE=(--device cuda --compile --dtype bfloat16 --seq_len 2048 --micro_batch 16)
  BENCH_TIMES=(--warmup 5 --repeats 10); PRESET_170=170m; PRESET_BIG=3.4b; BIG_MODE=(--device cuda --dtype bfloat16)
  CHUNKS=(1024 8192); CHUNK_MODE=(--device cuda --dtype bfloat16 --seq_len 2048 --micro_batch 32)   # the config's
  MB_BIG=$(awk -v g="$GPU_GIB" 'BEGIN { print (g > 100 ? 4 : 2) }')   # 4 x 2048 with full logits: ~76 GiB, near 80
fi
HF_FLAG=(--no_hf); [ "$HF" = 1 ] && HF_FLAG=()
DIST=("$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC")   # torchrun may not be on PATH
# --keep_ckpts=1: one checkpoint on disk at a time (a 1B one is ~12 GB; the disk is shared with the image)
DATA_DIR="$WORK/data_${DATA[0]}_${DATA[3]}"
COMMON=(--data_dir="$DATA_DIR" --seq_len="$SEQ" --warmup_steps=5 --eval_batches=2 --keep_ckpts=1)
T170=(configs/170m_jreg.py "${COMMON[@]}" --out_dir="$WORK/170m_jreg" --micro_batch="$MB_170"
      --batch_tokens=$((2 * MB_170 * SEQ * NPROC)) --max_steps="$STEPS_170" --eval_interval=$((STEPS_170 / 2))
      --ckpt_interval="$STEPS_170"
      "${TRAIN_MODE[@]}")                                                # 2 micro-batches per process a step
T1B=(configs/1b.py "${COMMON[@]}" --fsdp=True --sharded_ckpt=True --out_dir="$WORK/1b" --micro_batch="$MB_1B"
     --batch_tokens=$((4 * MB_1B * SEQ * NPROC)) --eval_interval=0 --ckpt_interval="$STEPS_1B" --keep_ckpts=2
     --max_steps=$((2 * STEPS_1B)) "${TRAIN_MODE[@]}")  # 4 accumulated; checkpoints at STEPS_1B and twice that

FAILED=0
run() {  # run NAME COMMAND...: under the time limit; output to $OUT/steps/NAME.txt and the log; exit in steps.tsv;
         # it passes with exit status $EXPECT (default 0)
  local name=$1 t0=$SECONDS left=$((END - SECONDS)) want=${EXPECT:-0}; shift
  if [ "$left" -lt 60 ]; then
    say "$name: skipped (${left} s of BUDGET_S left)"; printf '%s\tskipped\t0\n' "$name" >> "$OUT/steps.tsv"
    FAILED=1; return 1
  fi
  local limit=$((left < STEP_S ? left : STEP_S))
  echo "== $name (limit $limit s): $*" >> "$LOG"
  # timeout signals its whole process group: torch.distributed.run's workers get the SIGTERM too (train.py saves
  # and stops), and SIGKILL 30 s later if they hang, so no orphan holds a GPU into the next step
  timeout --kill-after=30 "$limit" "$@" 2>&1 | tee "$OUT/steps/$name.txt" >> "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "== $name: $((SECONDS - t0)) s, exit $rc" >> "$LOG"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$OUT/steps.tsv"
  say "$name: $((SECONDS - t0)) s, exit $rc$([ "$rc" = 124 ] && echo ' (out of time)')"
  if [ "$rc" != "$want" ]; then FAILED=1; tail -n 20 "$OUT/steps/$name.txt" | tee -a "$LOG"; return 1; fi
}

done_with() {  # done_with RUN NAME: keep the run's log.jsonl (small) as $OUT/runs/NAME.jsonl, then free the disk
  [ -f "$WORK/$1/log.jsonl" ] && cp "$WORK/$1/log.jsonl" "$OUT/runs/$2.jsonl"
  rm -rf "${WORK:?}/$1"
}

summary() {  # $OUT/summary.md from what has finished: no torch import (seconds of GPU time each)
  "$PY" - "$OUT" "$NPROC" "$STEPS_1B" <<'PY'
import json, os, re, statistics, sys
out, nproc, resumed_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dry = os.environ.get("DRY_RUN") == "1"
text = lambda p: open(os.path.join(out, p)).read() if os.path.exists(os.path.join(out, p)) else ""
gib = lambda b: f"{b / 2**30:.1f}" if b >= 10 * 2**30 else f"{b / 2**30:.3g}"   # tiny sizes keep their digits
status = {}
for line in text("steps.tsv").splitlines():
    name, rc, sec = line.split("\t")
    status[name] = (rc, sec)
ran = lambda step: status.get(step, ("skipped",))[0] != "skipped"
rows = []                     # step, config, how, tok/s, MFU, peak GiB, estimate GiB, JREG overhead, notes

def estimate(name):           # bench.py --memory's total column for the resolved config, GiB
    path = os.path.join(out, "configs", name + ".py")
    line = next((l for l in text("estimate.txt").splitlines() if l.startswith(path + " ")), None)
    return f"{float(line.split()[-2]):.3g}" if line else "n/a"

def train_row(step, run, config, first):
    cfg = json.loads(text(f"configs/{run}.json"))
    recs = [json.loads(l) for l in text(f"runs/{step}.jsonl").splitlines() if '"tok_per_s"' in l]
    recs = [r for r in recs if r["step"] > first]
    compiled = sum(r.get("compile_s") or 0 for r in recs)          # the first step's compile (train.py logs it)
    same = re.search(r"worst relative difference: (loss \S+, grad_norm \S+)", text("steps/resume_matches_1b.txt"))
    how = (f"{'FSDP2' if cfg['fsdp'] else 'DDP'} x{nproc}, {'compiled' if cfg['compile'] else 'eager'}, "
           f"{'fp32' if cfg['dtype'] == 'float32' else 'bf16'}, {cfg['micro_batch']}x{cfg['seq_len']} x "
           f"{cfg['batch_tokens'] // (cfg['micro_batch'] * cfg['seq_len'] * nproc)} accum")
    if not recs:
        return rows.append((step, config, how, "n/a", "n/a", "n/a", estimate(run), "", "no step logged"))
    later = [r for r in recs if r["step"] > recs[0]["step"] + 1] or recs     # the first two steps compile
    mfu = [r["mfu"] for r in later if r.get("mfu") is not None]
    mem = [r["mem_gb"] for r in recs if r.get("mem_gb") is not None]
    resumed = re.search(r"resuming from (\S+) at step (\d+)", text(f"steps/{step}.txt"))
    rows.append((step, config, how, f"{statistics.median(r['tok_per_s'] for r in later):,.0f}",
                 f"{100 * statistics.median(mfu):.1f}%" if mfu else "n/a", gib(max(mem) * 1e9) if mem else "n/a",
                 estimate(run), "", f"steps {recs[0]['step']}-{recs[-1]['step']}, median of {later[0]['step']}-"
                 f"{later[-1]['step']}" + (f"; compiled {compiled:.0f} s" if compiled else "")
                 + (f"; resumed at step {resumed[2]}" if resumed else "")
                 + (f"; vs train_1b: {same[1]}" if resumed and same else "")))

for step, run, first in (("train_170m_jreg", "170m_jreg", 0), ("train_1b", "1b", 0),
                         ("train_1b_resume", "1b", resumed_at)):
    if ran(step):
        train_row(step, run, f"configs/{run}.py", first)

bench = text("steps/bench_170m.txt")
if head := re.search(r"^(\S+): .*\| batch (\d+)x(\d+) \| (.*?) \| compile=(\w+)", bench, re.M):
    how = f"1 process, {'compiled' if head[5] == 'True' else 'eager'}, {head[4]}, {head[2]}x{head[3]}"
    step_line = r"^train step (ours λ=[01]|HF λ=0)\s+([\d.]+) ms\s+(\d+) tok/s(?:\s+MFU\s+([\d.]+)%)?"
    t = {m[1]: (float(m[2]), m[3], m[4]) for m in re.finditer(step_line, bench, re.M)}
    peak = re.search(r"max memory ([\d.]+) GB", bench)
    hf = "; ".join(l.strip() for l in bench.splitlines() if "ours/HF" in l)
    for name, (ms, tok, mfu) in t.items():
        overhead = ""
        if name == "ours λ=1" and "ours λ=0" in t:
            ratio = ms / t["ours λ=0"][0]
            overhead = f"{ratio:.3f}x step time ({100 * (ratio - 1):+.1f}%)"
        rows.append((f"bench_170m {name}", f"preset {head[1]}", how, f"{int(tok):,}", f"{mfu}%" if mfu else "n/a",
                     gib(float(peak[1]) * 1e9) if peak else "n/a", "n/a", overhead,
                     f"{ms:.1f} ms a step" + ("; peak: the process's, all contenders" if peak else "")
                     + (f"; {hf}" if hf and name == "ours λ=0" else "")))

for step in ("probe_170m", "probe_3.4b"):
    probe = text(f"steps/{step}.txt")
    head = re.search(r"^memory probe (\S+): .*\| batch (\d+)x(\d+) \| (.*?) \| compile=(\w+)", probe, re.M)
    times = re.search(r"step time: full ([\d.]+) ms, chunked ([\d.]+) ms .*checkpointed ([\d.]+) ms", probe)
    per_logit = re.search(r"([\d.]+) bytes per logit full, ([\d.]+) chunked", probe)
    if not head:
        continue
    how = f"1 process, {'compiled' if head[5] == 'True' else 'eager'}, {head[4]}, {head[2]}x{head[3]}, fwd+bwd λ=1"
    for i, m in enumerate(re.finditer(r"^(full logits|chunked loss|chunked \+ checkpointing)\s+([\d.]+)\s+([\d.]+)\s+"
                                      r"([\d.]+)$", probe, re.M)):
        tok = f"{int(head[2]) * int(head[3]) / float(times[i + 1]) * 1e3:,.0f}" if times else "n/a"
        rows.append((f"{step} {m[1]}", f"preset {head[1]}", how, tok, "n/a", gib(float(m[2]) * 1e6),
                     gib(float(m[3]) * 1e6), "", f"est/meas {m[4]}; beyond weights and gradients"
                     + (f"; the loss alone: {per_logit[1]} bytes per logit full, {per_logit[2]} chunked"
                        if per_logit and i == 0 else "")))

for m in re.finditer(r"^chunk\s+(\d+) \(\s*(\d+) chunks\)\s+([\d.]+) ms\s+speed vs chunk (\d+): ([\d.]+)x\s+([\d.]+) "
                     r"bytes per logit\s+head-gradient traffic ([\d.]+) GB", text("steps/loss_chunks_170m.txt"), re.M):
    positions = re.search(r"= (\d+) positions", text("steps/loss_chunks_170m.txt"))
    rows.append((f"loss_chunks_170m chunk {m[1]}", f"preset {'tiny' if dry else '170m'} width", "the loss alone, eager",
                 f"{int(positions[1]) / float(m[3]) * 1e3:,.0f}", "n/a", "n/a", "n/a", "",
                 f"{m[2]} chunks; speed vs chunk {m[4]}: {m[5]}x; {m[6]} bytes per logit; head-gradient traffic {m[7]} GB"))

cell = lambda v: str(v).replace("|", "/")
lines = ["# gpu_check.sh summary" + (" (DRY_RUN=1: CPU, gloo, tiny sizes)" if dry else ""), "",
         text("env.txt").strip(), "",
         "| step | config | how | tok/s | MFU | peak GiB | estimate GiB | JREG overhead (λ=1 / λ=0) | notes |",
         "|---|---|---|---|---|---|---|---|---|"]
lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
lines += ["", "tok/s: median over the logged steps after the first (compiling) ones, all processes together; "
          "compiled: the seconds torch.compile took, in the first step (train.py's compile_s); "
          "peak: max_memory_allocated (n/a on CPU; the probes: torch.profiler); estimate: bench.py --memory "
          "(train.py) or the probe's own.", "", "| step | exit | seconds |", "|---|---|---|"]
lines += [f"| {name} | {rc} | {sec} |" for name, (rc, sec) in status.items()]
open(os.path.join(out, "summary.md.tmp"), "w").write("\n".join(lines) + "\n")
os.replace(os.path.join(out, "summary.md.tmp"), os.path.join(out, "summary.md"))   # a killed call keeps a whole one
PY
}

# ---- step 0: the probe (seconds: a missing piece stops the call here, not minutes into a step), then random-token
# shards, the runs' configs as resolved, and their estimates: once for the whole call
run probe "$PY" - <<'PY' || { say "the probe failed: fix the lines above and rerun"; summary; exit 1; }
import importlib, os, shutil, sys, sysconfig, time
dry, hf = os.environ.get("DRY_RUN") == "1", os.environ.get("HF") == "1"
need = {"train": "train.py", "scripts.bench": "bench.py (steps 3-6)", "lib.preparation": "the shards (step 0)",
        "torch.distributed.run": "torchrun (steps 1, 2)", "torch.distributed.checkpoint": "sharded checkpoints (2)",
        "torch.distributed.fsdp": "FSDP2 (step 2)", **({"transformers": "HF=1 (step 3)"} if hf else {})}
missing = []
for module, why in need.items():
    try:
        importlib.import_module(module)
    except Exception as e:
        missing.append(f"import {module} ({why}): {type(e).__name__}: {str(e).splitlines()[0][:160]}")
cc = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
if not cc or not shutil.which(cc):
    missing.append("no C compiler (cc, gcc or clang on PATH, or CC): torch.compile builds its kernels with one")
if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    missing.append(f"no Python.h in {sysconfig.get_paths()['include']}: the compiled kernels need Python's headers "
                   "(the python3-dev package)")
import torch
device, t0 = "cpu" if dry else "cuda", time.time()
try:
    y = torch.compile(lambda x: torch.sin(x) * 2 + 1)(torch.ones(256, device=device))
    compiled = f"one tiny op compiled and run on {device} in {time.time() - t0:.1f} s ({float(y[0]):.4f})"
except Exception as e:
    missing.append(f"torch.compile of one tiny op on {device}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
for line in missing:
    print(f"error: {line}")
if missing:
    sys.exit(1)
print(f"probe: every module and tool the steps need is here; {compiled}")
PY
run prepare "$PY" - "$DATA_DIR" "${DATA[@]}" "$OUT/configs" "${T170[@]}" :: "${T1B[@]}" \
    --max_steps=$((2 * STEPS_1B)) <<'PY'
import dataclasses, json, os, sys, numpy as np
from config import load_config
from data import write_shard
from lib.preparation import write_manifest
d, tokenizer, vocab, eot, tokens, configs = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]), sys.argv[6]
if not os.path.exists(f"{d}/manifest.json"):                        # else: an earlier call's, the same
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, n in (("rand_val_000000.bin", tokens // 25), ("rand_train_000001.bin", tokens)):
        write_shard(f"{d}/{name}", rng.integers(0, vocab, n), tokenizer=tokenizer, vocab_size=vocab, eot_token=eot)
    write_manifest(d, {"rand_val_000000.bin": "val", "rand_train_000001.bin": "train"})
argv = sys.argv[7:]
split = argv.index("::")
for run_argv in (argv[:split], argv[split + 1:]):   # each as train.py will read it, for bench.py --memory
    cfg = dataclasses.asdict(load_config(run_argv))
    name = os.path.basename(cfg["out_dir"])
    open(f"{configs}/{name}.py", "w").write("".join(f"{k} = {v!r}\n" for k, v in cfg.items()))
    json.dump(cfg, open(f"{configs}/{name}.json", "w"), indent=1)
    print(f"{configs}/{name}.py: {' '.join(run_argv)}")
PY
run estimate "$PY" scripts/bench.py --memory "$OUT/configs/170m_jreg.py" "$OUT/configs/1b.py" --world "$NPROC" \
    $([ "$DRY_RUN" = 1 ] || echo --gpu_gib "$GPU_GIB")
cp "$OUT/steps/estimate.txt" "$OUT/estimate.txt" 2> /dev/null
summary

for step in $STEPS; do
  case $step in
    1) rm -rf "${WORK:?}/170m_jreg"
       run train_170m_jreg "${DIST[@]}" train.py "${T170[@]}"
       done_with 170m_jreg train_170m_jreg ;;
    2) rm -rf "${WORK:?}/1b"
       run train_1b "${DIST[@]}" train.py "${T1B[@]}"
       cp "$WORK/1b/log.jsonl" "$OUT/runs/train_1b.jsonl" 2> /dev/null
       rm -rf "$WORK/1b/$(printf 'ckpt_%07d' $((2 * STEPS_1B)))"      # the resume starts from the one at STEPS_1B
       if [ "$DRY_RUN" = 1 ]; then   # a full disk at the checkpoint: exit 1, one error line, the step-3 one kept
         EXPECT=1 run full_disk_1b bash -c 'ulimit -f 1024; exec "$@"' _ "${DIST[@]}" train.py "${T1B[@]}" \
           && { grep -q "^error: cannot write checkpoint .*GiB free in" \
           "$OUT/steps/full_disk_1b.txt" || { say "full_disk_1b: no error line"; FAILED=1; }; }
       fi
       # a resume needs a whole checkpoint (not a half-written ckpt_*.tmp), else it would start afresh
       if ls "$WORK/1b" 2> /dev/null | grep -qE '^ckpt_[0-9]+(\.pt)?$'; then
         run train_1b_resume "${DIST[@]}" train.py "${T1B[@]}"
         # exact resume: the same data position and state; the numbers equal up to the kernels' nondeterminism
         run resume_matches_1b "$PY" - "$OUT/runs/train_1b.jsonl" "$WORK/1b/log.jsonl" "$STEPS_1B" <<'PY'
import json, os, sys
first, resumed, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
dry = os.environ.get("DRY_RUN") == "1"
tol = 1e-6 if dry else float(os.environ.get("RESUME_RTOL", "5e-3"))
steps = lambda path: {r["step"]: r for r in map(json.loads, open(path)) if "loss" in r and r["step"] > at}
a, b = steps(first), steps(resumed)
common = sorted(a.keys() & b.keys())
if not common:
    sys.exit(f"error: no step after {at} in both {first} and {resumed}")
worst = {k: max(abs(a[s][k] - b[s][k]) / abs(a[s][k]) for s in common) for k in ("loss", "grad_norm")}
print(f"steps {common[0]}-{common[-1]} redone after the resume from step {at}: worst relative difference: loss "
      f"{worst['loss']:.1e}, grad_norm {worst['grad_norm']:.1e} (tolerance {tol:g}: "
      + ("a CPU's kernels are deterministic)" if dry else "flash attention's backward, cuBLAS and NCCL are not "
         "deterministic on a GPU; RESUME_RTOL sets it)"))
sys.exit(1 if max(worst.values()) > tol else 0)
PY
       else
         say "train_1b_resume: skipped (train_1b left no checkpoint)"
         printf 'train_1b_resume\tskipped\t0\n' >> "$OUT/steps.tsv"; FAILED=1
       fi
       done_with 1b train_1b_resume ;;
    3) run bench_170m "$PY" scripts/bench.py --preset "$PRESET_170" "${BENCH_MODE[@]}" "${BENCH_TIMES[@]}" \
           "${HF_FLAG[@]}" ;;
    4) run probe_170m "$PY" scripts/bench.py --memory_probe --preset "$PRESET_170" "${BENCH_MODE[@]}" \
           "${BENCH_TIMES[@]}" ;;
    5) run probe_3.4b "$PY" scripts/bench.py --memory_probe --preset "$PRESET_BIG" "${BIG_MODE[@]}" \
           --micro_batch "$MB_BIG" --seq_len "$SEQ" --warmup 1 --repeats 2 ;;
    6) run loss_chunks_170m "$PY" scripts/bench.py --loss_chunks "${CHUNKS[@]}" --preset "$PRESET_170" \
           "${CHUNK_MODE[@]}" --warmup 1 --repeats 3 ;;
  esac
  summary
done
cat "$OUT/summary.md"
exit "$FAILED"
