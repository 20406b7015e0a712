"""``offbroadway top``: the status table in a curses screen that fits the terminal.

The header (pipeline, uptime, books, sources down) stays on top, the rows scroll under it
(arrows, j/k, PgUp/PgDn, Home/End), a footer says how to quit.  ``q`` quits; a daemon that
goes away ends the view with the reason (exit 0, it is not an error of ``top``).  Lines
are cut to the width, never wrapped.  The tables come from :mod:`.render`, so ``top`` and
``status`` show the same columns.
"""

from __future__ import annotations

import curses
import time
from collections.abc import Callable

from . import control
from .render import header_lines, table_lines

QUIT = (ord("q"), ord("Q"), 27)   # q, Q, Esc


def _put(win: curses.window, y: int, text: str, width: int, attr: int = 0) -> None:
    """One line, cut to the width (curses raises on the bottom-right cell)."""
    try:
        win.addnstr(y, 0, text, max(0, width - 1), attr)
    except curses.error:
        pass


def draw(win: curses.window, status: dict, rates: dict[str, float], scroll: int) -> int:
    """Draw one frame; returns the scroll offset actually used (clamped)."""
    height, width = win.getmaxyx()
    win.erase()
    head = header_lines(status)
    table = table_lines(status, rates, width - 1)
    titles, rows = table[0], table[1:]
    footer = f"q quit  arrows/PgUp/PgDn scroll  {time.strftime('%H:%M:%S')}"
    # the header may give up its extra lines (failed-to, sources) before the rows do
    room = height - 1 - 1 - 1            # footer, titles, the first header line
    extra = head[1:][:max(0, min(len(head) - 1, room - min(len(rows), room)))]
    head = head[:1] + extra
    body = max(0, height - len(head) - 2)
    scroll = max(0, min(scroll, len(rows) - body))
    y = 0
    for line in head:
        _put(win, y, line, width, curses.A_BOLD)
        y += 1
    _put(win, y, titles, width, curses.A_REVERSE)
    y += 1
    for line in rows[scroll:scroll + body]:
        _put(win, y, line, width)
        y += 1
    if len(rows) > body:
        footer += f"  rows {scroll + 1}-{min(len(rows), scroll + body)} of {len(rows)}"
    _put(win, height - 1, footer, width, curses.A_DIM)
    win.refresh()
    return scroll


def run_top(win: curses.window, path: str, status: dict,
            rates_of: Callable[[dict], dict[str, float]], interval: float) -> str | None:
    """The loop under :func:`curses.wrapper`: None when the user quits, else why the
    daemon is gone."""
    try:
        curses.curs_set(0)
    except curses.error:
        pass
    win.timeout(100)
    scroll = 0
    rates = rates_of(status)
    next_at = time.monotonic() + interval
    while True:
        scroll = draw(win, status, rates, scroll)
        key = win.getch()
        if key in QUIT:
            return None
        body = win.getmaxyx()[0] - 4
        if key in (curses.KEY_DOWN, ord("j")):
            scroll += 1
        elif key in (curses.KEY_UP, ord("k")):
            scroll -= 1
        elif key == curses.KEY_NPAGE:
            scroll += max(1, body)
        elif key == curses.KEY_PPAGE:
            scroll -= max(1, body)
        elif key == curses.KEY_HOME:
            scroll = 0
        elif key == curses.KEY_END:
            scroll = 1 << 30
        if time.monotonic() >= next_at:
            next_at = time.monotonic() + interval
            try:
                status = control.request(path, {"cmd": "status"}, timeout=10)["status"]
            except control.ControlError as exc:
                return str(exc)
            rates = rates_of(status)
