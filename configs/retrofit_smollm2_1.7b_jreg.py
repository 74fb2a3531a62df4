# Retrofit at full scale with JREG (lambda = 1, alpha = 1): the baseline's run with the penalty on.
include("retrofit_smollm2_1.7b.py")
out_dir = "out/retrofit_1.7b/jreg"
jreg_lambda = 1.0
jreg_alpha = 1.0
