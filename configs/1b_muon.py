# 1B with Muon (docs/optimizer.md): torch.optim.Muon for the blocks' 2-D matrices, AdamW for the embedding, the head
# and the norms; momentum 0.95 (Nesterov), 5 Newton-Schulz steps, adjust_lr_fn match_rms_adamw (Moonlight's: one lr and
# weight decay serve both, so the baseline's lr is kept). DDP only: Muon under FSDP is refused.
include("1b.py")             # the baseline's settings
out_dir = "out/1b_muon"
optimizer = "muon"
muon_momentum = 0.95
muon_adjust_lr = "match_rms_adamw"
fsdp = False
