# 170M with LayerNorm Scaling (arXiv 2502.05795): block l's pre-norm outputs scaled by 1/sqrt(l): one of the methods
# compared with JREG (docs/methods.md). Off in every other config.
include("170m.py")             # the baseline's settings
out_dir = "out/170m_lns"
layernorm_scaling = True
