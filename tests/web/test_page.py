"""The live page in a real browser against a running daemon, with no network but loopback.

One daemon (generator source, two processors, two batchers) and one headless chromium
(:mod:`tests.web.browser`), both in a network namespace that has only ``lo``: the page
must load and draw from what the daemon serves alone.  Checked: every stage of the config
is drawn, with the supervisors listed; the numbers move while messages flow; a processor
SIGKILLed shows as restarting, then running again with one more restart and a new pid,
and the crash is on the timeline; one SIGSTOPped shows as silent until it goes on; the page fits
1280x720 and 1024 wide without sideways
scrolling and with legible text; a screenshot is taken and is not blank; every request
the page made went to the daemon.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.daemon_status import tree_nodes
from tests.web import browser

NODE_STATES = """return Array.from(document.querySelectorAll('#graph .node')).map(
    g => [g.dataset.id, g.dataset.state, Number(g.dataset.restarts), g.dataset.pid])"""


def write_config(tmp: Path, port: int) -> Path:
    (tmp / "out").mkdir()
    path = tmp / "page.toml"
    path.write_text(f"""
[pipeline]
name = "pagetest"
handler = "tests.web.handlers:Parity"
shutdown_timeout = 10
context = {{ sleep = 0.0005 }}

[producer]
source = "generator"
concurrency = 1
rate_limit = {{ allowed_messages = 1500, interval = 0.5 }}

[producer.options]
payload_bytes = 16

[processors.default]
concurrency = 2
max_demand = 20
min_demand = 10

[batchers.even]
batch_size = 50
batch_timeout = 0.2

[batchers.odd]
batch_size = 50
batch_timeout = 0.2

[metrics]
listen = "127.0.0.1:{port}"

[runtime]
dir = "{tmp / 'run'}"
state_dir = "{tmp / 'state'}"
""")
    return path


def states(driver) -> dict[str, tuple[str, int, str]]:
    return {i: (s, r, p) for i, s, r, p in driver.execute_script(NODE_STATES)}


def card(driver, key: str) -> str:
    return driver.execute_script(
        "const c = document.querySelector(`#totals .card[data-key='${arguments[0]}'] .v`);"
        "return c ? c.textContent : null;", key)


def test_the_page_draws_the_running_tree_offline(short_tmp: Path) -> None:
    browser.need_browser()
    port = 18000 + os.getpid() % 1000     # the namespace is ours alone: any port is free
    config = write_config(short_tmp, port)
    sock = short_tmp / "run" / "control.sock"
    shot = short_tmp / "page.png"
    with browser.offline():
        assert browser.interfaces() == ["lo"], browser.interfaces()
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO,
                                  env=test_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        driver = None
        try:
            wait_until(sock.exists, timeout=30, message="the control socket")
            nodes = wait_until(lambda: (n := tree_nodes(sock)) and all(
                v["state"] == "running" for v in n.values()) and n, timeout=30,
                message="every child running")
            workers = {i for i, n in nodes.items() if n["kind"] == "worker"} - {"terminator"}
            supervisors = {i for i, n in nodes.items() if n["kind"] == "supervisor"}

            driver = browser.chrome(1280, 720, short_tmp / "chrome")
            base = f"http://127.0.0.1:{port}"
            driver.get(base + "/")
            # every stage of the config is drawn, every supervisor listed
            drawn = wait_until(lambda: (s := states(driver)) and set(s) == workers and s,
                               timeout=20, message="every stage drawn")
            assert all(state == "running" for state, _r, _p in drawn.values()), drawn
            listed = set(driver.execute_script(
                "return Array.from(document.querySelectorAll('#supervisors tr[data-id]'))"
                ".map(r => r.dataset.id)"))
            assert supervisors | {"terminator"} == listed
            edges = driver.execute_script(
                "return Array.from(document.querySelectorAll('#graph .edge-label'))"
                ".map(t => t.dataset.from + '>' + t.dataset.to)")
            assert {"producer_0>processor_default_0", "producer_0>processor_default_1",
                    "processor_default_0>batcher_even", "processor_default_1>batcher_odd",
                    "batcher_even>batch_processor_even_0",
                    "batcher_odd>batch_processor_odd_0"} <= set(edges)

            # the numbers move while messages flow, by themselves: totals and edge rates
            first = card(driver, "acked")
            wait_until(lambda: card(driver, "acked") != first, timeout=10,
                       message="the acked count to move on the page")
            wait_until(lambda: driver.execute_script(
                "return Array.from(document.querySelectorAll('#graph .edge-label'))"
                ".filter(t => Number(t.dataset.rate) > 0).length") >= 4, timeout=15,
                message="messages per second on the edges")

            # a stage SIGKILLed: restarting, then running again with one more restart
            _s, restarts, pid = drawn["processor_default_0"]
            os.kill(int(pid), signal.SIGKILL)
            seen = wait_until(lambda: states(driver).get("processor_default_0", ("",))[0]
                              == "restarting", timeout=15, interval=0.02,
                              message="processor_default_0 drawn as restarting")
            assert seen
            back = wait_until(lambda: (s := states(driver)["processor_default_0"])[0]
                              == "running" and s, timeout=30,
                              message="processor_default_0 running again")
            assert back[1] == restarts + 1 and back[2] not in ("", pid), (back, restarts, pid)
            timeline = driver.execute_script(
                "return Array.from(document.querySelectorAll('#timeline li'))"
                ".map(l => l.className + ': ' + l.textContent)")
            assert any(line.startswith("crash") and "processor_default_0" in line
                       and "SIGKILL" in line for line in timeline), timeline

            wait_until(lambda: all(s == "running" for s, _r, _p in states(driver).values()),
                       timeout=30, message="every stage running again")

            # a stage that stops reporting (SIGSTOP, well within its 30 s heartbeat) is drawn
            # silent, and running again once it goes on
            bp = states(driver)["batch_processor_odd_0"][2]
            os.kill(int(bp), signal.SIGSTOP)
            try:
                wait_until(lambda: states(driver)["batch_processor_odd_0"][0] == "silent",
                           timeout=15, message="the stopped batch processor drawn silent")
            finally:
                os.kill(int(bp), signal.SIGCONT)
            wait_until(lambda: states(driver)["batch_processor_odd_0"][0] == "running",
                       timeout=15, message="the batch processor running again")

            # fits 1280x720 and a narrower laptop without sideways scrolling, text legible
            for width, height in ((1280, 720), (1024, 640)):
                browser.viewport(driver, width, height)
                fit = driver.execute_script(
                    "const ids = Array.from(document.querySelectorAll('#graph .node .id'));"
                    "return [document.documentElement.scrollWidth, window.innerWidth,"
                    " Math.min(...ids.map(t => t.getBoundingClientRect().height)),"
                    " document.querySelector('#graph').getBoundingClientRect().bottom];")
                assert fit[0] <= fit[1], f"{width}px: the page scrolls sideways: {fit}"
                assert fit[2] >= 9, f"{width}px: stage names {fit[2]:.1f}px tall"
                assert fit[3] <= height, f"{width}px: the graph ends below the fold: {fit}"
            browser.viewport(driver, 1280, 720)
            # messages flow on every edge again after the restart (and in the screenshot)
            wait_until(lambda: driver.execute_script(
                "return Array.from(document.querySelectorAll('#graph .edge-label'))"
                ".every(t => Number(t.dataset.rate) > 0)"), timeout=20,
                message="messages flowing on every edge again")
            wait_until(lambda: driver.execute_script(
                "return Array.from(document.querySelectorAll('#graph .node .usage'))"
                ".every(t => !t.textContent.includes('–%'))"), timeout=10,
                message="every stage's CPU shown again")
            driver.save_screenshot(str(shot))
            w, h, colours = browser.png_colours(shot.read_bytes())
            assert (w, h) == (1280, 720) and colours > 50, (w, h, colours)
            browser.keep_copy(shot, os.environ.get("OFFBROADWAY_PAGE_SCREENSHOT"))

            # nothing was asked of anyone but the daemon
            asked = driver.execute_script(
                "return performance.getEntriesByType('resource').map(r => r.name)")
            assert asked and all(u.startswith(base + "/") for u in asked), asked
            state = json.loads(driver.execute_script(
                "return fetch('/api/state').then(r => r.text())"))
            assert state["status"]["pipeline"] == "pagetest"
        except BaseException:
            if driver is not None:
                driver.save_screenshot(str(short_tmp / "failed.png"))
            daemon.kill()
            _out, err = daemon.communicate(timeout=30)
            print(err[-4000:])
            raise
        finally:
            if driver is not None:
                driver.quit()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0, daemon.communicate()[1][-3000:]
