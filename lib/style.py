"""
One palette and one line style for every figure of the project (lib/profiles.py's, results/numbers_reproduction.py's
and results/methods/numbers_*.py's): the baseline is always blue, JREG α = 1 orange and JREG α = 3 green, in
whatever figure and under whatever run name (base, base_seed1, out/kjv/base, sft_base; jreg_a1, jreg, sft_jreg_a1);
every other model or method takes the next of OTHERS, never one of those three. Several runs of one condition (seeds,
fine-tuned copies) keep its hue and are told apart by shade, marker and line style. Figures are at most MAX_WIDTH
pixels wide at DPI, their panels in at most two columns, the legend in the grid's empty cell or below the panels.

    colour, marker, ls = line_styles(["base", "base_seed1", "jreg_a1", "source"])["base_seed1"].values()
"""
import re

import numpy as np

DPI = 120
MAX_WIDTH = 1400                # pixels at DPI: GitHub shows a figure at most ~880 px wide
PANEL = (4.6, 3.5)              # inches a panel, width and height
COLOURS = {"base": "#1f77b4", "jreg_a1": "#ff7f0e", "jreg_a3": "#2ca02c"}     # matplotlib's tab:blue, orange, green
LABELS = {"base": "baseline", "jreg_a1": r"JREG $\alpha$ = 1", "jreg_a3": r"JREG $\alpha$ = 3"}
OTHERS = ("#d62728", "#9467bd", "#e377c2", "#bcbd22", "#17becf", "#8c564b", "#7f7f7f")   # tab: red, purple, pink,
#                                                                                           olive, cyan, brown, grey
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "-.", ":")   # "--" is kept for a fine-tuning run's assistant-token profile
LEGEND_FONT = 8.5               # points: a legend below the panels, and one in the grid's empty cell
CELL_FONT = 10
_ROLES = ((re.compile(r"(sft_)?base(line)?(_seed\d+)?"), "base"),
          (re.compile(r"(sft_)?jreg(_a1)?(_off)?(_seed\d+)?"), "jreg_a1"),
          (re.compile(r"(sft_)?jreg_a3(_off)?(_seed\d+)?"), "jreg_a3"))


def role(name):
    """"base", "jreg_a1" or "jreg_a3": the condition a run's name says (its last path part, before any @STEP or
    " (assistant)"; a fine-tuned copy sft_NAME and a seed NAME_seedN are NAME's), or None for any other model."""
    name = re.sub(r"@.*$", "", name.removesuffix(" (assistant)")).rstrip("/").rsplit("/", 1)[-1].lower()
    return next((r for pattern, r in _ROLES if pattern.fullmatch(name)), None)


def shade(colour, k):
    """The k-th shade of a colour (0: itself; then darker, lighter, darker still...), as a hex string."""
    from matplotlib.colors import to_hex, to_rgb
    rgb, f = np.array(to_rgb(colour)), (0.0, -0.4, 0.35, -0.65, 0.6)[k % 5]
    return to_hex(rgb * (1 + f) if f < 0 else rgb + (1 - rgb) * f)


def line_styles(names, family=lambda name: name):
    """{name: {"color", "marker", "ls"}}: a condition's runs (role) its colour, the others a colour of OTHERS each
    (names of one family, e.g. NAME and NAME_seedN, one colour); the runs that share a colour told apart by shade,
    marker and line style, in the order given."""
    groups, styles, others = {}, {}, {}
    for name in names:
        r = role(name)
        if r is None:
            others.setdefault(family(name), OTHERS[len(others) % len(OTHERS)])
        key = r or family(name)
        k = len(groups.setdefault(key, []))
        groups[key].append(name)
        styles[name] = {"color": shade(COLOURS[r] if r else others[key], k), "marker": MARKERS[k % len(MARKERS)],
                        "ls": LINESTYLES[k % len(LINESTYLES)]}
    return styles


def grid(plt, n, width=PANEL[0], height=PANEL[1]):
    """(figure, its n panels, the grid's empty cell or None): one panel alone, else two columns, so that the figure
    stays under MAX_WIDTH pixels at DPI; constrained layout."""
    cols = 1 if n == 1 else 2
    rows = -(-n // cols)
    fig = plt.figure(layout="constrained", figsize=(width * cols + 0.3, height * rows))
    cells = fig.add_gridspec(rows, cols)
    axes = [fig.add_subplot(cells[i // cols, i % cols]) for i in range(n)]
    return fig, axes, ((rows - 1, cols - 1) if n % cols else None)


def legend(fig, handles, labels, title=None, spare=None, axes=None):
    """One legend for the figure: centred in the grid's empty cell `spare` (row, column) where there is one, else
    below the panels in as many columns (up to 3) as the figure's width holds. axes: the panels in grid order."""
    kw = dict(title=title, alignment="left", handlelength=3)
    if not handles:
        return None
    if spare is not None:
        fig.canvas.draw()                                 # constrained layout places the panels
        at = {(ax.get_subplotspec().rowspan.start, ax.get_subplotspec().colspan.start): ax
              for ax in (axes if axes is not None else fig.axes)}
        row, col = spare
        above, beside = at[row - 1, col], at[row, col - 1]   # the cell's column and row
        x0, x1 = above.get_position().x0, above.get_position().x1
        y0, y1 = beside.get_position().y0, beside.get_position().y1
        renderer, cell = fig.canvas.get_renderer(), np.array([(x1 - x0) * fig.bbox.width, (y1 - y0) * fig.bbox.height])
        for size in np.arange(CELL_FONT, 6, -0.5):       # the largest font at which it fits the cell
            leg = fig.legend(handles, labels, loc="center", bbox_to_anchor=(x0, y0, x1 - x0, y1 - y0),
                             fontsize=size, title_fontsize=size, **kw)
            box = leg.get_window_extent(renderer)
            if box.width <= cell[0] and box.height <= cell[1] or size <= 6.5:
                break
            leg.remove()
        return leg
    renderer, width = fig.canvas.get_renderer(), fig.bbox.width
    for ncol in range(min(3, len(handles)), 0, -1):
        leg = fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=LEGEND_FONT,
                         title_fontsize=LEGEND_FONT, **kw)
        if ncol == 1 or leg.get_window_extent(renderer).width <= 0.97 * width:
            break
        leg.remove()
    fig.set_figheight(fig.get_figheight() + leg.get_window_extent(renderer).height / fig.dpi + 0.05)  # the panels
    return leg                                                                                    # keep their height


def psi_per_layer(ax):
    """ax as a panel of Ψ per layer: its labels, and its y axis on a log scale ticked at 1, 2, 3 and 5 × 10^k in plain
    numbers (0.02, not 2×10^-2), since Ψ_1 (the embedding's step) is about 10× the layers' above it and would flatten
    them on a linear axis."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 3, 5)))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel=r"layer $\ell$", ylabel=r"mean $\Psi_\ell$ over seeds (log)", title=r"$\Psi_\ell$ per layer")


def save(fig, path):
    """fig written to path at DPI and closed (pyplot keeps every figure it made open until then); path."""
    import matplotlib.pyplot as plt
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def pretty(name):
    """A model's name as a legend shows it: the last part of a path, a GGUF file by its model and quantisation."""
    import os
    if os.path.isabs(name):
        name = os.path.basename(os.path.normpath(name))
    m = re.fullmatch(r"(.+)\.((?:I?Q\d|F16|BF16|F32)[\w]*)\.gguf", name, flags=re.IGNORECASE)
    return f"{m.group(1)} {m.group(2)}" if m else name.removesuffix(".gguf")
