# The small CPU reproduction with LayerNorm Scaling (arXiv 2502.05795) as its authors run it: block l's pre-norm
# outputs scaled by 1/sqrt(l), every matrix drawn at std 0.02 (the LNS repository's init; its README warns that a
# depth-scaled init diminishes LNS): one of the methods compared with JREG (docs/methods.md). Off in every other config.
include("kjv.py")             # the baseline's settings
out_dir = "out/kjv/lns"
layernorm_scaling = True
depth_scaled_init = False
