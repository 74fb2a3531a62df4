# Supervised fine-tuning of the 170m JREG model, JREG kept on (λ = 1, α = 1)
include("sft_170m.py")
init_from = "out/170m_jreg"
out_dir = "out/sft_170m_jreg"
jreg_lambda = 1.0
jreg_alpha = 1.0
