"""
Progress of long work, for a terminal and a log alike. On a terminal it is tqdm's bar. Anywhere else (a log file, a
pipe, a Slurm output) tqdm either hides its bar (disable=None) or redraws it with carriage returns into one endless
line, so there it is a plain line every EVERY_S seconds, from a timer (a single slow item, a 4-minute judge request,
still gets its lines), and a last line with the total time when the work took that long. Under torchrun only rank 0
speaks.

    for batch in progress(batches, "profile"):            # any iterable; total = len() where it has one
        ...
    with Progress(total=61, desc="layer analysis") as bar:
        ...; bar.update()
    with timed("loading SmolLM2"):                       # one line before, one after with the time
        ...
"""
import os
import sys
import threading
import time
from contextlib import contextmanager

EVERY_S = 30.0       # seconds between plain lines; 0: a line per item


def duration(seconds):
    """12 s, 2 min 19 s, 1 h 2 min."""
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s" if s < 3600 else f"{s // 3600} h {s % 3600 // 60} min"


def _quiet():
    return int(os.environ.get("RANK", 0)) != 0          # another torchrun process: rank 0 reports for all


class Progress:
    """A bar on a terminal, plain lines elsewhere (`file`, default stderr). total None: a count without a percentage.
    every: seconds between plain lines (default EVERY_S; 0: a line per update). leave=False: a terminal's bar goes
    away when done (a bar nested in another)."""

    def __init__(self, total=None, desc="", unit="it", enabled=True, leave=True, file=None, every=None):
        self.total, self.desc, self.n = total, desc, 0
        self.file = file or sys.stderr
        self.every = EVERY_S if every is None else every
        self.enabled = enabled and not _quiet()
        self.bar, self.timer, self.lines = None, None, 0
        self.start = time.perf_counter()
        self.lock = threading.Lock()
        if not self.enabled:
            return
        if self.file.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, unit=unit, leave=leave, file=self.file, dynamic_ncols=True)
        elif self.every > 0:
            self.stop = threading.Event()
            self.timer = threading.Thread(target=self._beat, daemon=True)
            self.timer.start()

    def _beat(self):
        while not self.stop.wait(self.every):
            self._line()

    def _line(self):
        elapsed = time.perf_counter() - self.start
        with self.lock:
            n = self.n
            where = f"{n}/{self.total} ({100 * n / self.total:.0f}%)" if self.total else f"{n}"
            left = f", about {duration(elapsed / n * (self.total - n))} left" if self.total and n else ""
            print(f"{self.desc}: {where}, {duration(elapsed)} elapsed{left}", file=self.file, flush=True)
            self.lines += 1

    def update(self, n=1):
        if not self.enabled:
            return
        if self.bar is not None:
            return self.bar.update(n)
        with self.lock:
            self.n += n
        if self.every <= 0:
            self._line()

    def close(self):
        """The last plain line, with the total time, where the work was long enough to have had a line."""
        if not self.enabled:
            return
        if self.bar is not None:
            return self.bar.close()
        if self.timer is not None:
            self.stop.set()
            self.timer.join()
        if self.lines:
            where = f"{self.n}/{self.total}" if self.total else f"{self.n}"
            print(f"{self.desc}: {where} done in {duration(time.perf_counter() - self.start)}", file=self.file,
                  flush=True)
        self.enabled = False                             # closed once, however often it is called

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def progress(iterable, desc, total=None, **kwargs):
    """The items of `iterable` with a Progress over them (total: len(iterable) where it has one)."""
    total = len(iterable) if total is None and hasattr(iterable, "__len__") else total
    with Progress(total=total, desc=desc, **kwargs) as bar:
        for item in iterable:
            yield item
            bar.update()


@contextmanager
def timed(what, file=None):
    """`what ...` before the work and `what: done in T` after it, on a terminal and in a log alike (a failure prints
    its own error line instead)."""
    if _quiet():
        yield
        return
    file = file or sys.stderr
    print(f"{what} ...", file=file, flush=True)
    start = time.perf_counter()
    yield
    print(f"{what}: done in {duration(time.perf_counter() - start)}", file=file, flush=True)
