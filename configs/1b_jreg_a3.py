# 1B with JREG (lambda = 1, alpha = 3)
include("1b.py")             # the baseline's settings
out_dir = "out/1b_jreg_a3"
jreg_lambda = 1.0
jreg_alpha = 3.0
