"""
Files written whole and folders held by one process: what the run folder, the data preparation and the commands share.

    write_atomic(path, data)                      # path.tmp, fsync, rename: never a torn file; a full disk is one line
    f = lock_file(path, refusal)                  # this process's exclusive lock on path; release_lock(f)
    one_line(e)                                   # an exception as one line of an error message
"""
import errno
import fcntl
import os
import shutil
import socket
import time
from contextlib import suppress


def write_atomic(path, data):
    """Write ``data`` (str, bytes or a list of bytes-like parts) to path.tmp, fsync, rename: never a torn file. A write
    that fails (a full disk) is one error line with the free space; path.tmp is removed and path left as it was."""
    try:
        with open(f"{path}.tmp", "wb") as f:
            for part in data if isinstance(data, list) else [data]:
                f.write(part.encode() if isinstance(part, str) else part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(f"{path}.tmp", path)
    except OSError as e:
        with suppress(OSError):
            os.remove(f"{path}.tmp")
        folder = os.path.dirname(os.path.abspath(path))
        free = shutil.disk_usage(folder).free / 2**30 if os.path.isdir(folder) else 0.0
        raise SystemExit(f"error: cannot write {path}: {e.strerror or e}; {free:.1f} GiB free in {folder}; "
                         f"{path} is as it was") from None


def lock_file(path, refusal):
    """An exclusive lock on `path` for the life of this process (the kernel drops it when the process dies, so a killed
    process never blocks its own rerun), or until release_lock. A second process is refused: `error: {refusal}`, its
    "{holder}" replaced by the holder's pid, host and start time."""
    while True:
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):     # no flock here: Lustre -o noflock, some NFS
                f.close()
                raise SystemExit(f"error: cannot lock {path}: {e.strerror or e} (errno {e.errno}): its file system "
                                 "does not support flock (Lustre mounted without flock, some NFS): put the folder on "
                                 "one that does (local disk, or Lustre mounted with -o flock)") from None
            f.seek(0)
            raise SystemExit("error: " + refusal.replace("{holder}", f.read().strip() or "unknown")) from None
        try:
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()         # the holder released and removed the file between our open and flock: lock the new one
    f.truncate(0)
    f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    return f


def release_lock(f):
    """Remove the lock file of lock_file, then let the lock go: a clean end leaves no lock file. Removed while still
    held, so a process that opened the old file meanwhile finds it gone and locks a new one (lock_file)."""
    with suppress(FileNotFoundError):
        os.remove(f.name)
    f.close()


def one_line(e, limit=240):
    """An exception as one line: its type and its message with the line breaks folded, cut at `limit` characters."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit] + '…' if len(text) > limit else text}"
