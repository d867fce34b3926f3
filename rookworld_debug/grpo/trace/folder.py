"""Saving a step folder whole. The step is written beside its place and swapped in by renames (POSIX renames a
folder in one step), so a reader finds the step saved there before whole, the new one whole, or no folder, never a
mix of the two, whatever stops the writer: a kill, a full disk, a file size limit, a second writer of the folder.

  1. the new step is written and fsynced in `.<name>.saving-<host>-<pid>-<random>`;
  2. the step already there (if any) is renamed aside to `.<name>.replaced-<host>-<pid>-<random>`;
  3. the new one is renamed into place, the parent fsynced, the aside folder renamed `.deleting-` and deleted.

A writer killed between 2 and 3 leaves no folder at `<name>`: its `.replaced-` folder holds the step saved there
before, whole. Leftover dot-folders are never taken for a step (hidden names, which no `step-*` pattern matches);
`leftovers` names them for the reader's error, and the next save of the folder deletes those of writers on this
host that are gone. Two writers of one folder: each save is whole and the later rename wins.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import socket
from pathlib import Path
from typing import Callable

from rookworld_debug.errors import SaveError

SAVING, REPLACED, DELETING = "saving", "replaced", "deleting"
RACED = (errno.ENOTEMPTY, errno.EEXIST)      # rename onto a folder another writer has just filled
_TRIES = 8                                   # another writer's step came in between: move it aside again
_HINTS = {
    errno.ENOSPC: "free space on that disk, or save elsewhere",
    errno.EDQUOT: "the disk quota is used up: free space, or save elsewhere",
    errno.EFBIG: "a file outgrew the file size limit (`ulimit -f`): raise it, or keep fewer weights "
                 "(StepConfig.keep_weights)",
    errno.EROFS: "the disk is mounted read-only: save elsewhere",
    errno.EACCES: "no permission to write there: save elsewhere",
}


def save_whole(path: Path, write: Callable[[Path], None], check: Callable[[Path], None] = lambda p: None) -> Path:
    """`check(path)`, then `write(folder)` into a new folder beside `path`, swapped in for whatever step `path`
    held; every OSError (and a safetensors write error) is a SaveError naming `path`, with nothing of the new step
    left."""
    path = Path(path)
    try:
        check(path)
    except OSError as err:                   # the folder could not even be looked at
        raise _save_error(path, err) from None
    _make_parent(path)
    _remove_stale(path, SAVING, DELETING)    # what writers that died left half-written: room for this step
    tmp = _side(path, SAVING)
    try:
        tmp.mkdir()
        write(tmp)
        _fsync_tree(tmp)
        _rename_in(tmp, path)
    except Exception as err:
        if not _io_error(err):
            raise
        raise _save_error(path, err) from None
    finally:
        _remove(tmp)
    _remove_stale(path, REPLACED)            # steps that dead writers moved aside are superseded now
    return path


def leftovers(path: Path) -> list:
    """The dot-folders that interrupted saves of `path` left beside it, by name."""
    path = Path(path)
    prefix = f".{path.name}."
    with contextlib.suppress(OSError):
        return sorted(p for p in path.parent.iterdir() if p.name.startswith(prefix)
                      and _tag(p.name[len(prefix):]) is not None)
    return []


def not_a_trace(path: Path, why: str) -> str:
    """Why `path` opens as no step trace, and what would: the captured steps it holds, or what a trace folder is
    (read without torch: a command names a wrong path before its imports)."""
    path = Path(path)
    steps = sorted(p.name for p in path.glob("step-*") if (p / "trace.json").is_file()) if path.is_dir() else []
    hint = (f"; it holds captured steps {steps}: open one of them, e.g. {path / steps[0]}" if steps else
            "; a trace folder holds trace.json + trace.safetensors (StepTrace.save, rookworld-debug step, or a TRL "
            "capture's step-NNNNNN folder)")
    return f"{path} is not a step trace or TRL capture: {why}{leftover_hint(path)}{hint}"


def leftover_hint(path: Path) -> str:
    """A clause for a reader that found no step at `path`: what interrupted saves left beside it."""
    prefix = f".{Path(path).name}."
    names = [p.name for p in leftovers(path)]
    if not names:
        return ""
    aside = sorted((p for p in leftovers(path) if _tag(p.name[len(prefix):])[0] == REPLACED), key=_changed)
    what = (f"{aside[-1].name} holds the step saved there before, whole: rename it to {Path(path).name} to open it"
            if aside else "unfinished writes, not steps")
    return f"; an interrupted save left {', '.join(names)} beside it ({what})"


# ------------------------------------------------------------------------------------------------ the swap
def _rename_in(tmp: Path, path: Path) -> None:
    for _ in range(_TRIES):
        aside = _move_aside(path)
        try:
            os.rename(tmp, path)
        except OSError as err:
            if err.errno in RACED:           # another save's step is in place now; ours replaces it next try
                _discard(aside, path)
                continue
            _put_back(aside, path)
            raise
        _fsync_dir(path.parent)
        _discard(aside, path)
        return
    raise OSError(errno.EBUSY, "other saves of this folder kept replacing it")


def _move_aside(path: Path):
    """The folder `path` was renamed to, or None when nothing is there (never saved, or another writer moved it)."""
    aside = _side(path, REPLACED)
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return None
    return aside


def _put_back(aside, path: Path) -> None:
    """The step moved aside goes back when the new one could not come in (if that fails, it stays aside, whole)."""
    if aside is not None:
        with contextlib.suppress(OSError):
            os.rename(aside, path)


def _side(path: Path, kind: str) -> Path:
    return path.parent / f".{path.name}.{kind}-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"


def _host() -> str:
    """This machine's name as a side folder carries it (a pid means something on its own host only)."""
    return re.sub(r"[^A-Za-z0-9.]", "", socket.gethostname())[:40] or "host"


def _tag(rest: str):
    """(kind, host, pid) of a side folder's name after `.<name>.`, or None for any other name."""
    m = re.fullmatch(r"(saving|replaced|deleting)-([A-Za-z0-9.]*)-(\d+)-[0-9a-f]{8}", rest)
    return (m[1], m[2], int(m[3])) if m else None


def _remove_stale(path: Path, *kinds: str) -> None:
    """Delete leftovers of these kinds by writers on this host whose process is gone (a live writer's are its own)."""
    for p in leftovers(path):
        k, host, pid = _tag(p.name[len(f".{path.name}."):])
        if k in kinds and host == _host() and pid != os.getpid() and not _alive(pid):
            _remove(p)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                          # another user's process: alive
        return True
    return True


def _discard(aside, path: Path) -> None:
    """A step moved aside, deleted: renamed `.deleting-` first, so a writer killed midway leaves no part of a step
    under a name that says whole."""
    if aside is not None:
        gone = _side(path, DELETING)
        with contextlib.suppress(OSError):
            os.rename(aside, gone)
            aside = gone
        _remove(aside)


def _changed(p: Path) -> float:
    with contextlib.suppress(OSError):
        return p.stat().st_ctime         # a rename sets it: the step moved aside last
    return 0.0


def _remove(folder) -> None:
    if folder is not None:
        with contextlib.suppress(OSError):   # a step in place is whole; a folder left here is named later
            shutil.rmtree(folder)


# ------------------------------------------------------------------------------- the disk, and its errors
def _make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as err:
        blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), path.parent)
        out = SaveError(f"save: {path} cannot be written: {blocking} is a file, not a folder")
        out.errno = err.errno
        raise out from None
    except OSError as err:
        raise _save_error(path, err) from None


def _fsync_tree(folder: Path) -> None:
    """Every file and folder of the new step on the disk before it is renamed in (a power cut after the
    rename finds it whole too)."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            _fsync(os.path.join(root, name), os.O_RDONLY)
        _fsync(root, os.O_RDONLY)


def _fsync(name: str, flags: int) -> None:
    fd = os.open(name, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):       # some file systems cannot fsync a folder; the rename is done
        _fsync(str(folder), os.O_RDONLY)


def _io_error(err: Exception) -> bool:
    return isinstance(err, OSError) or type(err).__name__ == "SafetensorError"


def _save_error(path: Path, err: Exception) -> SaveError:
    code = getattr(err, "errno", None)
    if code is None:                         # safetensors writes in Rust: "I/O error: ... (os error 27)"
        m = re.search(r"(?:os error |code: )(\d+)", str(err))
        code = int(m[1]) if m else None
    why = os.strerror(code) if code else (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    hint = _HINTS.get(code, "")
    out = SaveError(f"save: {path} was not written ({why}){f'; {hint}' if hint else ''}; the step saved there "
                    "before, if any, is left in place")
    out.errno = code
    return out
