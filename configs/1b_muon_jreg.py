# 1B with Muon and JREG (lambda = 1, alpha = 1) (docs/optimizer.md).
include("1b_muon.py")        # Muon's settings
out_dir = "out/1b_muon_jreg"
jreg_lambda = 1.0
jreg_alpha = 1.0
