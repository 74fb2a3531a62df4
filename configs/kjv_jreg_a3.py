# The small CPU reproduction with JREG: lambda = 1, alpha = 3.
include("kjv.py")              # the baseline's settings
out_dir = "out/kjv/jreg_a3"
jreg_lambda = 1.0
jreg_alpha = 3.0
