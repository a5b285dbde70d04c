"""Atomic output files: a reader (or a second run) sees the old file or the new one, never half.

Every file simtrain writes (dashboards, overlays, trace JSON and CSV, schedule CSV, calibrated
profiles) goes through :func:`write_text`: the text is written to a temporary file in the same
folder, flushed to disk, then renamed over the target with :func:`os.replace`, which POSIX makes
atomic within one file system (rename(2)). If anything fails (a full disk, an interrupted run) the
temporary file is removed and the previous file is untouched. Two runs writing one path end with
one run's complete file.

:func:`check_writable` tries the same thing with an empty file before long work (calibration
measures for minutes; its results must not be lost to a read-only ``--out`` folder).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import SimtrainError


def _temp_in(folder: Path, name: str, suffix: str) -> tuple[int, str]:
    return tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=f".tmp{suffix}")


def write_text(path: Path, text: str, overwrite: bool = True, flag: str | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`write_bytes`."""
    return write_bytes(path, text.encode("utf-8"), overwrite, flag)


def _no_folder(path: Path, flag: str) -> SimtrainError | None:
    """The error for ``path`` whose folder is missing or not a folder (None when it is one):
    simtrain never creates folders (a mistyped ``/nonexist/x.html`` would be made silently)."""
    folder = path.parent
    if folder.is_dir():
        return None
    why = "is not a folder" if folder.exists() else "does not exist; create it first"
    return SimtrainError(f"{flag} = {str(path)!r}: cannot write the file: {folder} {why}")


def write_bytes(path: Path, data: bytes, overwrite: bool = True, flag: str | None = None) -> Path:
    """Write ``data`` to ``path`` atomically, in an existing folder (none is created).

    Args:
        path: the file to write.
        data: its whole content.
        overwrite: replace an existing ``path``; when False an existing file is an error (checked
            atomically with a hard link, so two runs cannot both create it).
        flag: the CLI flag naming ``path`` in messages; None lets ``OSError`` propagate (for
            callers that add their own context).

    Returns:
        ``path``.

    Raises:
        SimtrainError: (with ``flag``) the folder is missing or not writable, the disk is full, or
            ``path`` exists and ``overwrite`` is False.
        OSError: (without ``flag``) the same problems (FileNotFoundError: no such folder).
    """
    path = Path(path)
    missing = _no_folder(path, flag) if flag is not None else None
    if missing is not None:
        raise missing
    try:
        fd, tmp = _temp_in(path.parent, path.name, path.suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
            if overwrite:
                os.replace(tmp, path)
            else:
                os.link(tmp, path)  # fails with FileExistsError if another file got there first
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)
    except FileExistsError:
        if flag is None:
            raise
        raise SimtrainError(f"{flag} {path}: the file exists; pass --force to overwrite it") from None
    except OSError as exc:
        if flag is None:
            raise
        raise SimtrainError(f"{flag} = {str(path)!r}: cannot write the file ({exc.strerror or exc}); "
                            "nothing was changed") from None
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_writable(path: Path, flag: str) -> None:
    """Refuse, before any long work, an output path that :func:`write_text` could not write.

    Creates and removes an empty temporary file in ``path``'s folder: the only reliable test,
    since permissions, read-only mounts and ACLs all show up.

    Raises:
        SimtrainError: ``path`` is a folder or not a regular file, its folder is missing or a
            file, or the folder is not writable.
    """
    path = Path(path)
    if path.is_dir():
        raise SimtrainError(f"{flag} = {str(path)!r}: is a folder, expected a file name")
    if path.exists() and not path.is_file():
        raise SimtrainError(f"{flag} = {str(path)!r}: exists and is not a regular file")
    missing = _no_folder(path, flag)
    if missing is not None:
        raise missing
    folder = path.parent
    try:
        fd, tmp = _temp_in(folder, path.name, path.suffix)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise SimtrainError(f"{flag} = {str(path)!r}: cannot write the file in folder {folder} "
                            f"({exc.strerror or exc})") from None
