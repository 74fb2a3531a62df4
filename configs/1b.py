# 1B baseline (lambda = 0), FSDP2: torchrun --nproc_per_node=8 train.py configs/1b.py
model = "1b"
data_dir = "data/fineweb_edu_100BT"
out_dir = "out/1b"
batch_tokens = 524288          # 256 sequences x 2048 tokens
seq_len = 2048
micro_batch = 8               # per GPU; grad_accum = 256 / (micro_batch * n_gpus)
max_steps = 200000             # ~105B tokens
warmup_steps = 2000
lr = 3e-4
fsdp = True
sharded_ckpt = True           # each GPU writes its shard (async_ckpt=True: in the background)
jreg_lambda = 0.0
jreg_alpha = 1.0
eval_interval = 2000
ckpt_interval = 2000
keep_every = 20000             # kept for good: ζ over training, fine-tuning from step 20000
