# Retrofit at full scale, baseline (lambda = 0): continued pre-training of SmolLM2-1.7B (a Llama: 24 layers, d 2048,
# 32 heads, vocabulary 49,152, the tokenizer of the CPU experiment) on FineWeb-edu in its own tokenizer, 8 GPUs, FSDP2:
#   python prepare_fineweb.py --name sample-10BT --out_dir data/fineweb_edu_smollm2 --tokenizer hf:HuggingFaceTB/SmolLM2-1.7B
#   python -m scripts.convert_hf hf:HuggingFaceTB/SmolLM2-1.7B out/retrofit_1.7b/smollm2_1.7b_converted \
#       --tokenizer hf:HuggingFaceTB/SmolLM2-1.7B                       # once: the weights as our checkpoint
#   torchrun --nproc_per_node=8 train.py configs/retrofit_smollm2_1.7b.py        # and configs/retrofit_smollm2_1.7b_jreg.py
# 4,000 steps x 524,288 tokens = 2.1B tokens: 2.0 h on 8 H100 at an assumed 40% MFU (1.09e10 FLOP/token,
# Llama.flops_per_token; not measured). Predicted peak memory per GPU: docs/retrofit.md (bench.py --memory --world 8).
# Llama-3.x models use "llama3" RoPE scaling, which the conversion (lib.hf.llama_from_hf) refuses (plain RoPE only).
init_from = "out/retrofit_1.7b/smollm2_1.7b_converted"   # SmolLM2-1.7B, converted (above)
tokenizer = "hf:HuggingFaceTB/SmolLM2-1.7B"   # the data's tokenizer must be the model's (fingerprints compared)
data_dir = "data/fineweb_edu_smollm2"
out_dir = "out/retrofit_1.7b/base"
# the source's shape, for bench.py --memory only: train.py builds the model from init_from's own config
model = "1b"
n_layer, d_model, n_head, n_kv_head, ffn_hidden = 24, 2048, 32, 32, 8192
vocab_size, rope_theta, tie_embeddings = 49152, 130000.0, True
batch_tokens = 524288          # 256 sequences x 2048 tokens
seq_len = 2048
micro_batch = 8                # per GPU; grad_accum = 256 / (micro_batch * n_gpus)
max_steps = 4000               # 2.1B tokens
warmup_steps = 200
lr = 1e-4                      # a continued pre-training rate, a fifth of SmolLM2's 5e-4 peak
min_lr_ratio = 0.1
fsdp = True
sharded_ckpt = True           # each GPU writes its shard (async_ckpt=True: in the background)
jreg_lambda = 0.0
eval_interval = 250
ckpt_interval = 500
keep_ckpts = 20                # the trend of the jump over training
