# 3.4B with JREG (lambda = 1, alpha = 1)
include("3.4b.py")             # the baseline's settings
out_dir = "out/3.4b_jreg"
jreg_lambda = 1.0
jreg_alpha = 1.0
