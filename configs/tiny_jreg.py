# configs/tiny.py with JREG (lambda = 1, alpha = 1).
include("tiny.py")             # the baseline's settings
out_dir = "out/tiny_jreg"
jreg_lambda = 1.0
jreg_alpha = 1.0
