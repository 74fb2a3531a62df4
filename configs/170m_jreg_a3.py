# 170M with JREG (lambda = 1, alpha = 3)
include("170m.py")             # the baseline's settings
out_dir = "out/170m_jreg_a3"
jreg_lambda = 1.0
jreg_alpha = 3.0
