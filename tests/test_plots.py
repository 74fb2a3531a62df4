"""results/plots.py redraws every committed figure from the committed JSON with lib/profiles.py's plotting code: each
expected PNG is written (here into a temporary folder, results/ untouched) and reads cleanly by test_evaluate's
plot_problems (no title or label under the legend, no legend over a panel, no two lines alike, readable ticks), and
the defects the figures once had stay fixed. CPU, offline, about half a minute."""
import glob
import importlib.util
import os

import numpy as np
import pytest

from test_evaluate import plot_problems                  # tests/ is on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PSI, LENS, ZETA, EXIT = "psi_profiles.png", "layer_analysis.png", "zeta_over_checkpoints.png", "early_exit.png"
EXPECTED = {"kjv": [LENS], "kjv/600_steps": [PSI], "smollm2": [PSI, LENS], "layers/smollm2": [PSI, LENS, EXIT], "layers/kjv": [PSI, LENS, EXIT],
            "layers/survey": [PSI, ZETA], "retrofit": [PSI, LENS, ZETA, EXIT], "sft_kjv/kjv": [PSI, LENS],
            "sft_kjv/chat": [PSI, LENS]}
ELSEWHERE = {"kjv/psi_profiles.png", "kjv/zeta_over_training.png",   # results/collect.py's, from the seed runs
             "kjv/zeta_over_checkpoints.png",                        # evaluate.py --all_ckpts of one 600-step run
             "methods/methods.png"}                                  # results/collect.py's, numbers_methods.plot()


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
    assert len(kjv) == 3 and "minus base's" in kjv[1].get_title() and all("(nats)" in ax.get_ylabel() for ax in kjv)
    # retrofit: the last layers in a panel of their own, the four models on layer 30's tick, each its own marker size
    psi = figs["retrofit/psi_profiles.png"].axes
    last = [ax for ax in psi if "layers 25–30" in ax.get_title()]
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
    assert figs["smollm2/psi_profiles.png"].axes[0].get_title() == "SmolLM2-135M-Instruct.Q4_1.gguf\n(30 layers)"
    assert np.isfinite([ax.get_ylim() for fig in figs.values() for ax in fig.axes]).all()



def test_older_results_get_the_majority_rate_of_their_documents(drawn):
    """Results made before evaluate.py recorded majority rates take them from results/task_rates_N.json, N their
    documents per task (the retrofit's: 50), and the early-exit plots draw them beside chance."""
    figs, _ = drawn
    for name in ("retrofit/early_exit.png", "layers/kjv/early_exit.png", "layers/smollm2/early_exit.png"):
        labels = [t.get_text() for ax in figs[name].axes for legend in [ax.get_legend()] + figs[name].legends
                  if legend for t in legend.get_texts()]
        assert any(label.startswith("majority class, acc (") for label in labels), (name, labels)
