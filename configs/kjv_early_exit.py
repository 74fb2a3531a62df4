# The small CPU reproduction with LayerSkip's early-exit loss (arXiv 2404.16710) as torchtune's early-exit recipe
# computes it: sum over the exits and h_L of s_l * CE_l, s_l by depth (sum_l_loss_scale, the recipe's default), the
# exits below L x e_scale = 0.1, sum s = 1; the rotational curriculum trains every 2nd exit, rolled by one each step.
# e_scale 0.1 and R = 2: our choices where the recipe leaves them to the user (its default layer set makes the rotation
# a no-op). One of the methods compared with JREG (docs/methods.md). Off in every other config.
include("kjv.py")             # the baseline's settings
out_dir = "out/kjv/early_exit"
early_exit = 0.1
early_exit_scale = "sum_l"
early_exit_every = 2
