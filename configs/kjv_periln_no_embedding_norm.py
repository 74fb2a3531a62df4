# Peri-LN without the norm on the embedding's output: the variant that differs from its authors' recipe
# (kjv_periln.py) in that norm alone (docs/methods.md).
include("kjv_periln.py")      # Peri-LN's recipe
out_dir = "out/kjv/periln_no_embedding_norm"
embedding_norm = False
