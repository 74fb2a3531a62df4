# 170M baseline (lambda = 0): torchrun --nproc_per_node=8 train.py configs/170m.py
model = "170m"
data_dir = "data/fineweb_edu_100BT"
out_dir = "out/170m"
batch_tokens = 524288          # 256 sequences x 2048 tokens
seq_len = 2048
micro_batch = 32               # per GPU; grad_accum = 256 / (micro_batch * n_gpus)
max_steps = 200000             # ~105B tokens
warmup_steps = 2000
lr = 6e-4
fsdp = False
jreg_lambda = 0.0
jreg_alpha = 1.0
eval_interval = 2000
ckpt_interval = 2000
keep_every = 20000             # kept for good: ζ over training, fine-tuning from step 20000
