"""
Execute notebooks/tour.ipynb top to bottom and write it back with its outputs (what a code host shows):

    python notebooks/run.py                       # after bash quickstart.sh: in place (about a minute on 2 cores)
    python notebooks/run.py --out OTHER.ipynb     # the executed copy elsewhere, the committed notebook untouched
    python notebooks/run.py --fast                # a smoke test: a slice of the text and runs of a few steps in a
                                                  # temporary folder; its numbers mean nothing, and the executed copy
                                                  # goes to a temporary folder unless --out names a file

It prints a line per code cell, with its time. The kernel is this Python's (ipykernel, pinned in requirements-dev.txt),
started in the repository. A cell that raises stops the run with that cell's error (nbclient's CellExecutionError) and
nothing is written. Ctrl-C, SIGTERM or SIGHUP (its terminal closed) stops it too, writing nothing, with one line that
names the signal: the kernel is shut down, and the training runs it started end with it (notebooks/tour_runs.py says
how); the runner waits for them to end. In the fast mode the kernel's temporary files (TMPDIR), the slice of the text
and the runs among them, are in a folder of the runner's, removed however the run ends (but SIGKILL).
"""
import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time

try:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError
    from nbclient.util import run_sync
except ImportError:
    sys.exit("error: executing the notebook needs nbclient, nbformat and ipykernel: pip install nbclient==0.11.0 "
             "nbformat==5.11.1 ipykernel==7.4.0 (requirements-dev.txt)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "tour.ipynb")
BANNER = ("=" * 100 + "\nFAST MODE: a smoke test. The notebook runs on a slice of the text with runs of a few steps; "
          "it checks\nthat every cell runs. Its numbers and plots are NOT meaningful results.\n" + "=" * 100)
SIGNALS = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)]
WAIT_S = 30                     # for the kernel's training runs to save a checkpoint and end, before SIGKILL


class Interrupted(KeyboardInterrupt):
    """The run stopped by a signal: args[0] its name (SIGINT, SIGTERM, SIGHUP)."""


def interrupt(signum, frame):   # the handler of SIGNALS while no kernel runs
    raise Interrupted(signal.Signals(signum).name)


class Client(NotebookClient):
    """nbclient's client, where a signal (SIGNALS) while the kernel runs stops the execution, which then raises
    Interrupted naming it (nbclient's own handlers shut the kernel down but let the execution fail on with an unrelated
    error: an empty AssertionError). kernel_group: the kernel's process group, which its training runs are in."""
    stopped_by = kernel_group = None

    async def async_start_new_kernel(self, **kwargs):
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        for sig in SIGNALS:                         # in place of nbclient's, set just before this
            try:
                loop.add_signal_handler(sig, self.stop, task, sig)
            except (NotImplementedError, RuntimeError):     # Windows; a thread other than the main one
                pass
        await super().async_start_new_kernel(**kwargs)
        self.kernel_group = getattr(self.km.provisioner, "pgid", None)      # its own session: the kernel's pid

    def stop(self, task, sig):
        if self.stopped_by is None:                 # a second signal does not cut the kernel's shutdown short
            self.stopped_by = signal.Signals(sig).name
            task.cancel()                           # nbclient's setup_kernel shuts the kernel down as it unwinds

    async def async_execute(self, **kwargs):
        held, loop = {sig: signal.getsignal(sig) for sig in SIGNALS}, asyncio.get_running_loop()
        try:
            return await super().async_execute(**kwargs)
        except BaseException:
            if self.stopped_by is None:
                raise
            raise Interrupted(self.stopped_by) from None
        finally:
            if self.km is not None and self.km.has_kernel:                  # stopped while the kernel started
                self.kernel_group = getattr(self.km.provisioner, "pgid", None)
                await self.km.shutdown_kernel(now=True)
            for sig in SIGNALS:                     # the handlers before it back
                loop.remove_signal_handler(sig)
                signal.signal(sig, held[sig])
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in others:                        # nbclient's pollers of a stopped cell
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)

    execute = run_sync(async_execute)


def running(group):
    """Whether a process of the process group `group` is running (a zombie, ended but not yet reaped, is not)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    if not os.path.isdir("/proc"):
        return True
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state, _, pgrp = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):                # ended meanwhile
            continue
        if int(pgrp) == group and state != "Z":
            return True
    return False


def wait_for(group, wait=WAIT_S):
    """Wait for the processes left in the kernel's process group to end (its training runs, which save a checkpoint on
    the SIGTERM its end sends them); SIGKILL them after `wait` seconds, or at once on a further signal."""
    deadline = time.time() + wait
    while group is not None and running(group):
        try:
            if time.time() > deadline:
                os.killpg(group, signal.SIGKILL)
            time.sleep(0.1)
        except ProcessLookupError:
            return
        except Interrupted:
            deadline = 0


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


def execute(path=NOTEBOOK, out=None, timeout=600, fast=False, progress=False, tmpdir=None):
    """Run every cell of the notebook at `path` in a fresh kernel, cwd the repository (fast: in the fast mode,
    JREG_NOTEBOOK_FAST=1; tmpdir: the kernel's TMPDIR), and write it with its outputs to `out` (default: in place);
    returns the executed notebook. progress: a line per cell on stderr. A signal (SIGNALS) raises Interrupted; the
    kernel's training runs have ended when it returns or raises."""
    nb = nbformat.read(path, as_version=4)
    client = Client(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                    resources={"metadata": {"path": ROOT}})
    if progress:
        progress_hooks(client, nb)
    env = {**os.environ, **({"JREG_NOTEBOOK_FAST": "1"} if fast else {}), **({"TMPDIR": tmpdir} if tmpdir else {})}
    with tempfile.TemporaryFile("w+") as log:       # the kernel's stderr: shown if it dies, not when it is stopped
        try:
            client.execute(env=env, stderr=log)
        except DeadKernelError:
            log.seek(0)
            print(log.read()[-3000:], end="", file=sys.stderr)
            raise
        finally:
            wait_for(client.kernel_group)
    nbformat.write(nb, out or path)
    return nb


def main(argv=None):
    p = argparse.ArgumentParser(description="Execute notebooks/tour.ipynb and write it with its outputs.")
    p.add_argument("--out", help="write the executed notebook here instead of in place")
    p.add_argument("--fast", action="store_true", help="a smoke test: tiny runs whose numbers mean nothing (written "
                   "to a temporary folder unless --out)")
    args = p.parse_args(argv)
    fast = args.fast or os.environ.get("JREG_NOTEBOOK_FAST") == "1"
    held = {sig: signal.getsignal(sig) for sig in SIGNALS}
    scratch, made, out, t0 = None, None, args.out, time.time()
    try:
        for sig in SIGNALS:
            signal.signal(sig, interrupt)
        if fast:
            print(BANNER, file=sys.stderr)
            scratch = tempfile.mkdtemp(prefix="jreg_tour_tmp_")      # the kernel's TMPDIR: its data and runs
            if not out:
                made = tempfile.mkdtemp(prefix="jreg_tour_run_")
                out = os.path.join(made, "tour.ipynb")
        execute(out=out, fast=fast, progress=True, tmpdir=scratch)
        made = None                                                   # written: kept
    except CellExecutionError:                       # a cell raised: its error
        raise
    except Interrupted as e:
        sys.exit(f"\ninterrupted by {e}: the kernel is shut down, and the training runs it started have stopped; "
                 "nothing written")
    except Exception as e:                           # the kernel died, ...
        sys.exit(f"\nstopped ({type(e).__name__}: {e}): the kernel is shut down, and the training runs it started "
                 "stop with it; nothing written")
    finally:
        for sig in SIGNALS:                          # not cut short by a further signal
            signal.signal(sig, signal.SIG_IGN)
        for folder in (scratch, made):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
        for sig in SIGNALS:
            signal.signal(sig, held[sig])
    print(f"{os.path.relpath(out or NOTEBOOK)}: executed in {time.time() - t0:.0f} s", file=sys.stderr)
    if fast:
        print(BANNER, file=sys.stderr)


if __name__ == "__main__":
    main()
