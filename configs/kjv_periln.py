# The small CPU reproduction with Peri-LN (arXiv 2502.02732) as its authors run it: a norm on each sublayer's output
# too, and one on the embedding's output (OLMo-core's embedding_norm): one of the methods compared with JREG
# (docs/methods.md). Off in every other config.
include("kjv.py")             # the baseline's settings
out_dir = "out/kjv/periln"
peri_ln = True
embedding_norm = True
