"""A real headless browser for the page tests: Debian's chromium driven by chromedriver
through selenium, with no network but loopback.

"No network" is literal: :func:`offline` moves the calling thread into a network namespace
of its own that has only ``lo`` (Linux network namespaces belong to a thread, and the
processes it starts inherit it), so the daemon and the browser both run where nothing but
127.0.0.1 exists.  A page that needed a CDN, a web font or any outside request would not
load there.  Needs root (CAP_SYS_ADMIN), as CI runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import socket
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def need_browser() -> None:
    """Skip (or fail under CI, which installs them) without chromium, its driver, selenium."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip: the test extra)")
    if missing:
        why = f"{', '.join(missing)} missing (apt-get install chromium chromium-driver)"
        if os.environ.get("OFFBROADWAY_REQUIRE_CI_TOOLS"):
            pytest.fail(why)
        pytest.skip(why)


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """This thread (and what it starts) in a new network namespace with only ``lo`` up."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            why = f"cannot make a network namespace: {os.strerror(err)}"
            if os.environ.get("OFFBROADWAY_REQUIRE_CI_TOOLS"):
                pytest.fail(why)
            pytest.skip(why)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            flags = struct.unpack("16sh", fcntl.ioctl(s, SIOCGIFFLAGS,
                                                     struct.pack("16sh", b"lo", 0)))[1]
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))
        yield
    finally:
        if libc.setns(home, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "cannot return to the test's network namespace")
        os.close(home)


def interfaces() -> list[str]:
    """The network interfaces this thread sees (``socket.if_nameindex`` asks the kernel
    through a socket made here, so it answers for this thread's namespace)."""
    return [name for _i, name in socket.if_nameindex()]


def chrome(width: int, height: int, profile: Path):
    """A headless chromium whose viewport is ``width`` x ``height`` CSS pixels."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", "--hide-scrollbars",
                f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    viewport(driver, width, height)
    return driver


def viewport(driver, width: int, height: int) -> None:
    """Make the page's viewport exactly ``width`` x ``height`` (the window has chrome)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})


def png_colours(png: bytes, sample: int = 4) -> tuple[int, int, int]:
    """(width, height, distinct colours among every ``sample``-th pixel of every
    ``sample``-th row) of an 8-bit RGB or RGBA, non-interlaced PNG (what chromium writes):
    enough to tell a drawn page from a blank one without an imaging library."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        body = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _c, _f, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and not interlace, (depth, colour)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    colours: set[bytes] = set()
    for y in range(height):
        line = raw[y * (stride + 1):(y + 1) * (stride + 1)]
        ftype, cur = line[0], bytearray(line[1:])
        for i in range(stride):
            a = cur[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                cur[i] = (cur[i] + a) & 255
            elif ftype == 2:
                cur[i] = (cur[i] + b) & 255
            elif ftype == 3:
                cur[i] = (cur[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % sample == 0:
            for x in range(0, width, sample):
                colours.add(bytes(cur[x * bpp:x * bpp + 3]))
        prev = cur
    return width, height, len(colours)


def keep_copy(src: Path, dest: str | None) -> None:
    """Copy the screenshot where ``OFFBROADWAY_PAGE_SCREENSHOT`` says (docs/ keeps one)."""
    if dest:
        shutil.copyfile(src, dest)
