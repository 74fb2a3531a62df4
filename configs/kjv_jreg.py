# The small CPU reproduction with JREG: lambda = 1, alpha = 1.
include("kjv.py")              # the baseline's settings
out_dir = "out/kjv/jreg_a1"
jreg_lambda = 1.0
jreg_alpha = 1.0
