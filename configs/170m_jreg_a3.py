# 170M with JREG (lambda = 1, alpha = 3)
model = "170m"
data_dir = "data/fineweb_edu_100BT"
out_dir = "out/170m_jreg_a3"
batch_tokens = 524288          # 256 sequences x 2048 tokens
seq_len = 2048
micro_batch = 32               # per GPU; grad_accum = 256 / (micro_batch * n_gpus)
max_steps = 200000             # ~105B tokens
warmup_steps = 2000
lr = 6e-4
fsdp = False
jreg_lambda = 1.0
jreg_alpha = 3.0
eval_interval = 2000
ckpt_interval = 2000
