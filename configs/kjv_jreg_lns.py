# The small CPU reproduction with JREG (lambda = 1, alpha = 1) and LayerNorm Scaling (its authors' recipe) together
# (docs/methods.md).
include("kjv_lns.py")        # LNS's recipe
out_dir = "out/kjv/jreg_lns"
jreg_lambda = 1.0
jreg_alpha = 1.0
