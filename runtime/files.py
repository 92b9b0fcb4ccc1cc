"""Files written whole or not at all, and outputs checked before the work that makes them.

Every artifact (card, checkpoint, dataset, graph, report) is written with `write_atomic`. A
command checks its outputs with `check_writable` and `refuse_overwrite` before it starts, so an
unwritable path or earlier work in the way stops it in one line, not after an hour.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from runtime.user_errors import UserError

logger = logging.getLogger(__name__)

CARD_FILE = "model.json"
"""An exported policy's model card, beside its graph (docs/ARTIFACT.md)."""
ONNX_FILE = "model.onnx"
"""An exported policy's graph. Both names live here, in a module without pydantic or
onnxruntime, so that command-line parsers can name them and still answer `--help` fast."""
COST_CRITIC_FILE = "cost_critic.onnx"
"""An exported policy's optional cost critic, the budget guard's shield (`runtime.cost_critic`)."""
STAGING_SINCE = time.time()
"""When this process loaded this module: a staging folder older than that, and locked by no
one, is a killed writer's (`clear_stale_staging`)."""


def read_regular(path: str | Path, limit: int | None = None) -> bytes:
    """The bytes of `path`, which must be a regular file (through symlinks) of at most `limit`
    bytes; raises `OSError` otherwise. A FIFO would block the reader for good and a device
    (`/dev/zero`) never end, so neither is read: a model folder is written by others."""
    with open(path, "rb", opener=_open_nonblocking) as file:  # a FIFO opens without a writer
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if limit is None:
            return file.read()
        data = file.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return data


def check_regular(path: str | Path) -> None:
    """Raise `OSError` unless `path` is a regular file (through symlinks): for readers that
    open it themselves (onnxruntime), which a FIFO or a device would block or never let go."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))


def _open_nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK)


def write_atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Run `write(temporary)` beside `path`, then rename it over `path`.

    A crash or an error leaves the old file (or none), never a half-written one; the temporary
    file is removed when writing failed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


@contextlib.contextmanager
def staged_files(folder: str | Path) -> Iterator[Path]:
    """Yield an empty staging folder beside `folder`; when the block succeeds, move every file
    written there into `folder` (one rename each, in name order), else drop them all.

    For outputs of several files (a model's graph and card): a failure while writing leaves the
    old files, never a mix of old and half-written new ones. Other files in `folder` stay. The
    staging folder is locked (`flock`) until it is gone, so that the staging folders of writers
    killed outright (`kill -9`), which nothing else removes, go as the next one of `folder`
    begins (`clear_stale_staging`).
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    clear_stale_staging(folder)
    # Two levels down, so that a model repository scanning `*/model.json` never sees it.
    root = Path(tempfile.mkdtemp(prefix=f".{folder.name}.staged-", dir=folder.parent))
    staging = root / folder.name
    staging.mkdir()
    descriptor = os.open(root, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # a file system without locks: never cleared
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield staging
        folder.mkdir(exist_ok=True)
        for path in sorted(staging.iterdir()):
            os.replace(path, folder / path.name)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        os.close(descriptor)  # releases the lock, once the folder is gone


def clear_stale_staging(folder: Path) -> list[Path]:
    """Remove the staging folders (`.<name>.staged-*` beside `folder`) that earlier writers of
    `folder` left when killed: made before this process loaded this module and locked by no
    live writer. Returns them."""
    pattern = f".{glob.escape(folder.name)}.staged-*"
    cleared = []
    for root in sorted(folder.parent.glob(pattern)):
        if _stale(root):
            shutil.rmtree(root, ignore_errors=True)
            logger.info("removed %s, left by a writer that was killed", root)
            cleared.append(root)
    return cleared


def _stale(folder: Path) -> bool:
    """Whether `folder` was made before this process loaded this module and no process holds
    its lock (False where that cannot be told, or it is gone already)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        if os.fstat(descriptor).st_mtime >= STAGING_SINCE:
            return False  # perhaps a writer that has not locked it yet
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:  # BlockingIOError: a live writer holds it
        return False
    finally:
        os.close(descriptor)


def _nearest_existing(path: Path) -> Path:
    """`path` itself or its closest ancestor that exists."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path.cwd()


def check_writable(
    path: str | Path, *, folder: bool = False, create_folders: bool = True, option: str = ""
) -> None:
    """Raise `UserError` unless `path` (a file, or a folder when `folder`) can be written.

    Missing folders count as writable when `create_folders` and their closest existing ancestor
    is a folder this process can create files in (probed with a nameless temporary file, so a
    read-only filesystem is caught even for root). `option` (e.g. "--out") prefixes the message.
    """
    path = Path(path)
    where = f"{option} {path}" if option else str(path)
    if path.exists() and folder != path.is_dir():
        found, expected = ("a file", "folder") if folder else ("a folder", "file")
        raise UserError(f"{where}: is {found}, expected a {expected}")
    target = path if folder else path.parent
    existing = _nearest_existing(target)
    if existing != target and not create_folders:
        raise UserError(f"{where}: folder {target} does not exist")
    if not existing.is_dir():
        raise UserError(f"{where}: {existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise UserError(f"{where}: cannot write in {existing} ({error.strerror})") from None


def refuse_overwrite(paths: Iterable[str | Path], force: bool, hint: str = "") -> None:
    """Raise `UserError` naming the first of `paths` that exists, unless `force`."""
    if force:
        return
    for path in map(Path, paths):
        if path.exists():
            advice = hint or "write elsewhere, or pass --force to replace it"
            raise UserError(f"{path} exists already: {advice}")


def same_file(first: str | Path, second: str | Path) -> bool:
    """Whether two paths name one file (through links and `..`); False when one is missing."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return Path(first).resolve() == Path(second).resolve()
