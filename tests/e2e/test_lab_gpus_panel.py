"""gpusession inside JupyterLab itself, in Debian's headless chromium: the "GPUs" sidebar and the
status bar item follow a `%%gpu 2` cell (running with its step, then finished), show a queued run
with its position, and stop runs; the admin panel edits quotas and revokes leases, for admins
only. What the page shows is recorded in the page itself at each change; screenshots (light, dark,
narrow) are kept under test-artifacts/."""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from gpusession.broker import client
from gpusession.run.caller.lease import Lease
from gpusession.identity import Identity
from gpusession.run.caller.options import validate_run_options

from ..conftest import CLUSTER_GPUS, free_gpus, wait_for
from .conftest import ADMIN, lab_server, screenshot
from .test_lab_notebook import KERNEL_IDLE, accept_kernel_dialog, cell, run_first_cell, wait_for_line

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
NOTEBOOK = "gpus-panel.ipynb"
SHOWN_WITHIN_S = 1.0  # SPEC 8: the sidebar and status bar show a change within 1 s
FREED_WITHIN_S = 1.0  # SPEC 8: stop from the sidebar frees the GPUs within 1 s
CELLS = [
    "%load_ext gpusession\nimport gpusession as gs",
    # 1: a short run that reports its step
    "%%gpu 2\nimport time\nfor step in range(8):\n    gs.report(step=step)\n    time.sleep(0.5)",
    # 2: waits in the queue while the test holds every GPU
    "%%gpu 1\nprint('granted', flush=True)",
    # 3: runs until stopped
    "%%gpu 2\nimport time\nfor step in range(100000):\n    gs.report(step=step)\n    time.sleep(0.1)",
    # 4: the same in the background (the cell returns at once)
    "%%gpu 2 --bg -o bgrun\nimport time\nfor step in range(100000):\n    gs.report(step=step)\n    time.sleep(0.1)",
]
# [unix seconds, the status bar item's text, {lease id: [state class, state text]}], one entry per
# change of what the panel shows, stamped when the page changed: a MutationObserver's callback runs
# right after the change, before the page's next task. (A 50 ms setInterval sampler missed the
# change in CI: under load the page ran Playwright's read of the samples before the timer's next
# tick, so the finished entry was on screen but in no sample.)
SAMPLER = """() => {
  window.__gsPanel = [];
  let last = '';
  const sample = () => {
    const item = document.querySelector('.gs-statusitem');
    const runs = {};
    for (const li of document.querySelectorAll('#gpusession-sidebar li.gs-run')) {
      const state = li.querySelector('.gs-run-state');
      runs[li.dataset.lease] = [li.className, state ? state.innerText : ''];
    }
    const shown = [item ? item.innerText : null, runs];
    const key = JSON.stringify(shown);
    if (key !== last) {
      last = key;
      window.__gsPanel.push([Date.now() / 1000, ...shown]);
    }
  };
  sample();
  new MutationObserver(sample).observe(document.body,
    { childList: true, subtree: true, characterData: true, attributes: true });
}"""


def collect_errors(page) -> list[str]:
    """The page's console errors (with the URL they name) and uncaught exceptions, as they come."""
    errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and errors.append(
        f"{message.text} [{message.location.get('url', '')}]"))
    page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    return errors


def besides_refusal(errors: list[str], *, status: int, path: str) -> list[str]:
    """The errors other than Chromium's own log line for one request the test had refused on
    purpose ("Failed to load resource: ... status of 400" naming its URL)."""
    provoked = f"the server responded with a status of {status}"
    return [e for e in errors if not (provoked in e and f"/gpusession/api/{path}" in e)]


def api(jupyter, path: str, *, method: str = "GET") -> object:
    request = urllib.request.Request(f"{jupyter.url}/gpusession/api/{path}", method=method,
                                     headers={"Authorization": f"token {jupyter.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def newest_lease(jupyter, cell_started: float) -> dict:
    """The newest lease asked from this test's notebook since the cell started."""
    leases = [l for l in api(jupyter, "leases?all=true")
              if l["notebook"] == NOTEBOOK and l["requested_at"] >= cell_started - 1]
    assert leases, "no lease names the notebook"
    return max(leases, key=lambda l: l["lease_id"])


def shown(page, jupyter, locator, *, timeout_ms: int, name: str) -> None:
    """Wait for the locator; on a timeout, fail with a screenshot, the leases and the server's state."""
    try:
        locator.wait_for(timeout=timeout_ms)
    except PlaywrightTimeout:
        screenshot(page, f"lab-gpus-failed-{name}")
        item = page.locator(".gs-statusitem")
        pytest.fail(f"{name} not shown within {timeout_ms} ms; status item: "
                    f"{item.inner_text() if item.count() else None!r}; leases: {api(jupyter, 'leases?all=true')[:3]}; "
                    f"{jupyter.diagnose()}")


def run_entry(page, lease_id: int):
    return page.locator(f'#gpusession-sidebar li.gs-run[data-lease="{lease_id}"]')


def first_sample(page, predicate) -> float | None:
    """Unix seconds of the first recorded change of the page that the predicate accepts."""
    return next((t for t, item, runs in page.evaluate("() => window.__gsPanel") if predicate(item, runs)), None)


def open_sidebar(page) -> None:
    tab = page.locator('.lm-TabBar-tab[data-id="gpusession-sidebar"]')
    if "lm-mod-current" not in (tab.get_attribute("class") or ""):
        tab.click()
    page.locator("#gpusession-sidebar .gs-cluster").wait_for(timeout=30_000)


@pytest.fixture(scope="module")
def lab(browser, jupyter):
    """JupyterLab with the notebook open, its first cell run and the GPUs sidebar open; console
    errors and uncaught exceptions of the page are collected in page.errors."""
    jupyter.put_notebook(NOTEBOOK, CELLS)
    context = browser.new_context(color_scheme="light", viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.errors = collect_errors(page)
    page.goto(jupyter.lab(NOTEBOOK))
    page.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1).wait_for(timeout=120_000)
    page.evaluate("() => { window.__gs = { samples: [], t0: null, cell: null }; }")  # run_first_cell's clock
    run_first_cell(page, jupyter)
    open_sidebar(page)
    page.evaluate(SAMPLER)
    yield page
    context.close()


@pytest.fixture(autouse=True)
def no_console_errors(request):
    """After each test on the shared page: it logged no console error (checked per test, so the
    check holds in any order; it was a last test that passed only after the others had run)."""
    yield
    if "lab" in request.fixturenames:
        page = request.getfixturevalue("lab")
        errors, page.errors[:] = list(page.errors), []
        assert errors == [], f"console errors of the page during {request.node.name}: {errors}"


def test_a_gpu_cell_shows_its_step_in_the_status_bar_and_sidebar_then_finished_within_1_s_of_its_release(lab, jupyter):
    started = time.time()
    cell(lab, 1).locator(".jp-InputPrompt").click()
    lab.keyboard.press("Shift+Enter")
    shown(lab, jupyter, lab.locator(".gs-statusitem", has_text=re.compile(r"2 GPUs · step \d")),
          timeout_ms=180_000, name="status-step")
    lease = newest_lease(jupyter, started)
    entry = run_entry(lab, lease["lease_id"])
    entry.filter(has_text=re.compile(r"running · step \d")).wait_for(timeout=10_000)
    assert NOTEBOOK in entry.inner_text() and "2 GPUs" in entry.inner_text()
    screenshot(lab, "lab-sidebar-running")
    wait_for_line(lab, 1, "released", timeout_ms=120_000)
    entry.filter(has_text="finished").wait_for(timeout=10_000)
    released_at = newest_lease(jupyter, started)["released_at"]
    key = str(lease["lease_id"])
    seen = first_sample(lab, lambda item, runs: "gs-state-ended" in runs.get(key, [""])[0])
    assert seen is not None, "the sidebar shows the run finished, but no recorded change of the page has it"
    assert seen - released_at <= SHOWN_WITHIN_S, (
        f"the sidebar showed the run finished {seen - released_at:.2f} s after the broker released it "
        f"(bound {SHOWN_WITHIN_S} s)")
    idle = first_sample(lab, lambda item, runs: item == "GPUs: idle" and "gs-state-ended" in runs.get(key, [""])[0])
    assert idle is not None, "the status bar did not go idle"
    assert idle - released_at <= SHOWN_WITHIN_S, (
        f"the status bar went idle {idle - released_at:.2f} s after the broker released it (bound {SHOWN_WITHIN_S} s)")
    ended = newest_lease(jupyter, started)
    facts = entry.locator(".gs-muted").inner_text()  # "2 GPUs · 12 s · 24 GPU-s": the ledger's GPU-seconds
    billed = re.search(r"2 GPUs · \d+ (?:min \d+ )?s · (\d+) GPU-s", facts)
    assert billed and abs(int(billed.group(1)) - ended["gpu_seconds"]) <= 1, f"{facts!r} vs {ended['gpu_seconds']}"
    wait_for(lambda: quota_line_matches(lab, jupyter), timeout=10, message="the sidebar's GPU-hours this week")
    assert lab.locator(".jp-Notebook .jp-Cell.jp-mod-active").get_attribute("data-windowed-list-index") != "1"
    entry.get_by_role("button", name=NOTEBOOK).click()  # opens the notebook at the cell that started the run
    lab.locator('.jp-Notebook .jp-Cell.jp-mod-active[data-windowed-list-index="1"]').wait_for(timeout=10_000)


def quota_line_matches(page, jupyter) -> bool:
    """The sidebar's "N GPU-h this week of ..." line shows the broker's 7-day GPU-hours."""
    line = re.search(r"([\d.]+) GPU-h this week of", page.locator("#gpusession-sidebar .gs-quota").inner_text())
    return bool(line) and abs(float(line.group(1)) - api(jupyter, "status")["quota"]["gpu_hours_7d"]) <= 0.01


def test_a_queued_run_shows_its_position_and_reason_and_stop_takes_it_out_of_the_queue(lab, jupyter):
    holder = Lease(validate_run_options(gpus=CLUSTER_GPUS), identity=Identity("holder")).acquire()
    try:
        started = time.time()
        cell(lab, 2).locator(".jp-InputPrompt").click()
        lab.keyboard.press("Shift+Enter")
        lab.locator(".gs-statusitem", has_text="GPUs: queued #1").wait_for(timeout=60_000)
        lease = newest_lease(jupyter, started)
        entry = run_entry(lab, lease["lease_id"])
        entry.filter(has_text="queued #1").wait_for(timeout=10_000)
        reason = next(l for l in api(jupyter, "leases") if l["lease_id"] == lease["lease_id"])["reason"]
        assert reason, "the broker gives no reason for the queued run"
        entry.filter(has_text=f"queued #1 ({reason})").wait_for(timeout=5_000)
        screenshot(lab, "lab-sidebar-queued")
        entry.get_by_role("button", name=f"stop lease {lease['lease_id']}").click()
        entry.filter(has_text="revoked").wait_for(timeout=10_000)
        wait_for_line(lab, 2, "revoked", timeout_ms=30_000)  # the cell says why it ended
        assert "granted" not in cell(lab, 2).locator(".jp-OutputArea").inner_text()
    finally:
        holder.release()


def test_stop_in_the_sidebar_frees_the_runs_gpus_in_ray_within_1_s_and_the_cell_shows_it(lab, jupyter):
    started = time.time()
    cell(lab, 3).locator(".jp-InputPrompt").click()
    lab.keyboard.press("Shift+Enter")
    lab.locator(".gs-statusitem", has_text=re.compile(r"2 GPUs · step \d")).wait_for(timeout=180_000)
    lease = newest_lease(jupyter, started)
    entry = run_entry(lab, lease["lease_id"])
    stop = entry.get_by_role("button", name=f"stop lease {lease['lease_id']}")
    assert free_gpus() <= CLUSTER_GPUS - 2
    entry.get_by_role("button", name=NOTEBOOK).focus()
    lab.keyboard.press("Tab")  # keyboard reachable: Tab goes from the run's notebook to its Stop
    focused = f"stop-{lease['lease_id']}"
    assert lab.evaluate("() => document.activeElement.dataset.focusKey") == focused
    lab.wait_for_function("button => !button.isConnected", arg=lab.evaluate_handle("() => document.activeElement"),
                          timeout=10_000)  # the sidebar redrew as the step moved on ...
    assert lab.evaluate("() => document.activeElement.dataset.focusKey") == focused, "a redraw took the focus away"
    pressed = time.monotonic()
    lab.keyboard.press("Enter")  # keyboard reachable: the stop button takes Enter
    freed = gpus_free_within_bound(pressed, "the run's GPUs free in Ray", after="Stop")
    wait_for_line(lab, 3, "revoked", timeout_ms=30_000)
    run_entry(lab, lease["lease_id"]).filter(has_text="revoked").wait_for(timeout=10_000)
    print(f"stop from the sidebar: GPUs free in Ray {freed:.2f} s after Enter")


TWO_NOTEBOOKS = ("holder-nb.ipynb", "waiter-nb.ipynb")
HOLDER_CELLS = ["%load_ext gpusession\nimport gpusession as gs",
                f"%%gpu {CLUSTER_GPUS}\nimport time\nfor step in range(100000):\n    gs.report(step=step)\n    time.sleep(0.1)"]
WAITER_CELLS = ["%load_ext gpusession", "%%gpu 2\nprint('granted', flush=True)"]


def notebook_panel(page, name: str) -> str:
    """The id of the open notebook's panel (Lab's tab carries its widget's id as data-id)."""
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=name)
    tab.wait_for(timeout=60_000)
    return tab.get_attribute("data-id")


def panel_cell(page, panel: str, index: int):
    return page.locator(f'[id="{panel}"] .jp-Cell').nth(index)


def run_panel_cell(page, panel: str, index: int) -> None:
    """Select the cell of this notebook and press Shift+Enter; answer "Select Kernel" if it comes up."""
    panel_cell(page, panel, index).locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")
    accept_kernel_dialog(page)


def run_load_ext(page, panel: str) -> None:
    """The notebook's first cell run once its kernel is idle (a press that ran nothing is repeated,
    as run_first_cell does: under load the session can have no kernel yet)."""
    prompt = panel_cell(page, panel, 0).locator(".jp-InputPrompt", has_text=re.compile(r"\[\d+\]"))
    for _ in range(8):
        try:
            accept_kernel_dialog(page)
            page.get_by_text(KERNEL_IDLE).wait_for(timeout=30_000)
            run_panel_cell(page, panel, 0)
            prompt.wait_for(timeout=30_000)
            return
        except PlaywrightTimeout:
            continue
    pytest.fail(f"the first cell of {panel} never ran")


def lease_of(jupyter, notebook: str, since: float) -> dict:
    leases = [l for l in api(jupyter, "leases?all=true") if l["notebook"] == notebook and l["requested_at"] >= since - 1]
    assert leases, f"no lease names {notebook}"
    return max(leases, key=lambda l: l["lease_id"])


def switch_to(page, name: str) -> None:
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=name).click()


def test_two_notebooks_a_run_queued_behind_the_other_shows_its_position_and_stop_works_on_both(browser, jupyter):
    """Notebook 1 holds every GPU; notebook 2's `%%gpu 2` waits behind it (no GPU held by the test
    process). The sidebar lists both; Stop on the queued one takes it out of the queue, Stop on the
    running one frees its GPUs in Ray within 1 s of the click and its cell says it was stopped."""
    holder_nb, waiter_nb = TWO_NOTEBOOKS
    jupyter.put_notebook(holder_nb, HOLDER_CELLS)
    jupyter.put_notebook(waiter_nb, WAITER_CELLS)
    context = browser.new_context(color_scheme="light", viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors = collect_errors(page)
    try:
        page.goto(jupyter.lab(holder_nb))
        holder = notebook_panel(page, holder_nb)
        panel_cell(page, holder, 1).wait_for(timeout=120_000)
        run_load_ext(page, holder)
        started = time.time()
        run_panel_cell(page, holder, 1)
        page.locator(".gs-statusitem", has_text=re.compile(rf"{CLUSTER_GPUS} GPUs · step \d")).wait_for(timeout=180_000)
        running = lease_of(jupyter, holder_nb, started)
        assert free_gpus() == 0, "the first notebook's run holds every GPU"

        files = page.locator('.lm-TabBar-tab[data-id="filebrowser"]')
        if "lm-mod-current" not in (files.get_attribute("class") or ""):
            files.click()  # a click on the current tab would close the file browser
        page.locator(".jp-DirListing-item", has_text=waiter_nb).dblclick()
        waiter = notebook_panel(page, waiter_nb)
        panel_cell(page, waiter, 1).wait_for(timeout=120_000)
        run_load_ext(page, waiter)
        queued_at = time.time()
        run_panel_cell(page, waiter, 1)
        page.locator(".gs-statusitem", has_text="GPUs: queued #1").wait_for(timeout=60_000)
        queued = lease_of(jupyter, waiter_nb, queued_at)

        open_sidebar(page)
        queued_entry, running_entry = run_entry(page, queued["lease_id"]), run_entry(page, running["lease_id"])
        queued_entry.filter(has_text="queued #1").wait_for(timeout=10_000)
        running_entry.filter(has_text=re.compile(r"running · step \d")).wait_for(timeout=10_000)
        assert waiter_nb in queued_entry.inner_text() and holder_nb in running_entry.inner_text()
        screenshot(page, "lab-sidebar-two-notebooks")

        queued_entry.get_by_role("button", name=f"stop lease {queued['lease_id']}").click()
        queued_entry.filter(has_text="revoked").wait_for(timeout=10_000)
        wait_for_scoped_line(page, waiter, 1, "revoked")
        assert "granted" not in panel_cell(page, waiter, 1).locator(".jp-OutputArea").inner_text()
        assert free_gpus() == 0, "stopping the queued run left the running one alone"
        running_entry.filter(has_text=re.compile(r"running · step \d")).wait_for(timeout=5_000)

        stop = running_entry.get_by_role("button", name=f"stop lease {running['lease_id']}")
        clicked = time.monotonic()
        stop.click()
        freed = gpus_free_within_bound(clicked, "the running notebook's GPUs free in Ray", after="the click")
        switch_to(page, holder_nb)
        wait_for_scoped_line(page, holder, 1, "revoked")
        running_entry.filter(has_text="revoked").wait_for(timeout=10_000)
        print(f"two notebooks: stop from the sidebar freed the GPUs in Ray {freed:.2f} s after the click")
        assert errors == [], f"console errors of the page: {errors}"
    finally:
        context.close()
        stop_open_leases(jupyter, TWO_NOTEBOOKS)



def gpus_free_within_bound(since: float, what: str, *, after: str) -> float:
    """Seconds from `since` (a click or key press) until Ray shows every GPU free; asserts the
    issue's bound, measured from that event."""
    wait_for(lambda: free_gpus() == CLUSTER_GPUS, timeout=30, message=what)
    freed = time.monotonic() - since
    assert freed <= FREED_WITHIN_S, f"Ray showed the GPUs free {freed:.2f} s after {after} (bound {FREED_WITHIN_S} s)"
    return freed

def stop_open_leases(jupyter, notebooks: tuple[str, ...]) -> None:
    """A failed test leaves no run holding GPUs for the next one (closing the page keeps its kernels)."""
    for lease in api(jupyter, "leases?all=true"):
        if lease["notebook"] in notebooks and lease["state"] != "ended":
            api(jupyter, f"leases/{lease['lease_id']}", method="DELETE")


def wait_for_scoped_line(page, panel: str, index: int, text: str) -> None:
    line = panel_cell(page, panel, index).locator(".gpusession-status-text")
    line.filter(has_text=text).wait_for(state="attached", timeout=30_000)


def test_a_background_run_is_labelled_background_in_the_sidebar_and_stop_frees_its_gpus_within_1_s(lab, jupyter):
    started = time.time()
    cell(lab, 4).locator(".jp-InputPrompt").click()
    lab.keyboard.press("Shift+Enter")
    wait_for(lambda: [l for l in api(jupyter, "leases?all=true")
                      if l["notebook"] == NOTEBOOK and l["requested_at"] >= started - 1],
             timeout=180, message="the background run's lease")
    lease = newest_lease(jupyter, started)
    assert lease["background"] is True, f"the lease of a %%gpu --bg cell does not say background: {lease}"
    entry = run_entry(lab, lease["lease_id"])
    shown(lab, jupyter, entry.filter(has_text=re.compile(r"background · running · step \d")),
          timeout_ms=180_000, name="background-running")
    screenshot(lab, "lab-sidebar-background")
    stop = entry.get_by_role("button", name=f"stop lease {lease['lease_id']}")
    clicked = time.monotonic()
    stop.click()
    freed = gpus_free_within_bound(clicked, "the background run's GPUs free in Ray", after="Stop")
    entry.filter(has_text="background · revoked").wait_for(timeout=10_000)
    wait_for_line(lab, 4, "revoked", timeout_ms=30_000)  # the cell that started it says why it ended
    print(f"stop of a background run from the sidebar: GPUs free in Ray {freed:.2f} s after the click")


def test_dark_theme_and_a_narrow_window_stay_legible(browser, jupyter):
    held = Lease(validate_run_options(gpus=1), identity=Identity(ADMIN)).acquire()  # a run in the sidebar,
    # whichever tests ran before this one
    set_theme(jupyter, "JupyterLab Dark")
    context = browser.new_context(color_scheme="dark", viewport={"width": 640, "height": 800})
    page = context.new_page()
    errors = collect_errors(page)
    try:
        page.goto(jupyter.lab())
        page.locator('body[data-jp-theme-light="false"]').wait_for(state="attached", timeout=120_000)
        open_sidebar(page)
        page.locator("#gpusession-sidebar li.gs-run").first.wait_for(timeout=10_000)
        screenshot(page, "lab-sidebar-dark-narrow")
        colors = page.evaluate("""() => { const s = getComputedStyle(document.querySelector('#gpusession-sidebar'));
            return [s.color, s.backgroundColor]; }""")
        text, background = (luminance(c) for c in colors)
        assert text > 0.5 > background, f"dark theme: text {colors[0]} on {colors[1]}"
        box = rendered_box(page.locator("#gpusession-sidebar .gs-stop, #gpusession-sidebar .gs-link").first)
        assert box["x"] + box["width"] <= 640, f"a control of the sidebar is off screen: {box}"
        assert errors == [], f"console errors of the dark page: {errors}"
    finally:
        context.close()
        set_theme(jupyter, "JupyterLab Light")
        held.release()


def rendered_box(control, timeout_s: float = 10.0) -> dict:
    """The control's box once it is rendered. The sidebar redraws at every update, and Playwright's
    bounding_box() is None for an element caught between two drawings (seen once in CI)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        control.wait_for(state="visible", timeout=timeout_s * 1000)
        box = control.bounding_box()
        if box is not None:
            return box
    raise AssertionError(f"no control of the sidebar was rendered within {timeout_s:.0f} s")


def set_theme(jupyter, name: str) -> None:
    """Lab's theme setting, as its Settings Editor saves it (the server keeps it for every page)."""
    body = json.dumps({"raw": json.dumps({"theme": name})}).encode()
    request = urllib.request.Request(f"{jupyter.url}/lab/api/settings/@jupyterlab/apputils-extension:themes",
                                     data=body, method="PUT", headers={"Authorization": f"token {jupyter.token}",
                                                                       "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30):
        pass


def luminance(css: str) -> float:
    r, g, b = (int(x) / 255 for x in re.findall(r"\d+", css)[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_an_admin_opens_the_admin_panel_from_the_command_palette(page, jupyter):
    errors = collect_errors(page)
    page.goto(jupyter.lab())
    page.locator('#gpusession-sidebar[data-role="admin"]').wait_for(state="attached", timeout=120_000)
    search_the_command_palette(page, "GPU admin")
    # the palette redraws its list as it filters (a click can land on a detached item): the
    # command is the active (first) match, and Enter runs it as a keyboard user would. The redraw
    # waits for the page's next animation frame, which a starved renderer gives late (CI at load
    # 14: not within 10 s): a generous wait, and a failure that names what the palette shows.
    ours = page.locator('.lm-CommandPalette-item.lm-mod-active[data-command="gpusession:open-admin"]')
    try:
        ours.wait_for(timeout=45_000)
    except PlaywrightTimeout:
        pytest.fail(f"'GPU admin' in the palette did not make gpusession:open-admin its active item; "
                    f"{what_the_palette_shows(page)}")
    page.keyboard.press("Enter")
    page.locator(".gs-admin .gs-quotas").wait_for(timeout=30_000)
    assert page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="GPU admin").count() == 1
    assert errors == [], f"console errors of the page: {errors}"


PALETTE = ".jp-ModalCommandPalette"
PALETTE_INPUT = f"{PALETTE} .lm-CommandPalette-input"


def search_the_command_palette(page, query: str) -> None:
    """Open the command palette with its shortcut and type `query`, as a keyboard user does, once
    JupyterLab has finished opening the page: its launcher has the keyboard focus. Lab's modal
    palette closes, and clears its search box, whenever any command runs, and the page's start
    runs commands until then: after `?reset` (which every test page uses) the state database is
    cleared and the URL routed again, running apputils:load-statedb, router:tree and
    launcher:create, seconds after the sidebar learnt the role on a loaded machine. A palette
    opened before that was closed under the test (CI: it listed no items; with the CPU throttled
    20 times, 2 runs in 3)."""
    page.locator(".jp-Launcher:focus").wait_for(timeout=120_000)
    palette = page.locator(PALETTE_INPUT)
    page.keyboard.press("Control+Shift+c")
    try:
        palette.wait_for(state="visible", timeout=30_000)
    except PlaywrightTimeout:
        pytest.fail(f"Control+Shift+C did not open the command palette; {what_the_palette_shows(page)}")
    page.keyboard.type(query)
    assert palette.input_value() == query, f"the palette's search box reads {palette.input_value()!r}"


def what_the_palette_shows(page) -> str:
    """For a failure: whether the palette is open, its search box, its first items and what has focus."""
    return page.evaluate("""([palette, input]) => {
        const open = !!document.querySelector(palette + ':not(.lm-mod-hidden)');
        const box = document.querySelector(input);
        const items = [...document.querySelectorAll('.lm-CommandPalette-item')].slice(0, 5)
            .map(i => [i.dataset.command, i.classList.contains('lm-mod-active')]);
        const empty = document.querySelector('.lm-CommandPalette-emptyMessage');
        const focus = document.activeElement;
        return `the palette is ${open ? 'open' : 'closed'}, its search box reads ${JSON.stringify(box && box.value)}, ` +
            `its first items (command, active): ${JSON.stringify(items)}` +
            (empty ? `, it says ${JSON.stringify(empty.textContent)}` : '') +
            `; the focus is on ${focus ? focus.tagName + '.' + focus.className : 'nothing'}`;
    }""", [PALETTE, PALETTE_INPUT])


def open_admin_panel(page) -> None:
    page.locator(".jp-LauncherCard", has_text="GPU admin").click()
    page.locator(".gs-admin .gs-quotas").wait_for(timeout=30_000)


def test_an_admin_edits_a_quota_a_bad_value_is_refused_in_words_and_the_panel_stays_live(page, jupyter, broker, admin):
    client.call(broker.set_quota, "alice", {"max_gpus": 2}, admin)
    errors = collect_errors(page)
    holder = None
    try:
        page.goto(jupyter.lab())
        page.locator('#gpusession-sidebar[data-role="admin"]').wait_for(state="attached", timeout=120_000)
        open_admin_panel(page)
        row = page.locator('.gs-admin tr[data-user="alice"]')
        max_gpus = row.get_by_label("max GPUs of alice")
        max_gpus.fill("-1")
        max_gpus.press("Enter")
        row.locator(".gs-error", has_text="max_gpus").wait_for(timeout=10_000)
        assert client.call(broker.quota, "alice", admin)["max_gpus"] == 2  # nothing changed
        screenshot(page, "lab-admin-refused")
        holder = Lease(validate_run_options(gpus=1), identity=Identity("bob")).acquire()  # still live?
        page.locator(f'.gs-admin tr[data-lease="{holder.lease_id}"]').wait_for(timeout=5_000)
        max_gpus.fill("3")
        row.get_by_role("button", name="save quota of alice").click()
        wait_for(lambda: client.call(broker.quota, "alice", admin)["max_gpus"] == 3, timeout=10, message="saved")
        page.locator('.gs-admin tr[data-user="alice"] .gs-error').filter(has_text="max_gpus").wait_for(
            state="detached", timeout=10_000)
        page.get_by_role("button", name=f"revoke lease {holder.lease_id}").click()
        wait_for(lambda: holder_revoked(broker, admin, holder.lease_id), timeout=15, message="revoked")
        screenshot(page, "lab-admin-panel")
        unexpected = besides_refusal(errors, status=400, path="quotas/alice")
        assert unexpected == [], f"console errors of the quota page: {unexpected}"
    finally:
        if holder is not None:
            holder.release()
        client.call(broker.reset_quota, "alice", admin)


def holder_revoked(broker, admin, lease_id: int) -> bool:
    view = next(l for l in client.call(broker.leases, admin, True) if l["lease_id"] == lease_id)
    return view["state"] == "ended" or (view["notice"] or {}).get("kind") == "revoke"


@pytest.fixture(scope="module")
def user_lab(cluster, tmp_path_factory):
    """A second JupyterLab whose owner (`tester`) is not a gpusession admin."""
    with lab_server(cluster, tmp_path_factory.mktemp("user-lab"), admin_users=["somebody-else"]) as server:
        yield server


def test_a_user_who_is_not_an_admin_never_sees_the_admin_command_and_the_api_refuses_them(browser, user_lab):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        page.goto(user_lab.lab())
        page.locator(".jp-LauncherCard").first.wait_for(timeout=120_000)
        page.locator('#gpusession-sidebar[data-role="user"]').wait_for(state="attached", timeout=30_000)
        assert api(user_lab, "whoami") == {"user": "tester", "admin": False}
        assert page.locator(".jp-LauncherCard", has_text="GPU admin").count() == 0
        search_the_command_palette(page, "GPU admin")
        # the palette has searched once it says it found nothing (an open palette draws its
        # results a frame later: a count read at once would be 0 whatever it holds)
        try:
            page.locator(".lm-CommandPalette-emptyMessage").wait_for(timeout=45_000)
        except PlaywrightTimeout:
            pytest.fail(f"'GPU admin' in a non-admin's palette: {what_the_palette_shows(page)}")
        assert page.locator(".lm-CommandPalette-item", has_text="GPU admin").count() == 0
        with pytest.raises(urllib.error.HTTPError) as refused:
            api(user_lab, "quotas/alice", method="DELETE")
        assert refused.value.code == 403
    finally:
        context.close()
