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
            import shutil
            shutil.move(path, target)
            break
        os.unlink(path)
        break
    else:
        raise OSError(f"no free name for {name} in {done_dir}")
    fsync_dir(done_dir)
    fsync_dir(src_dir)
    return target


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
