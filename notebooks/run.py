"""
Execute notebooks/tour.ipynb top to bottom and write it back with its outputs (what a code host shows):

    python notebooks/run.py                       # after bash quickstart.sh; in place
    python notebooks/run.py --out OTHER.ipynb     # the executed copy elsewhere, the committed notebook untouched

The kernel is this Python's (ipykernel, pinned in requirements-dev.txt), started in the repository. A cell that raises
stops the run with that cell's error (nbclient's CellExecutionError) and nothing is written.
"""
import argparse
import os
import sys
import time

try:
    import nbformat
    from nbclient import NotebookClient
except ImportError:
    sys.exit("error: executing the notebook needs nbclient, nbformat and ipykernel: pip install nbclient==0.11.0 "
             "nbformat==5.11.1 ipykernel==7.4.0 (requirements-dev.txt)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "tour.ipynb")


def execute(path=NOTEBOOK, out=None, timeout=600):
    """Run every cell of the notebook at `path` in a fresh kernel, cwd the repository, and write it with its outputs
    to `out` (default: in place); returns the executed notebook."""
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": ROOT}}).execute()
    nbformat.write(nb, out or path)
    return nb


def main(argv=None):
    p = argparse.ArgumentParser(description="Execute notebooks/tour.ipynb and write it with its outputs.")
    p.add_argument("--out", help="write the executed notebook here instead of in place")
    args = p.parse_args(argv)
    t0 = time.time()
    execute(out=args.out)
    print(f"{os.path.relpath(args.out or NOTEBOOK)}: executed in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
