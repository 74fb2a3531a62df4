# The KJV JREG model (λ = 1, α = 1) fine-tuned like the baseline, JREG kept on. After only the quick start:
#   python train.py configs/sft_kjv_jreg.py --init_from=out/quickstart/jreg
include("sft_kjv.py")
init_from = "out/kjv/jreg_a1"
out_dir = "out/kjv/sft_jreg_a1"
jreg_lambda = 1.0
jreg_alpha = 1.0
