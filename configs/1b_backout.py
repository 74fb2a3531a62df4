# 1B with Backout (modded-nanogpt, 2025-10-04 record) as the record runs it: the head reads N(h_L - lambda * h_k),
# k = 3L/4 = 12 of 16, lambda learned from 0.5 at 5x the learning rate: one of the methods compared with JREG
# (docs/methods.md). Off in every other config.
include("1b.py")             # the baseline's settings
out_dir = "out/1b_backout"
backout_layer = 12
backout_lr_mult = 5.0
