# Supervised fine-tuning of the 1b JREG model, JREG kept on (λ = 1, α = 1)
include("sft_1b.py")
init_from = "out/1b_jreg"
out_dir = "out/sft_1b_jreg"
jreg_lambda = 1.0
jreg_alpha = 1.0
