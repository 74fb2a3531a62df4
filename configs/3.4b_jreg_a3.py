# 3.4B with JREG (lambda = 1, alpha = 3)
include("3.4b.py")             # the baseline's settings
out_dir = "out/3.4b_jreg_a3"
jreg_lambda = 1.0
jreg_alpha = 3.0
