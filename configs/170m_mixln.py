# 170M with Mix-LN (arXiv 2412.13795): the first 25% of the blocks Post-LN, the rest Pre-LN: one of the methods
# compared with JREG (docs/methods.md). Off in every other config.
include("170m.py")             # the baseline's settings
out_dir = "out/170m_mixln"
mix_ln = 0.25
