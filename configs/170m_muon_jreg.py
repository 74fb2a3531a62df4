# 170M with Muon and JREG (lambda = 1, alpha = 1) (docs/optimizer.md).
include("170m_muon.py")        # Muon's settings
out_dir = "out/170m_muon_jreg"
jreg_lambda = 1.0
jreg_alpha = 1.0
