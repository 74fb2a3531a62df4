"""results/plots.py redraws every committed figure from the committed JSON with lib/profiles.py's plotting code: each
expected PNG is written (here into a temporary folder, results/ untouched) and reads cleanly by test_evaluate's
plot_problems (no title or label under the legend, no legend over a panel, no two lines alike, readable ticks), and
the defects the figures once had stay fixed. Every figure of the project, results/collect.py's and the methods
comparison's included, keeps lib/style.py's palette (the baseline blue, JREG α = 1 orange, α = 3 green), its size
and its legend inside or below the panels; every committed PNG is shown by the document that discusses it, at the
size it is drawn now. CPU, offline, about half a minute."""
import glob
import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from test_evaluate import plot_problems                  # tests/ is on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "results"), os.path.join(ROOT, "results", "methods")]
from lib.style import COLOURS, DPI, LABELS, MAX_WIDTH, role, shade     # noqa: E402

PSI, LENS, ZETA, EXIT = "psi_profiles.png", "layer_analysis.png", "zeta_over_checkpoints.png", "early_exit.png"
EXPECTED = {"kjv": [LENS, ZETA], "kjv/600_steps": [PSI], "smollm2": [PSI, LENS], "layers/smollm2": [EXIT],
            "layers/kjv": [LENS, EXIT], "layers/survey": [PSI, ZETA], "retrofit": [PSI, LENS, ZETA, EXIT],
            "sft_kjv/kjv": [PSI], "sft_kjv/chat": [PSI, LENS]}
ELSEWHERE = {"kjv/psi_profiles.png", "kjv/zeta_over_training.png",   # results/collect.py's, from the seed runs
             "methods/comparison.png",                               # numbers_comparison.py's (tests/test_comparison.py)
             "methods/optimizer.png"}                                # numbers_optimizer.py's (tests/test_comparison.py)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """{"folder/file.png": Figure} of one run of results/plots.py --out TMP, and TMP."""
    from matplotlib.figure import Figure
    out, figs, save = tmp_path_factory.mktemp("plots"), {}, Figure.savefig
    spec = importlib.util.spec_from_file_location("results_plots", os.path.join(ROOT, "results", "plots.py"))
    plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plots)
    pngs = lambda: glob.glob(os.path.join(ROOT, "results", "**", "*.png"), recursive=True)     # noqa: E731
    before = {p: os.stat(p).st_mtime_ns for p in pngs()}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", lambda fig, path, **kw: figs.update({os.path.relpath(path, out): fig}) or
                   save(fig, path, **kw))
        written = plots.main(["--out", str(out)])
    assert {p: os.stat(p).st_mtime_ns for p in pngs()} == before        # --out: nothing in results/ rewritten
    assert sorted(os.path.relpath(p, out) for p in written) == sorted(figs)
    return figs, out


def test_every_committed_figure_is_redrawn_and_reads_cleanly(drawn):
    figs, out = drawn
    assert sorted(figs) == sorted(f"{folder}/{png}" for folder, pngs in EXPECTED.items() for png in pngs)
    for name in figs:
        assert (out / name).stat().st_size > 10_000, name
    assert {name: plot_problems(fig) for name, fig in figs.items()} == {name: [] for name in figs}
    committed = {os.path.relpath(p, os.path.join(ROOT, "results")) for p in
                 glob.glob(os.path.join(ROOT, "results", "**", "*.png"), recursive=True)}
    assert committed - ELSEWHERE <= set(figs)             # a committed figure no script redraws would go stale


def test_the_figures_defects_stay_fixed(drawn):
    figs = drawn[0]
    texts = lambda fig: " ".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))   # noqa: E731
    # the logit lens of five runs: the differences from the first get a panel; losses in nats
    kjv = figs["kjv/layer_analysis.png"].axes
    assert len(kjv) == 3 and kjv[1].get_title() == "logit lens minus base's, same seed"
    assert all("(nats)" in ax.get_ylabel() for ax in kjv)
    # retrofit: the last layers in a panel of their own, the four models on layer 30's tick, each its own marker size
    psi = figs["retrofit/psi_profiles.png"].axes
    last = [ax for ax in psi if ax.get_title() == "layers 25–30, enlarged"]
    assert len(last) == 1 and {float(line.get_xdata()[-1]) for line in last[0].get_lines()} == {30.0}
    assert len({line.get_markersize() for line in last[0].get_lines() if line.get_linestyle() == "None"}) == 4
    # retrofit ζ: raw and final-normed h_L, from step 0 (the source), from 0; the normed run's fall 32.56 -> 8.53
    raw, normed = figs["retrofit/zeta_over_checkpoints.png"].axes
    assert "final-normed" in normed.get_title() and raw.get_ylim()[0] == normed.get_ylim()[0] == 0
    lines = {line.get_label(): line for line in normed.get_lines()}
    steps, zeta = lines["jreg_normed $\\zeta_L$"].get_data()
    assert steps[0] == 0 and zeta[0] == pytest.approx(32.56, abs=0.01) and zeta[-1] == pytest.approx(8.53, abs=0.01)
    # early exit: no logit-lens panel (layer_analysis.png has it), a chance level each for acc and acc_norm, from 0
    for name, chance in (("retrofit", (0.292, 0.300)), ("layers/kjv", (0.264, 0.250)),
                         ("layers/smollm2", (0.250, 0.312))):
        (ax,) = figs[f"{name}/early_exit.png"].axes
        levels = {line.get_label(): line.get_ydata()[0] for line in ax.get_lines() if "chance" in line.get_label()}
        assert sorted(levels) == [f"chance, acc ({chance[0]:.3f})", f"chance, acc_norm ({chance[1]:.3f})"], name
        assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 0.3, name
    # the chat loss when block 8 of the pre-trained JREG model is skipped: below 0, on a linear axis that shows it
    skip = figs["sft_kjv/chat/layer_analysis.png"].axes[-1]
    assert skip.get_yscale() == "linear" and skip.get_ylim()[0] < -0.0125 < 0 < skip.get_ylim()[1] < 1
    assert "skipping block 8 lowers jreg_a1's loss by 0.0125" in texts(figs["sft_kjv/chat/layer_analysis.png"])
    # the ten chat profiles: all tokens and the assistant's tokens in two panels of five
    chat = figs["sft_kjv/chat/psi_profiles.png"].axes
    assert [len([line for line in ax.get_lines() if "zeta_L" in line.get_label()]) for ax in chat] == [5, 5]
    # a lone model's long name: its title wrapped, clear of the legend (plot_problems above)
    assert figs["smollm2/psi_profiles.png"].axes[0].get_title() == "SmolLM2-135M-Instruct Q4_1, 30 layers"
    assert np.isfinite([ax.get_ylim() for fig in figs.values() for ax in fig.axes]).all()



def test_older_results_get_the_majority_rate_of_their_documents(drawn):
    """Results made before evaluate.py recorded majority rates take them from results/task_rates_N.json, N their
    documents per task (the retrofit's: 50), and the early-exit plots draw them beside chance."""
    figs, _ = drawn
    for name in ("retrofit/early_exit.png", "layers/kjv/early_exit.png", "layers/smollm2/early_exit.png"):
        labels = [t.get_text() for ax in figs[name].axes for legend in [ax.get_legend()] + figs[name].legends
                  if legend for t in legend.get_texts()]
        assert any(label.startswith("majority class, acc (") for label in labels), (name, labels)


@pytest.fixture(scope="module")
def others(tmp_path_factory):
    """{name: Figure} of the figures drawn outside results/plots.py: results/collect.py's two of the seed study (from
    the committed seed runs) and the methods comparison of numbers_comparison.plot (on synthetic runs of all 8
    methods, 3 seeds each), written into a temporary folder."""
    import numbers_comparison
    import numbers_reproduction
    import run_comparison
    from matplotlib.figure import Figure
    out, figs, save = tmp_path_factory.mktemp("others"), {}, Figure.savefig
    study = numbers_reproduction.seed_study()
    by = {c: {seed: {"profile": {"psi": [0.2, 0.03, 0.02 + 0.001 * i, 0.05 - 0.004 * i + 0.001 * seed],
                                 "zeta": [0.0, 0.0, max(0.0, 3.0 - 0.5 * i + 0.2 * seed)]}} for seed in range(3)}
          for i, c in enumerate(run_comparison.METHODS)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", lambda fig, path, **kw: figs.update({os.path.basename(path): fig}) or
                   save(fig, path, **kw))
        mp.setattr(numbers_reproduction, "KJV", str(out))
        mp.setattr(numbers_comparison, "main_runs", lambda: by)
        numbers_reproduction.plots(*study)
        numbers_comparison.plot(str(out / "comparison.png"))
    assert sorted(figs) == ["comparison.png", "psi_profiles.png", "zeta_over_training.png"]
    return figs


def condition(label):
    """The condition a legend label names ("base ...", "out/kjv/base $\\zeta_L$", "JREG $\\alpha$ = 1: ..."), or
    None."""
    return next((c for c, text in LABELS.items() if label.startswith(text)), None) or \
        role(re.split(r" \(| \$|:", label)[0])


def test_one_palette_and_one_layout_in_every_figure(drawn, others):
    """The baseline, JREG α = 1 and α = 3 in lib/style.py's colours in every figure that draws them (their first run
    in the colour itself, further seeds or fine-tuned copies in its shades) and no other model in those; at most
    MAX_WIDTH pixels wide at DPI; legends inside or below the panels, not in a column of their own; titles of at most
    two lines; and the methods comparison reads cleanly too."""
    from matplotlib.colors import to_hex
    figs = {**drawn[0], **{f"others/{name}": fig for name, fig in others.items()}}
    hues = {c: {shade(colour, k) for k in range(5)} for c, colour in COLOURS.items()}
    taken = set().union(*hues.values())
    categories = "'final-layer jump rate': y ticks"                 # the methods' names, not numbers
    assert [p for p in plot_problems(others["comparison.png"]) if not p.startswith(categories)] == []
    seen = set()
    for name, fig in figs.items():
        fig.canvas.draw()
        assert fig.get_figwidth() * DPI <= MAX_WIDTH and fig.get_figheight() * DPI <= 1100, name
        lines = [(line.get_label(), to_hex(line.get_color())) for ax in fig.axes for line in ax.get_lines()]
        lines += [(t.get_text(), to_hex(h.get_color())) for leg in fig.legends + [ax.get_legend() for ax in fig.axes]
                  if leg for t, h in zip(leg.get_texts(), leg.legend_handles) if hasattr(h, "get_color")]
        first = {}
        for label, colour in lines:
            c = None if label.startswith("_") else condition(label)
            if c:
                assert colour in hues[c], (name, label, colour)
                first.setdefault(c, set()).add(colour)
            elif not label.startswith("_"):
                assert colour not in taken, (name, label, colour)
        assert all(COLOURS[c] in colours for c, colours in first.items()), (name, first)
        seen |= {(name, c) for c in first}
        panels = [ax.get_tightbbox() for ax in fig.axes]
        left, right = min(b.x0 for b in panels), max(b.x1 for b in panels)
        for leg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
            box = leg.get_window_extent()
            assert left - 2 <= box.x0 and box.x1 <= right + 2, (name, "a legend beside the panels")
        assert all(ax.get_title().count("\n") <= 1 for ax in fig.axes), name
    for name, c in (("kjv/layer_analysis.png", "jreg_a3"), ("retrofit/psi_profiles.png", "base"),
                    ("retrofit/psi_profiles.png", "jreg_a1"), ("layers/survey/zeta_over_checkpoints.png", "base"),
                    ("others/comparison.png", "base"), ("others/comparison.png", "jreg_a1"),
                    ("others/psi_profiles.png", "jreg_a3"), ("sft_kjv/chat/layer_analysis.png", "jreg_a1")):
        assert (name, c) in seen, (name, c)                         # the check above saw them
    # seeds of one condition: another shade, another marker and another line style, not the line style alone
    styles = {line.get_label(): (to_hex(line.get_color()), line.get_marker(), line.get_linestyle())
              for line in figs["kjv/layer_analysis.png"].axes[0].get_lines()}
    for run in ("base", "jreg_a1"):
        assert all(a != b for a, b in zip(styles[run], styles[f"{run}_seed1"])), styles


def test_every_committed_figure_is_shown_by_a_document_at_its_drawn_size(drawn, others):
    """Each committed PNG is an image of README.md or docs/*.md (and each image there is committed), and its pixel size
    is the size its drawing code gives it now (a restyle that was not redrawn fails here)."""
    from PIL import Image
    committed = set(subprocess.run(["git", "ls-files", "*.png"], capture_output=True, text=True, cwd=ROOT,
                                   check=True).stdout.split())
    shown = set()
    for doc in ["README.md"] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        here = os.path.dirname(os.path.join(ROOT, doc))
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", open(os.path.join(ROOT, doc)).read()):
            shown.add(os.path.relpath(os.path.normpath(os.path.join(here, target)), ROOT))
    assert sorted(committed - shown) == [] and sorted(shown - committed) == []
    sizes = {f"results/{name}": fig for name, fig in drawn[0].items()}
    sizes |= {f"results/kjv/{name}": others[name] for name in ("psi_profiles.png", "zeta_over_training.png")}
    for path, fig in sizes.items():
        want = np.round([fig.get_figwidth() * DPI, fig.get_figheight() * DPI])
        assert np.abs(np.subtract(Image.open(os.path.join(ROOT, path)).size, want)).max() <= 2, path
