# Supervised fine-tuning of the 1b baseline: the 3.4B SFT settings [ours] at this size
include("sft_3.4b.py")
init_from = "out/1b"
out_dir = "out/sft_1b"
micro_batch = 8
fsdp = True
