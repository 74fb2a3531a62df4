# 170M with Backout (modded-nanogpt, 2025-10-04 record): the head reads N(h_L - lambda * h_k), k = L/2 (our choice),
# lambda learned from 0.5: one of the methods compared with JREG (docs/methods.md). Off in every other config.
include("170m.py")             # the baseline's settings
out_dir = "out/170m_backout"
backout_layer = 6
