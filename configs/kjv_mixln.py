# The small CPU reproduction with Mix-LN (arXiv 2412.13795): the first 25% of the blocks Post-LN, the rest Pre-LN: one
# of the methods compared with JREG (docs/methods.md). Off in every other config.
include("kjv.py")             # the baseline's settings
out_dir = "out/kjv/mixln"
mix_ln = 0.25
