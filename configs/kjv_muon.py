# The small CPU reproduction with Muon (docs/optimizer.md): torch.optim.Muon for the blocks' 2-D matrices, AdamW for the
# embedding, the head and the norms. Muon's settings: momentum 0.95 (Nesterov), 5 Newton-Schulz steps (PyTorch's
# defaults), adjust_lr_fn match_rms_adamw (Moonlight's: the update's RMS that of AdamW's, so one lr and weight decay
# serve both), so the AdamW baseline's lr is kept.
include("kjv.py")             # the baseline's settings
out_dir = "out/kjv/muon"
optimizer = "muon"
muon_momentum = 0.95
muon_adjust_lr = "match_rms_adamw"
