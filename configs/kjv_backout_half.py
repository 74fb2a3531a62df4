# Backout reading h_{L/2}, lambda at the base learning rate: the variant that differs from the record's recipe
# (kjv_backout.py) in the layer and lambda's learning rate (docs/methods.md).
include("kjv_backout.py")     # the record's recipe
out_dir = "out/kjv/backout_half"
backout_layer = 4
backout_lr_mult = 1.0
