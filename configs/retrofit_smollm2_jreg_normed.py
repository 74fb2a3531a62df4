# Retrofit at CPU scale with JREG on the normed h_L (lambda = 1, alpha = 1, jreg_final_norm = True): the penalty reads
# h_L after the final RMSNorm, the vector the head reads and Hugging Face reports (docs/retrofit.md, "The normed jump").
include("retrofit_smollm2_jreg.py")
out_dir = "out/retrofit/jreg_normed"
jreg_final_norm = True
