# 1B with JREG (lambda = 1, alpha = 1; the paper's best at 1B)
include("1b.py")             # the baseline's settings
out_dir = "out/1b_jreg"
jreg_lambda = 1.0
jreg_alpha = 1.0
