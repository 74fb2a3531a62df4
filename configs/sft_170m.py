# Supervised fine-tuning of the 170m baseline: the 3.4B SFT settings [ours] at this size
include("sft_3.4b.py")
init_from = "out/170m"
out_dir = "out/sft_170m"
micro_batch = 16
fsdp = False
