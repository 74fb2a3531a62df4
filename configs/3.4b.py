# 3.4B baseline (lambda = 0), FSDP2
model = "3.4b"
data_dir = "data/fineweb_edu_100BT"
out_dir = "out/3.4b"
batch_tokens = 524288          # 256 sequences x 2048 tokens
seq_len = 2048
micro_batch = 4               # per GPU; grad_accum = 256 / (micro_batch * n_gpus)
max_steps = 200000             # ~105B tokens
warmup_steps = 2000
lr = 1.5e-4
fsdp = True
sharded_ckpt = True           # each GPU writes its shard (async_ckpt=True: in the background)
jreg_lambda = 0.0
jreg_alpha = 1.0
eval_interval = 2000
ckpt_interval = 2000
keep_every = 20000             # kept for good: ζ over training, fine-tuning from step 20000
