"""
How far the old readout put Backout's logit lens and skipped-block loss off: one run's final checkpoint profiled as
evaluate.py --profile does (its validation windows, the lens and the skipped blocks on the first 4,096 tokens), once
reading each stream as the model reads its own last one (Llama.head_input: N(h − λ·h_k)) and once as the profiles of
the comparison's Backout runs were made, lm_head(norm(h)), without − λ·h_k. The run: seed 1337 of the Backout condition
retrained as run_methods.py trains it (results/study_runs.py's train_and_profile of configs/kjv_backout_half.py):

    OMP_NUM_THREADS=1 python -c "import sys; sys.path.insert(0, 'results'); from study_runs import train_and_profile; \
        train_and_profile('configs/kjv_backout_half.py', 'out/backout_check', 1337)"
    python results/methods/backout_readout.py [--run out/backout_check]

Prints and writes results/methods/backout_readout.json: under each readout the analysis loss, the lens at layer L, the
loss increase when block L is skipped and the mean lens over h_3..h_{L−1} (with the per-layer lists), and the same
numbers of the committed run of that seed (results/methods/runs/backout_seed1337.json, made with the old readout), so
that a rerun that reproduces them shows the correction of that run's cells. numbers_methods.backout_readout() writes
the sentence of docs/methods.md from it.
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import numbers_reproduction as repro  # noqa: E402

OUT = os.path.join(HERE, "backout_readout.json")
COMMITTED = os.path.join(HERE, "runs", "backout_seed1337.json")


def summary(p):
    """The numbers of a profile that read a stream through the head."""
    return {"analysis_loss": p["analysis_loss"], "lens_L": p["logit_lens_loss"][-1],
            "skip_L": p["skip_block_loss_increase"][-1], "lens_mid": repro.LAYER_ROWS["lens_mid"][2](p),
            "logit_lens_loss": p["logit_lens_loss"], "skip_block_loss_increase": p["skip_block_loss_increase"]}


def old_readout(model, h, hidden):
    """The readout the profiles used before Llama.head_input: the final norm and the head, no − λ·h_k."""
    return model.lm_head(model.norm(h))


def profile(run, old):
    """evaluate.py --profile of the run's final checkpoint, with the old readout or the current one."""
    import evaluate
    import lib.profiles
    current = lib.profiles.readout
    if old:
        lib.profiles.readout = old_readout
    try:
        with tempfile.TemporaryDirectory() as tmp:
            evaluate.main([run, "--profile", "--out", os.path.join(tmp, "profile.json")])
            return json.load(open(os.path.join(tmp, "profile.json")))
    finally:
        lib.profiles.readout = current


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--run", default="out/backout_check", help="the Backout run folder (default out/backout_check)")
    p.add_argument("--out", default=OUT, help="the JSON written (default results/methods/backout_readout.json)")
    args = p.parse_args()
    os.chdir(ROOT)
    import torch
    torch.set_num_threads(1)
    now, before = profile(args.run, old=False), profile(args.run, old=True)
    config = json.load(open(os.path.join(args.run, "config.json")))["config"]
    if not config["shape"].get("backout_layer"):
        raise SystemExit(f"error: {args.run} is no Backout run (backout_layer is off)")
    committed = json.load(open(COMMITTED))
    from study_runs import machine
    out = {"run": args.run, "seed": config["seed"], "backout_layer": config["shape"]["backout_layer"],
           "machine": machine(),
           "step": now["source"]["step"], "analysis_tokens": now["profile"]["analysis_tokens"],
           "current": summary(now["profile"]), "old": summary(before["profile"]),
           "committed": {"run": os.path.relpath(COMMITTED, ROOT), "machine": committed["machine"],
                         **summary(committed["profile"])}}
    with open(args.out + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(args.out + ".tmp", args.out)
    print(f"{'':>28} {'current':>9} {'old':>9} {'committed':>9}")
    for key, label in (("analysis_loss", "analysis loss"), ("lens_L", "lens at L"), ("skip_L", "skip block L"),
                       ("lens_mid", "mean lens h_3..h_{L-1}")):
        print(f"{label:>28} {out['current'][key]:9.4f} {out['old'][key]:9.4f} {out['committed'][key]:9.4f}")
    print(f"wrote {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
