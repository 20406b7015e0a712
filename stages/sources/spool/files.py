"""Durable file operations the spool needs: whole writes, directory fsyncs, and moving a
finished file aside without ever overwriting an earlier one."""

from __future__ import annotations

import os


def move_aside(path: str, done_dir: str, name: str) -> str:
    """Move ``path`` into ``done_dir`` without ever overwriting an earlier file there."""
    stem, ext = os.path.splitext(name)
    src_dir = os.path.dirname(path)
    for k in range(10_000):
        target = os.path.join(done_dir, name if k == 0 else f"{stem}.{k}{ext}")
        try:
            os.link(path, target)                     # fails if target exists: no overwrite
        except FileExistsError:
            continue
        except OSError:
            # no hard links here (another filesystem, or one without them)
            if os.path.exists(target):
                continue
            _copy_in(path, target)
            os.unlink(path)
            break
        os.unlink(path)
        break
    else:
        raise OSError(f"no free name for {name} in {done_dir}")
    fsync_dir(done_dir)
    fsync_dir(src_dir)
    return target


def _copy_in(path: str, target: str) -> None:
    """Copy ``path`` to ``target`` on another file system through a temporary name, so a
    copy cut short (a full disk) never leaves half a file under the real name."""
    import shutil

    tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.partial")
    try:
        shutil.copyfile(path, tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(tmp, target)                          # fails if target exists: no overwrite
    finally:
        unlink(tmp)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
