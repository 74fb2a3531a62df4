"""
Redraw every committed plot that is drawn from committed JSON, with the plotting code of evaluate.py --plot and
scripts/survey.py --plot (lib/profiles.py: plot_profiles), so that a change to that code reaches the committed figures
and no figure is drawn by hand:

    python results/plots.py                    # rewrites the PNGs below in results/
    python results/plots.py --out DIR          # the same files under DIR (DIR/retrofit/psi_profiles.png, ...)
    python results/plots.py --only retrofit layers/kjv

Each PNG and the JSON it is drawn from (in results/; the command that wrote the JSON is on the docs page named, where
the figure is shown):

    kjv/layer_analysis.png                              kjv/profiles.json (reproduction.md, the five 600-step runs)
    kjv/zeta_over_checkpoints.png                       kjv/base_checkpoints.json (evaluate.py --all_ckpts of the
                                                        600-step baseline of one seed; reproduction.md)
    kjv/600_steps/psi_profiles.png                      kjv/profiles.json (the same runs' Ψ per layer)
    smollm2/{psi_profiles,layer_analysis}.png           smollm2/profile.json (layers.md)
    layers/smollm2/early_exit.png                       layers/smollm2/early_exit.json (layers.md)
    layers/kjv/{layer_analysis,early_exit}.png          layers/kjv/early_exit.json (layers.md)
    layers/survey/{psi_profiles,zeta_over_checkpoints}.png         layers/survey/survey.json (layers.md)
    retrofit/{psi_profiles,layer_analysis,early_exit}.png   retrofit/before.json and after_{base,jreg,jreg_normed}.json
    retrofit/zeta_over_checkpoints.png                  retrofit/profiles.json and profiles_jreg_normed.json, with
                                                        the source (before.json's model, profiled in profiles.json)
                                                        as step 0 of every run (retrofit.md, scripts/retrofit.sh)
    sft_kjv/kjv/psi_profiles.png                        sft_kjv/profile_kjv.json (finetuning.md)
    sft_kjv/chat/{psi_profiles,layer_analysis}.png      sft_kjv/profile_chat.json (finetuning.md)

The colours, sizes and legends are lib/style.py's, shared with every other figure. Not drawn here:
kjv/psi_profiles.png and kjv/zeta_over_training.png (results/collect.py draws them from the seed runs, with
results/numbers_reproduction.py's plots) and results/methods/{comparison,optimizer}.png (results/methods/numbers_*.py).
"""
import argparse
import functools
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lib.profiles import plot_profiles, report_figures       # noqa: E402

RESULTS = os.path.join(ROOT, "results")


def load(path, folder=RESULTS):
    with open(os.path.join(folder, path), encoding="utf-8") as f:
        return json.load(f)


def report(path):
    """evaluate.py's JSON as {model: entry}: its `models`, or the one model it holds under its own name."""
    d = load(path)
    return d["models"] if "models" in d else {d["model"]: d}


def evaluation(path, *files):
    """The figures evaluate.py --plot drew from this JSON (only `files` of them, if given)."""
    return [path], lambda: (*report_figures(report(path)), files or None)


def survey():
    from scripts.survey import figures                     # the survey's own series (NAME@STEP, revisions)
    return (*figures(load("layers/survey/survey.json")["models"]), None, None)


RUNS = ("base", "jreg", "jreg_normed")                    # the retrofit's runs (docs/retrofit.md)


def retrofit(folder=os.path.join(RESULTS, "retrofit")):
    """The source and the three runs at step 120 (profiles, early exit), and ζ over each run's checkpoints with the
    source, profiled on the same windows (profiles.json), as its step 0. scripts/retrofit.sh draws with this too."""
    models = {"source": load("before.json", folder)} | {run: load(f"after_{run}.json", folder) for run in RUNS}
    checkpoints = load("profiles.json", folder)["models"] | {"jreg_normed": load("profiles_jreg_normed.json", folder)}
    source = checkpoints[models["source"]["model"]]["profile"]
    series = {run: [{**source, "step": 0}] + checkpoints[run]["profile_checkpoints"] for run in RUNS}
    return {name: m["profile"] for name, m in models.items()}, series, models, None


def kjv():
    """The five 600-step runs (their logit lens and skipped blocks) and the baseline's checkpoints (its ζ)."""
    profiles = report_figures(report("kjv/profiles.json"))[0]
    series = report_figures(report("kjv/base_checkpoints.json"))[1]
    return profiles, series, None, ("layer_analysis.png", "zeta_over_checkpoints.png")


AFTER = ["retrofit/before.json"] + [f"retrofit/after_{run}.json" for run in RUNS]
FIGURES = {     # folder in results/: (its JSON files, or {PNG: its JSON files}; () -> plot_profiles' arguments)
    "kjv": ({"layer_analysis.png": ["kjv/profiles.json"], "zeta_over_checkpoints.png": ["kjv/base_checkpoints.json"]},
            kjv),
    "kjv/600_steps": evaluation("kjv/profiles.json", "psi_profiles.png"),
    "smollm2": evaluation("smollm2/profile.json"),
    "layers/smollm2": evaluation("layers/smollm2/early_exit.json", "early_exit.png"),
    "layers/kjv": evaluation("layers/kjv/early_exit.json", "layer_analysis.png", "early_exit.png"),
    "layers/survey": (["layers/survey/survey.json"], survey),
    "retrofit": ({"psi_profiles.png": AFTER, "layer_analysis.png": AFTER, "early_exit.png": AFTER,
                  "zeta_over_checkpoints.png": ["retrofit/profiles.json", "retrofit/profiles_jreg_normed.json"]},
                 retrofit),
    "sft_kjv/kjv": evaluation("sft_kjv/profile_kjv.json", "psi_profiles.png"),
    "sft_kjv/chat": evaluation("sft_kjv/profile_chat.json"),
}


@functools.cache
def task_rates(name):
    return load(name)["rates"]


def with_majority(exits):
    """Results made before evaluate.py recorded each task's majority-class rate get it from results/task_rates_N.json:
    the rates of the same first N documents (results/task_rates.py), drawn beside chance."""
    for entry in (exits or {}).values():
        for task, r in entry["results"].items():
            rates = f"task_rates_{r.get('n')}.json"
            if "acc" in r and "majority" not in r and os.path.exists(os.path.join(RESULTS, rates)):
                r["majority"] = task_rates(rates)[task]["majority"]
    return exits


def main(argv=None):
    p = argparse.ArgumentParser(description="Redraw the committed plots from the committed JSON (lib/profiles.py's "
                                            "plot_profiles); each PNG is printed with the JSON it is drawn from.")
    p.add_argument("--out", default=RESULTS, help="folder to write into, laid out as results/ (default: results/)")
    p.add_argument("--only", nargs="+", choices=list(FIGURES), metavar="FOLDER",
                   help=f"these folders only, of {', '.join(FIGURES)}")
    args = p.parse_args(argv)
    written = []
    for folder in args.only or FIGURES:
        sources, figures = FIGURES[folder]
        profiles, series, exits, files = figures()
        exits = with_majority(exits)
        out = os.path.join(args.out, folder)
        os.makedirs(out, exist_ok=True)
        for path in plot_profiles(profiles, out, series, exits, files=files):
            json_files = sources[os.path.basename(path)] if isinstance(sources, dict) else sources
            shown = os.path.relpath(path, ROOT) if os.path.abspath(path).startswith(ROOT + os.sep) else path
            print(f"{shown}  <-  {', '.join('results/' + s for s in json_files)}")
            written.append(path)
    return written


if __name__ == "__main__":
    main()
