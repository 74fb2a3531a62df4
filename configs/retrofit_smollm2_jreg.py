# Retrofit at CPU scale with JREG (lambda = 1, alpha = 1): the baseline's run with the penalty on.
include("retrofit_smollm2.py")
out_dir = "out/retrofit/jreg"
jreg_lambda = 1.0
jreg_alpha = 1.0
