"""The methods comparison's runner and tables (results/methods/run_comparison.py, numbers_comparison.py) on synthetic
runs: the held-out sweep picks each lr and goes beyond an edge, a seed half done on another arithmetic is run again
whole, and the tables pair by seed, test ζ_L by the exact sign flip, correct by Holm within a column and say what
the seeds can detect."""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(HERE, "results", "methods"))
sys.path.insert(0, os.path.join(HERE, "results"))
import numbers_comparison as NC  # noqa: E402
import run_comparison as RC  # noqa: E402


def fake(condition, lr, seed, loss, zeta=1.0, arithmetic="a", psi=(0.1, 0.2, 0.3)):
    profile = {"loss": loss, "zeta": [0.0, zeta], "psi": list(psi), "skip_block_loss_increase": [0.1, 0.5],
               "logit_lens_loss": [5.0, 4.0, 3.0, 2.5, 2.0, 1.5], "n_tokens": 32768, "analysis_tokens": 4096}
    return {"run": RC.name(condition, lr, seed), "condition": condition, "lr": lr, "seed": seed,
            "machine": {"arithmetic": arithmetic, "cpu": "x", "commit": "c"},
            "evals": [{"val_loss": loss}], "profile": profile}


def write(tmp_path, part, runs):
    os.makedirs(tmp_path / part, exist_ok=True)
    for r in runs:
        json.dump(r, open(tmp_path / part / f"{r['run']}.json", "w"))


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setattr(RC, "HERE", str(tmp_path))
    monkeypatch.setattr(RC, "SWEPT", ["base", "lns"])
    monkeypatch.setattr(RC, "METHODS", ["base", "lns"])
    monkeypatch.setattr(RC, "OPTIMIZER", [])
    monkeypatch.setattr(RC, "CONDITIONS", {"base": "configs/kjv.py", "lns": "configs/kjv_lns.py",
                                           "lns_depth_init": "configs/kjv_lns_depth_init.py"})
    return tmp_path


def test_the_sweep_picks_on_the_held_out_seeds_and_goes_beyond_an_edge(folder):
    lrs = RC.SWEEP_LRS
    runs = [fake("base", lr, s, loss) for s in RC.SWEEP_SEEDS for lr, loss in zip(lrs, (1.6, 1.5, 1.55))]
    runs += [fake("lns", lr, s, loss) for s in RC.SWEEP_SEEDS for lr, loss in zip(lrs, (1.7, 1.6, 1.5))]
    write(folder, "sweep", runs)
    sweep = RC.load("sweep")
    assert RC.picks(sweep) == {"base": (lrs[1], True), "lns": (lrs[2], False)}      # LNS's best: the highest
    grid = RC.sweep_grid(sweep)
    assert {g for g in grid if g[1] not in lrs} == {("lns", lrs[2] * 2, s, ()) for s in RC.SWEEP_SEEDS}
    write(folder, "sweep", [fake("lns", lrs[2] * 2, RC.SWEEP_SEEDS[0], 1.45)])      # half run: not yet a pick
    assert RC.picks(RC.load("sweep"))["lns"] == (lrs[2], False)
    write(folder, "sweep", [fake("lns", lrs[2] * 2, RC.SWEEP_SEEDS[1], 1.52)])      # mean 1.485: the new best, an edge
    assert RC.picks(RC.load("sweep"))["lns"] == (lrs[2] * 2, False)
    assert ("lns", lrs[2] * 4, RC.SWEEP_SEEDS[0], ()) in RC.sweep_grid(RC.load("sweep"))
    write(folder, "sweep", [fake("lns", lrs[2] * 4, s, 1.6) for s in RC.SWEEP_SEEDS])
    assert RC.picks(RC.load("sweep"))["lns"] == (lrs[2] * 2, True)                  # inside now: done
    assert "**1.4850**" in NC.sweep() and "| LayerNorm Scaling |" in NC.sweep()


def test_a_seed_half_done_on_another_arithmetic_is_run_again_whole(folder):
    """A table's block is a seed (its runs are paired); the sweep's a condition (a pick compares its lrs)."""
    grid = [(c, 3e-3, s, ()) for s in (1, 2, 3) for c in ("base", "lns")]
    other = dict(arithmetic="other")
    write(folder, "table", [fake("base", 3e-3, 1, 1.5, **other), fake("lns", 3e-3, 1, 1.5, **other),
                            fake("base", 3e-3, 2, 1.5, **other), fake("base", 3e-3, 3, 1.5)])
    pending = RC.todo(grid, "table", {"arithmetic": "a"})
    assert pending == [("base", 3e-3, 2, ()), ("lns", 3e-3, 2, ()), ("lns", 3e-3, 3, ())]   # seed 1: done, kept
    by_condition = RC.todo(grid, "table", {"arithmetic": "a"}, lambda run: run[0])
    assert by_condition == [g for g in grid if g[0] == "lns"]          # base's three are done; LNS's: mixed, all again


def test_the_table_pairs_by_seed_tests_zeta_by_sign_flip_and_corrects_within_a_column(folder, monkeypatch):
    seeds = list(range(10))
    monkeypatch.setattr(RC, "SHARED_SEEDS", seeds)
    runs = [fake("base", 3e-3, s, 1.5 + 0.01 * s, zeta=3.0 + s % 3) for s in seeds]
    runs += [fake("lns", 3e-3, s, 1.55 + 0.01 * s + 0.001 * (s % 2), zeta=0.0) for s in seeds]      # ζ_L: 0 everywhere
    runs += [fake("lns_depth_init", 3e-3, s, 1.5 + 0.01 * s + 0.002 * (s % 3 - 1),
                  arithmetic="other" if s == 9 else "a") for s in seeds]
    write(folder, "table", runs)
    text = NC.shared()
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    # ζ_L: every one of the 10 differences negative: the sign flip's p is 2 / 2^10 exactly
    assert "p=0.002*" in rows["LayerNorm Scaling"].split(" | ")[4]
    assert rows["LNS, depth-scaled init"].split(" | ")[2] == "9"                 # seed 9: another arithmetic, left out
    assert "Seeds left out for a differing arithmetic: 9." in text
    assert "the family is one metric's 2 comparisons" in text and "80% power at 9 seeds" in text
    assert ("on the first 32,768 validation tokens, the loss increase when block L is skipped and the logit lens on "
            "its first 4,096") in text
    assert "+0.0505 [" in rows["LayerNorm Scaling"]                              # val loss: +0.05 + 0.0005 on average


def test_the_finding_names_a_cost_or_gain_only_where_it_survives_holm(folder, monkeypatch):
    """Three methods at the study's lr against the baseline over 10 seeds: one costs 0.05 in every seed (survives),
    one gains by noise around 0 (p > 0.05: no difference detected), one ends at ζ_L = 0 in every seed."""
    seeds = list(range(10))
    monkeypatch.setattr(RC, "SEEDS", seeds)
    monkeypatch.setattr(RC, "SWEPT", ["base", "lns", "mixln", "jreg_a1"])
    monkeypatch.setattr(RC, "METHODS", RC.SWEPT)
    monkeypatch.setattr(RC, "CONDITIONS", {c: f"configs/{c}.py" for c in RC.SWEPT})
    lrs = RC.SWEEP_LRS
    write(folder, "sweep", [fake(c, lr, s, loss) for s in RC.SWEEP_SEEDS for c in RC.SWEPT
                            for lr, loss in zip(lrs, (1.6, 1.5, 1.55))])                    # every pick: 3e-3
    noise = [0.004, -0.006, 0.002, -0.003, 0.001, -0.004, 0.003, -0.002, 0.005, -0.003]
    write(folder, "table", [fake("base", 3e-3, s, 1.5 + 0.01 * s, zeta=3.0) for s in seeds]
          + [fake("lns", 3e-3, s, 1.55 + 0.01 * s + 0.001 * (s % 3)) for s in seeds]
          + [fake("mixln", 3e-3, s, 1.5 + 0.01 * s + noise[s]) for s in seeds]
          + [fake("jreg_a1", 3e-3, s, 1.5 + 0.01 * s + noise[::-1][s], zeta=0.0) for s in seeds])
    text = NC.finding()
    assert text.startswith("Over 10 seeds") and "JREG α = 1 ends with ζ_L = 0.00 in every seed" in text
    assert "for JREG α = 1 after Holm" not in text
    assert "is below the baseline's after Holm's correction (the exact sign-flip test) for LayerNorm Scaling, " \
           "Mix-LN, JREG α = 1. In" in text
    assert "LayerNorm Scaling costs more than the baseline after the correction (LayerNorm Scaling +0.0509" in text
    assert "none gain, and no difference is detected for Mix-LN -0.0003 [" in text
    short = NC.finding(short=True)
    assert "LayerNorm Scaling costs more than the baseline after the correction, none gain, and no difference is " \
           "detected for Mix-LN, JREG α = 1." in short and "[" not in short
    from matplotlib.figure import Figure
    from test_evaluate import plot_problems
    drawn, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: drawn.append(fig) or save(fig, path, **kw))
    assert NC.figure().endswith("(../results/methods/comparison.png)") and NC.plot(str(folder / "c.png"))
    assert [p for p in plot_problems(drawn[0]) if not p.startswith("'final-layer jump rate': y ticks")] == []
    assert [t.get_text() for t in drawn[0].axes[1].get_yticklabels()] == [
        "baseline", r"JREG $\alpha$ = 1", "LayerNorm Scaling", "Mix-LN"]
    assert "95% bootstrap interval" in drawn[0].axes[1].get_xlabel()
    os.remove(folder / "table" / f"{RC.name('mixln', 3e-3, 9)}.json")             # a run short: not drawn yet
    assert NC.plot() is None and NC.figure().startswith("Not drawn yet")


def test_the_deep_check_runs_the_two_methods_whose_zeta_is_nearest_jregs(folder, monkeypatch):
    monkeypatch.setattr(RC, "METHODS", ["base", "jreg_a1", "lns", "mixln", "periln", "jreg_lns"])
    lrs = {c: 3e-3 for c in RC.METHODS}
    zetas = {"base": 3.0, "jreg_a1": 0.0, "lns": 0.5, "mixln": 2.9, "periln": 0.2, "jreg_lns": 0.0}
    write(folder, "table", [fake(c, 3e-3, s, 1.5, zeta=z) for c, z in zetas.items() for s in RC.SEEDS])
    assert RC.nearest(RC.load("table"), lrs) == ["periln", "lns"]


def test_the_deep_check_says_whether_the_jump_grows_and_each_difference_keeps_its_sign(folder, monkeypatch):
    """8 layers (the main table's runs) against 16 (deep): the baseline's ζ_L 3 → 5 in each of 5 seeds (sign flip p =
    2/2^5), its Ψ_L over the middle layers' mean Ψ 3 → 5 or 5.1 (0.06 over five 0.02; 0.05 or 0.051 over thirteen
    0.01); JREG's ζ_L difference stays negative, LNS's val-loss difference turns from + to −."""
    monkeypatch.setattr(RC, "SWEPT", ["base", "jreg_a1", "lns"])
    monkeypatch.setattr(RC, "METHODS", RC.SWEPT)
    monkeypatch.setattr(RC, "CONDITIONS", {c: f"configs/{c}.py" for c in RC.SWEPT})
    write(folder, "sweep", [fake(c, lr, s, loss) for s in RC.SWEEP_SEEDS for c in RC.SWEPT
                            for lr, loss in zip(RC.SWEEP_LRS, (1.6, 1.5, 1.55))])
    eight = {"base": (1.5, 3.0), "jreg_a1": (1.505, 0.0), "lns": (1.52, 1.0)}
    sixteen = {"base": (1.4, 5.0), "jreg_a1": (1.41, 0.0), "lns": (1.38, 6.0)}
    psi = {"table": lambda s: [0.3] + [0.02] * 6 + [0.06],
           "deep": lambda s: [0.3] + [0.01] * 14 + [0.05 + 0.001 * (s % 2)]}
    for part, values in (("table", eight), ("deep", sixteen)):
        write(folder, part, [fake(c, 3e-3, s, loss + 0.001 * (s % 2), zeta=z, psi=psi[part](s))
                             for c, (loss, z) in values.items() for s in RC.DEEP_SEEDS])
    text = NC.deep()
    assert ("The baseline's ζ_L is 3.00 at 8 layers and 5.00 at 16 over the same 5 seeds (16 − 8 layers: +2.00 "
            "[+2.00, +2.00], p=0.062, the exact sign-flip test, whose smallest p at 5 seeds is 0.0625).") in text
    rise = [2.0 + 0.1 * (s % 2) for s in RC.DEEP_SEEDS]        # the seeds 1337, 1 and 3 odd: 2.06 on average
    assert (f"Yet Ψ_L over the mean Ψ of layers 3..L−1 is 3.00 at 8 layers and 5.06 at 16 "
            f"({NC.interval(NC.S.t_interval(rise), 2)}, p<0.001, paired t;") in text and "+2.06 [" in text
    assert "At 16 layers ζ_L is below the baseline's in every seed for JREG α = 1. Against" in text   # LNS: above
    assert ("Against the baseline, 8 → 16 layers (mean differences over the seeds each has; a sign says something only "
            "where the tables mark the difference *): the sign is kept by JREG α = 1's ζ_L -3.00 → -5.00; JREG α = "
            "1's val loss +0.0050 → +0.0100, and changes for LayerNorm Scaling's ζ_L -2.00 → +1.00; LayerNorm "
            "Scaling's val loss +0.0200 → -0.0200.") in text


def test_a_table_with_one_seed_in_shows_its_differences_and_what_is_still_to_run(folder, monkeypatch):
    """While the 16-layer check has one seed in: each cell is that seed's difference (no test, no power line yet),
    and the note counts the runs still to go."""
    monkeypatch.setattr(RC, "SWEPT", ["base", "jreg_a1"])
    monkeypatch.setattr(RC, "METHODS", RC.SWEPT)
    monkeypatch.setattr(RC, "CONDITIONS", {c: f"configs/{c}.py" for c in RC.SWEPT})
    write(folder, "sweep", [fake(c, lr, s, loss) for s in RC.SWEEP_SEEDS for c in RC.SWEPT
                            for lr, loss in zip(RC.SWEEP_LRS, (1.6, 1.5, 1.55))])
    write(folder, "deep", [fake("base", 3e-3, 1337, 1.5, zeta=2.0), fake("jreg_a1", 3e-3, 1337, 1.49, zeta=0.0)])
    text = NC.deep()
    assert "| JREG α = 1 | 3e-3 | 1 | -0.0100 (one seed) | -2.00 (one seed) |" in text
    assert "80% power" not in text and "Not yet run: 8 runs." in text


def test_the_study_says_its_cpu_time_and_the_second_table_its_finding(folder, monkeypatch):
    monkeypatch.setattr(RC, "SEEDS", list(range(4)))
    monkeypatch.setattr(RC, "SHARED_SEEDS", list(range(4)))
    write(folder, "sweep", [dict(fake(c, lr, s, loss), wall_seconds=360.0) for s in RC.SWEEP_SEEDS for c in RC.SWEPT
                            for lr, loss in zip(RC.SWEEP_LRS, (1.6, 1.5, 1.55))])
    write(folder, "table", [fake(c, 3e-3, s, 1.5 + (0.05 if c == "lns" else 0) + 0.001 * s * (c == "lns"),
                                 zeta=0.5 + 0.1 * s if c == "lns_depth_init" else 1.0)
                            for c in ("base", "lns", "lns_depth_init") for s in RC.SEEDS])
    assert NC.cost().startswith("24 runs so far, 1.2 CPU-hours") and "sweep 12 runs, 1.2 h, table 12 runs, 0.0 h" in \
        NC.cost() and NC.cost().endswith("; 12 runs without a recorded time.")
    shared = NC.finding(part="shared")
    assert shared.startswith("Over 4 seeds, every condition at the study's lr 3e-3:") and \
        "LayerNorm Scaling costs more than the baseline after the correction" in shared
    # 4 seeds: the sign-flip test's floor 2/2^4 is above Holm's 0.05/2, so ζ_L is read seed by seed, and said so
    assert ("ζ_L is below the baseline's in every seed for LNS, depth-scaled init (at 4 seeds the exact sign-flip "
            "test cannot pass Holm's correction: its smallest p, 0.1250, is above 0.05/2)") in shared
    assert ("At 4 seeds the exact sign-flip test's smallest p is 2/2^4 = 0.1250, above Holm's first step (0.05/2 = "
            "0.0250): no ζ_L cell can be marked *") in NC.shared()


def test_the_main_table_runs_each_pick_and_the_second_the_studys_lr(folder, monkeypatch):
    """table: every swept condition (Muon's too) at its own lr, seed by seed; shared: every other condition, the
    variants too, at the study's lr on the first five seeds, into the same folder (a pick at the study's lr is one run
    for both)."""
    monkeypatch.setattr(RC, "SWEPT", ["base", "lns", "muon"])
    monkeypatch.setattr(RC, "OPTIMIZER", ["muon"])
    monkeypatch.setattr(RC, "CONDITIONS", {**RC.CONDITIONS, "muon": "configs/kjv_muon.py"})
    grids = RC.grids({"base": (6e-3, True), "lns": (3e-3, True), "muon": (1.2e-2, True)})
    assert grids["table"][:4] == [("base", 6e-3, 1337, ()), ("lns", 3e-3, 1337, ()), ("muon", 1.2e-2, 1337, ()),
                                  ("base", 6e-3, 1, ())] and len(grids["table"]) == 3 * len(RC.SEEDS)
    assert grids["shared"][:3] == [("base", 3e-3, 1337, ()), ("lns", 3e-3, 1337, ()),
                                   ("lns_depth_init", 3e-3, 1337, ())]
    assert RC.SHARED_SEEDS == RC.SEEDS[:5] and len(grids["shared"]) == 3 * 5
    assert set(grids["table"]) & set(grids["shared"]) == {("lns", 3e-3, s, ()) for s in RC.SEEDS[:5]}


def test_the_optimizer_table_pairs_muon_with_adamw_and_follows_zeta_over_training(folder, monkeypatch, tmp_path):
    import numbers_optimizer as NO
    seeds = list(range(6))
    monkeypatch.setattr(RC, "SEEDS", seeds)
    monkeypatch.setattr(RC, "SWEPT", list(NO.FOUR))
    lrs = RC.SWEEP_LRS
    write(folder, "sweep", [fake(c, lr, s, loss) for s in RC.SWEEP_SEEDS for c in NO.FOUR
                            for lr, loss in zip(lrs, (1.6, 1.5, 1.55))])
    zetas = {"base": 3.0, "jreg_a1": 0.0, "muon": 1.0, "muon_jreg": 0.0}
    runs = []
    for c, z in zetas.items():
        for s in seeds:
            r = fake(c, 3e-3, s, 1.5 + 0.01 * s + (0.02 if c.startswith("muon") else 0) + 0.001 * (s % 2), zeta=z)
            r["evals"] = [{"step": step, "val_loss": 2.0, "zeta": [0.0, z * step / 300]} for step in (0, 150, 300)]
            runs.append(r)
    write(folder, "table", runs)
    table = NO.table()
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert rows["Muon − AdamW"].split(" | ")[1:3] == ["3e-3, 3e-3", "6"]
    # ζ_L: 6 of 6 lower, p = 2/2^6 = 0.031, which Holm's correction across the 4 comparisons (three at 0.031) lifts
    assert "-2.00 [-2.00, -2.00] p=0.031 |" in rows["Muon − AdamW"]
    assert "+0.0200 [" in rows["Muon − AdamW"] and "+0.0000" in rows["JREG − baseline, Muon"].split(" | ")[3]
    assert "| Muon | 0.50 | 1.00 |" in NO.over_time()                         # ζ_L at steps 150 and 300
    assert "| Muon (mean ± sd) | 3e-3 | 6 |" in table
    assert "| AdamW | 6 | 0.1000 | 0.2000 | 0.3000 |" in NO.profile()
    # ζ_L 3.00 → 1.00: lower in all 6 seeds, p = 0.031, 0.125 after Holm (3 of 4 at 0.031): not detected
    assert NO.finding().startswith(
        "Over 6 seeds, each condition at its own lr (AdamW 3e-3, AdamW + JREG 3e-3, Muon 3e-3, Muon + JREG 3e-3), "
        "the baseline's ζ_L is 3.00 ± 0.00 under AdamW and 1.00 ± 0.00 "
        "under Muon (Muon − AdamW -2.00 [-2.00, -2.00], Holm-adjusted p=0.125): no difference in ζ_L between the "
        "optimizers is detected, the largest rise of the mean Ψ_ℓ over Ψ_{ℓ−1} (ℓ ≥ 3) at layer 3 under both.")
    assert "0.00 in 6 of 6 seeds" in NO.finding() and NO.readme().endswith("ends with ζ_L = 0.00 in 6 of 6 seeds.")
    assert NO.figure().startswith("![") and "(../results/methods/optimizer.png)" in NO.figure()
    from matplotlib.figure import Figure
    from test_evaluate import plot_problems
    from lib.style import COLOURS
    drawn, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: drawn.append(fig) or save(fig, path, **kw))
    assert NO.plot(str(tmp_path / "optimizer.png")) and os.path.getsize(tmp_path / "optimizer.png") > 10_000
    assert plot_problems(drawn[0]) == []
    colours = {line.get_label().split(" (")[0]: line.get_color() for line in drawn[0].axes[0].get_lines()}
    assert colours["baseline, AdamW"] == COLOURS["base"] and colours[r"JREG $\alpha$ = 1, AdamW"] == COLOURS["jreg_a1"]
    assert {colours["Muon"], colours[r"Muon + JREG $\alpha$ = 1"]}.isdisjoint(COLOURS.values())
    runs = RC.load("table")                                        # one seed short: neither finding nor figure yet
    os.remove(folder / "table" / f"{RC.name('muon', 3e-3, 5)}.json")
    assert NO.figure() == "Not drawn yet: the runs are under way." and NO.plot() is None and len(runs) == 24
    assert NO.readme().startswith("The study of AdamW and Muon")


def test_a_list_of_names_holding_a_comma_is_split_by_semicolons():
    assert NC.listed(["jreg_a1", "lns"]) == "JREG α = 1, LayerNorm Scaling"
    assert NC.listed(["jreg_a1", "lns_depth_init", "periln"]) == "JREG α = 1; LNS, depth-scaled init; Peri-LN"
    assert NC.listed([]) == "none"
