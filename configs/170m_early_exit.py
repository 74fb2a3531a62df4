# 170M with LayerSkip's early-exit loss (arXiv 2404.16710) as torchtune's early-exit recipe computes it: the exits
# and h_L weighted by depth (sum_l), the exits below L x e_scale = 0.1, every 2nd exit trained, rotated each step
# (e_scale and the stride: our choices, as in kjv_early_exit.py): one of the methods compared with JREG
# (docs/methods.md). Off in every other config.
include("170m.py")             # the baseline's settings
out_dir = "out/170m_early_exit"
early_exit = 0.1
early_exit_scale = "sum_l"
early_exit_every = 2
