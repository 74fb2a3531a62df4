# Supervised fine-tuning of the 3.4B JREG model: the baseline's SFT settings, JREG kept on (λ = 1, α = 1) [ours:
# the paper does not say; --jreg_lambda=0.0 fine-tunes it without the penalty]
include("sft_3.4b.py")
init_from = "out/3.4b_jreg"
out_dir = "out/sft_3.4b_jreg"
jreg_lambda = 1.0
jreg_alpha = 1.0
