"""
Redraw every committed plot that is drawn from committed JSON, with the plotting code of evaluate.py --plot and
scripts/survey.py --plot (lib/profiles.py: plot_profiles), so that a change to that code reaches the committed figures
and no figure is drawn by hand:

    python results/plots.py                    # rewrites the PNGs below in results/
    python results/plots.py --out DIR          # the same files under DIR (DIR/retrofit/psi_profiles.png, ...)
    python results/plots.py --only retrofit layers/kjv

Each PNG and the JSON it is drawn from (in results/; the command that wrote the JSON is on the docs page named):

    kjv/layer_analysis.png                              kjv/profiles.json (reproduction.md, the five 600-step runs)
    smollm2/{psi_profiles,layer_analysis}.png           smollm2/profile.json (layers.md)
    layers/smollm2/{psi_profiles,layer_analysis,early_exit}.png    layers/smollm2/early_exit.json (layers.md)
    layers/kjv/{psi_profiles,layer_analysis,early_exit}.png        layers/kjv/early_exit.json (layers.md)
    layers/survey/{psi_profiles,zeta_over_checkpoints}.png         layers/survey/survey.json (layers.md)
    retrofit/{psi_profiles,layer_analysis,early_exit}.png   retrofit/before.json and after_{base,jreg,jreg_normed}.json
    retrofit/zeta_over_checkpoints.png                  retrofit/profiles.json and profiles_jreg_normed.json, with
                                                        the source (before.json's model, profiled in profiles.json)
                                                        as step 0 of every run (retrofit.md, scripts/retrofit.sh)
    sft_kjv/kjv/{psi_profiles,layer_analysis}.png       sft_kjv/profile_kjv.json (finetuning.md)
    sft_kjv/chat/{psi_profiles,layer_analysis}.png      sft_kjv/profile_chat.json (finetuning.md)

Not drawn here: kjv/psi_profiles.png and kjv/zeta_over_training.png (results/collect.py draws them from the seed
runs) and kjv/zeta_over_checkpoints.png (evaluate.py --all_ckpts of out/kjv/base, kjv/base_checkpoints.json; its
replacement is another owner's).
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lib.profiles import plot_profiles, report_figures       # noqa: E402

RESULTS = os.path.join(ROOT, "results")


def load(path):
    with open(os.path.join(RESULTS, path), encoding="utf-8") as f:
        return json.load(f)


def report(path):
    """evaluate.py's JSON as {model: entry}: its `models`, or the one model it holds under its own name."""
    d = load(path)
    return d["models"] if "models" in d else {d["model"]: d}


def evaluation(path, *files):
    return lambda: (*report_figures(report(path)), files or None)


def survey():
    from scripts.survey import figures                     # the survey's own series (NAME@STEP, revisions)
    return (*figures(load("layers/survey/survey.json")["models"]), None, None)


def retrofit(results=RESULTS):
    """The source and the three runs at step 120 (profiles, early exit) and ζ over the checkpoints, the source's
    profile on the same windows as step 0 of each run."""
    read = lambda name: json.load(open(os.path.join(results, name), encoding="utf-8"))    # noqa: E731
    runs = ("base", "jreg", "jreg_normed")
    models = {"source": read("before.json")} | {run: read(f"after_{run}.json") for run in runs}
    checkpoints = read("profiles.json")["models"]
    source = checkpoints[models["source"]["model"]]["profile"]
    checkpoints["jreg_normed"] = read("profiles_jreg_normed.json")
    series = {run: [{**source, "step": 0}] + checkpoints[run]["profile_checkpoints"] for run in runs}
    return {name: m["profile"] for name, m in models.items()}, series, models, None


FIGURES = {                     # folder in results/: () -> (profiles, series, exits, files) for plot_profiles
    "kjv": evaluation("kjv/profiles.json", "layer_analysis.png"),
    "smollm2": evaluation("smollm2/profile.json"),
    "layers/smollm2": evaluation("layers/smollm2/early_exit.json"),
    "layers/kjv": evaluation("layers/kjv/early_exit.json"),
    "layers/survey": survey,
    "retrofit": retrofit,
    "sft_kjv/kjv": evaluation("sft_kjv/profile_kjv.json"),
    "sft_kjv/chat": evaluation("sft_kjv/profile_chat.json"),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    p.add_argument("--out", default=RESULTS, help="folder to write into, as results/ is laid out (default: results/)")
    p.add_argument("--only", nargs="+", choices=list(FIGURES), help="these folders only")
    args = p.parse_args(argv)
    written = []
    for folder in args.only or FIGURES:
        profiles, series, exits, files = FIGURES[folder]()
        out = os.path.join(args.out, folder)
        os.makedirs(out, exist_ok=True)
        for path in plot_profiles(profiles, out, series, exits, files=files):
            print(f"wrote {os.path.relpath(path)}")
            written.append(path)
    return written


if __name__ == "__main__":
    main()
