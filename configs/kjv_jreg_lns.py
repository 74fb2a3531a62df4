# The small CPU reproduction with JREG (lambda = 1, alpha = 1) and LayerNorm Scaling together (docs/methods.md).
include("kjv_jreg.py")       # JREG's settings
out_dir = "out/kjv/jreg_lns"
layernorm_scaling = True
