# 170M with JREG (lambda = 1, alpha = 1)
include("170m.py")             # the baseline's settings
out_dir = "out/170m_jreg"
jreg_lambda = 1.0
jreg_alpha = 1.0
