# The early-exit loss as a uniform term on every step: CE_L + 0.1 x the mean CE of the logit lens of blocks 1..L-1:
# the variant that differs from LayerSkip's recipe (kjv_early_exit.py) in the scale and the curriculum
# (docs/methods.md).
include("kjv_early_exit.py")  # LayerSkip's recipe
out_dir = "out/kjv/early_exit_uniform"
early_exit_scale = "uniform"
early_exit_every = 0
