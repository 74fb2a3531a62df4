# 1B with early-exit loss (LayerSkip, arXiv 2404.16710): + 0.1 x the mean CE of the logit lens of blocks 1..L-1 (0.1:
# our choice): one of the methods compared with JREG (docs/methods.md). Off in every other config.
include("1b.py")             # the baseline's settings
out_dir = "out/1b_early_exit"
early_exit = 0.1
