# Supervised fine-tuning of the 3.4B baseline (the paper's SFT comparison), Tulu-style settings [ours]:
#   python -m scripts.prepare_sft --out_dir data/tulu_v2 --seq_len 2048           # Tulu v2 SFT mixture, prepared once
#   torchrun --nproc_per_node=8 train.py configs/sft_3.4b.py
init_from = "out/3.4b"         # the pre-trained run's newest checkpoint (RUN_DIR@STEP for another)
data_dir = "data/tulu_v2"      # prepare_sft.py's packed conversations: loss on assistant tokens only
out_dir = "out/sft_3.4b"
tokenizer = "gpt2"
batch_tokens = 262144          # 128 sequences x 2048 tokens
seq_len = 2048
micro_batch = 4                # per GPU; grad_accum = 128 / (micro_batch * n_gpus)
fsdp = True
epochs = 2.0                   # max_steps = 2 epochs of packed windows
lr = 2e-5
warmup_ratio = 0.03
min_lr_ratio = 0.0             # cosine to zero
weight_decay = 0.0
jreg_lambda = 0.0              # the baseline stays a baseline
eval_interval = 200
eval_batches = 16
ckpt_interval = 500
