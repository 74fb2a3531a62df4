# The small fine-tuning demonstration (docs/finetuning.md, "Fine-tuning at small scale"): the KJV baseline fine-tuned
# on ShareGPT conversations, byte tokens, CPU. Data: python -m scripts.prepare_sft --input data/sharegpt.jsonl
#   --out_dir data/sharegpt_bytes --tokenizer bytes --seq_len 512 --val_conversations 200
# It starts from docs/reproduction.md's baseline; after only the quick start (bash quickstart.sh), from its baseline:
#   python train.py configs/sft_kjv.py --init_from=out/quickstart/base
init_from = "out/kjv/base"
data_dir = "data/sharegpt_bytes"
out_dir = "out/kjv/sft_base"
tokenizer = "bytes"
device = "cpu"
compile = False
batch_tokens = 8192            # 16 sequences x 512 tokens
seq_len = 512
micro_batch = 16
loss_chunk = 1024              # as the committed results (results/sft_kjv/) were made
max_steps = 200                # about 0.24 epoch of the packed windows (13,401 conversations)
lr = 1e-3
warmup_ratio = 0.03
min_lr_ratio = 0.0
weight_decay = 0.0
eval_interval = 50
eval_batches = 8
ckpt_interval = 100
keep_ckpts = 10
jreg_lambda = 0.0
