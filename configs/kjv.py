# The small CPU reproduction (README, "Reproduction at small scale"): baseline, lambda = 0.
# 8 layers x d_model 128, byte-level tokens of the King James Bible, 600 steps x 4096 tokens.
# Data: python prepare_fineweb.py --input $KJV --out_dir data/kjv_bytes --prefix kjv --tokenizer bytes ...
model = "tiny"                 # 8 layers, d_model 128, 4 heads / 2 KV heads, SwiGLU 352
vocab_size = 320               # 256 bytes + <|endoftext|>, padded to a multiple of 64
tokenizer = "bytes"
data_dir = "data/kjv_bytes"
out_dir = "out/kjv/base"
device = "cpu"
compile = False
batch_tokens = 4096            # 16 sequences x 256 tokens
seq_len = 256
micro_batch = 16
max_steps = 600
warmup_steps = 50
lr = 3e-3
decay_embeddings = True        # weight decay on the embedding too, as the committed KJV results were made
loss_chunk = 1024              # the loss in chunks of 1024 positions, as the committed KJV results were made
eval_interval = 50             # Ψ and ζ over training, in log.jsonl
eval_batches = 8
ckpt_interval = 50             # every checkpoint kept, for ζ_L over training
keep_ckpts = 100
jreg_lambda = 0.0
