"""
Execute notebooks/tour.ipynb top to bottom and write it back with its outputs (what a code host shows):

    python notebooks/run.py                       # after bash quickstart.sh: in place (about a minute on 2 cores)
    python notebooks/run.py --out OTHER.ipynb     # the executed copy elsewhere, the committed notebook untouched
    python notebooks/run.py --fast                # a smoke test: a slice of the text and runs of a few steps in a
                                                  # temporary folder; its numbers mean nothing, and the executed copy
                                                  # goes to a temporary folder unless --out names a file

It prints a line per code cell, with its time. The kernel is this Python's (ipykernel, pinned in requirements-dev.txt),
started in the repository. A cell that raises stops the run with that cell's error (nbclient's CellExecutionError) and
nothing is written. Ctrl-C or SIGTERM stops it too, writing nothing: nbclient shuts the kernel down, and the training
runs the kernel started end with it (notebooks/tour_runs.py says how).
"""
import argparse
import os
import sys
import tempfile
import time

try:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
except ImportError:
    sys.exit("error: executing the notebook needs nbclient, nbformat and ipykernel: pip install nbclient==0.11.0 "
             "nbformat==5.11.1 ipykernel==7.4.0 (requirements-dev.txt)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "tour.ipynb")
BANNER = ("=" * 100 + "\nFAST MODE: a smoke test. The notebook runs on a slice of the text with runs of a few steps; "
          "it checks\nthat every cell runs. Its numbers and plots are NOT meaningful results.\n" + "=" * 100)


def progress_hooks(client, nb):
    """A line per code cell on stderr: its number and first line other than an import as it starts, its time as it
    ends."""
    code = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    t0, started = time.time(), {}

    def start(cell, cell_index):
        if cell_index in code:
            lines = [line for line in cell.source.splitlines() if line.strip()]
            first = next((line for line in lines if not line.startswith(("import ", "from ", "sys.path"))), lines[0])
            print(f"cell {code.index(cell_index) + 1:2d}/{len(code)}  {first[:70]:70s} ", end="", file=sys.stderr,
                  flush=True)
            started[cell_index] = time.time()

    def executed(cell, cell_index, execute_reply):
        print(f"{time.time() - started[cell_index]:5.0f} s  ({time.time() - t0:.0f} s in all)", file=sys.stderr,
              flush=True)

    client.on_cell_start, client.on_cell_executed = start, executed


def execute(path=NOTEBOOK, out=None, timeout=600, fast=False, progress=False):
    """Run every cell of the notebook at `path` in a fresh kernel, cwd the repository (fast: in the fast mode,
    JREG_NOTEBOOK_FAST=1), and write it with its outputs to `out` (default: in place); returns the executed notebook.
    progress: a line per cell on stderr."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": ROOT}})
    if progress:
        progress_hooks(client, nb)
    client.execute(env={**os.environ, **({"JREG_NOTEBOOK_FAST": "1"} if fast else {})})
    nbformat.write(nb, out or path)
    return nb


def main(argv=None):
    p = argparse.ArgumentParser(description="Execute notebooks/tour.ipynb and write it with its outputs.")
    p.add_argument("--out", help="write the executed notebook here instead of in place")
    p.add_argument("--fast", action="store_true", help="a smoke test: tiny runs whose numbers mean nothing (written "
                   "to a temporary folder unless --out)")
    args = p.parse_args(argv)
    fast = args.fast or os.environ.get("JREG_NOTEBOOK_FAST") == "1"
    out = args.out or (os.path.join(tempfile.mkdtemp(prefix="jreg_tour_run_"), "tour.ipynb") if fast else None)
    if fast:
        print(BANNER, file=sys.stderr)
    t0 = time.time()
    try:
        execute(out=out, fast=fast, progress=True)
    except CellExecutionError:                       # a cell raised: its error
        raise
    except (KeyboardInterrupt, Exception) as e:      # Ctrl-C, SIGTERM: nbclient shuts the kernel down (DeadKernelError)
        sys.exit(f"\nstopped ({type(e).__name__}: {e}): the kernel is shut down, and the training runs it started "
                 "stop with it; nothing written")
    print(f"{os.path.relpath(out or NOTEBOOK)}: executed in {time.time() - t0:.0f} s", file=sys.stderr)
    if fast:
        print(BANNER, file=sys.stderr)


if __name__ == "__main__":
    main()
