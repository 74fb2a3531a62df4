# 1B with LayerNorm Scaling (arXiv 2502.05795) as its authors run it: block l's pre-norm outputs scaled by
# 1/sqrt(l), every matrix drawn at std 0.02 (the LNS repository's init): one of the methods compared with JREG
# (docs/methods.md). Off in every other config.
include("1b.py")             # the baseline's settings
out_dir = "out/1b_lns"
layernorm_scaling = True
depth_scaled_init = False
