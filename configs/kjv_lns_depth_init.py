# LayerNorm Scaling on the depth-scaled init (o_proj/down_proj at 0.02/sqrt(2L), the baseline's): the variant that
# differs from its authors' recipe (kjv_lns.py) in the init alone (docs/methods.md).
include("kjv_lns.py")         # LNS's recipe
out_dir = "out/kjv/lns_depth_init"
depth_scaled_init = True
