# 1B with Peri-LN (arXiv 2502.02732) as its authors run it: a norm on each sublayer's output too, and one on the
# embedding's output (OLMo-core's embedding_norm): one of the methods compared with JREG (docs/methods.md). Off in every
# other config.
include("1b.py")             # the baseline's settings
out_dir = "out/1b_periln"
peri_ln = True
embedding_norm = True
