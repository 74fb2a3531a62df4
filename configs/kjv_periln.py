# The small CPU reproduction with Peri-LN (arXiv 2502.02732): a norm on each sublayer's output too: one of the methods
# compared with JREG (docs/methods.md). Off in every other config.
include("kjv.py")             # the baseline's settings
out_dir = "out/kjv/periln"
peri_ln = True
