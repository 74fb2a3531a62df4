# The small CPU reproduction with Backout (modded-nanogpt, 2025-10-04 record) as the record runs it: the head reads
# N(h_L - lambda * h_k), k = 3L/4 (the record backs out the stream after 0-based block 8 of 12), lambda learned from
# 0.5 at 5x the learning rate: one of the methods compared with JREG (docs/methods.md). Off in every other config.
include("kjv.py")             # the baseline's settings
out_dir = "out/kjv/backout"
backout_layer = 6
backout_lr_mult = 5.0
