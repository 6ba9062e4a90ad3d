"""The admin page in a real headless Chromium: capacity, leases, quotas and the usage chart;
an admin edits a quota and revokes a running lease; HTML in a user name stays text."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from gpusession.broker import client
from gpusession.identity import Identity
from gpusession.run.caller.lease import Lease
from gpusession.run.caller.options import validate_run_options

from ..conftest import wait_for
from .conftest import screenshot

pytestmark = pytest.mark.e2e
SNEAKY = "<img src=x onerror=alert(1)>"


@pytest.fixture
def hold(cluster):
    held = []

    def hold(user, gpus=1):
        lease = Lease(validate_run_options(gpus=gpus), identity=Identity(user)).acquire()
        held.append(lease)
        return lease

    yield hold
    for lease in held:
        lease.release()


def lease_row(page, lease_id):
    return page.locator(f'#gs-leases tr[data-lease="{lease_id}"]')


def quota_row(page, user):
    return page.locator("#gs-quotas tbody tr").filter(has=page.locator("span.user", has_text=user))


def test_the_page_shows_capacity_leases_quotas_and_the_chart_with_html_in_names_as_text(
        page, browser, jupyter, hold, broker, admin, cluster):
    hold("alice", gpus=2).release()  # some history for the chart
    client.call(broker.set_quota, SNEAKY, {"max_gpus": 1, "gpu_hours": 5}, admin)
    sneaky = hold(SNEAKY, gpus=2)  # past max_gpus on idle GPUs: borrowed, so over quota
    try:
        page.goto(jupyter.admin_page())
        row = lease_row(page, sneaky.lease_id)
        row.wait_for()
        assert row.locator("td.user").inner_text() == SNEAKY and "over quota" in row.inner_text()
        assert quota_row(page, SNEAKY).count() == 1
        assert page.locator("main img").count() == 0 and page.dialogs == []  # the name never became HTML
        assert "4" in page.locator("#gs-cards .gs-card").first.inner_text()
        assert ("logical" in page.locator("#gs-cards").inner_text()) is cluster.logical
        page.wait_for_function("() => Chart.getChart('gs-chart')?.data.datasets.some(d => d.label === 'alice')")
        screenshot(page, "admin-light")
        dark = browser.new_context(color_scheme="dark", viewport={"width": 1280, "height": 900}).new_page()
        dark.goto(jupyter.admin_page())
        lease_row(dark, sneaky.lease_id).wait_for()
        dark.wait_for_function("() => Chart.getChart('gs-chart')")
        assert dark.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(17, 17, 17)"
        screenshot(dark, "admin-dark")
        dark.context.close()
    finally:
        client.call(broker.reset_quota, SNEAKY, admin)


def test_an_admin_edits_a_quota_in_place_and_a_bad_value_is_explained_not_saved(page, jupyter, broker, admin):
    client.call(broker.set_quota, "bob", {"max_gpus": 1}, admin)
    try:
        page.goto(jupyter.admin_page())
        row = quota_row(page, "bob")
        row.wait_for()
        row.get_by_label("max GPUs of bob").fill("-1")
        row.get_by_role("button", name="Save").click()
        expect(row.locator(".row-error")).to_contain_text("max_gpus must be a number >= 0")
        assert client.call(broker.quota, "bob", admin)["max_gpus"] == 1
        row.get_by_label("max GPUs of bob").fill("3")
        row.get_by_label("max GPUs of bob").press("Enter")
        wait_for(lambda: client.call(broker.quota, "bob", admin)["max_gpus"] == 3, timeout=10, message="quota saved")
        expect(page.locator("#gs-banner")).to_contain_text("Saved the quota of bob")
        expect(quota_row(page, "bob").get_by_label("max GPUs of bob")).to_have_value("3")
        screenshot(page, "admin-quota-edited")
    finally:
        client.call(broker.reset_quota, "bob", admin)


def test_an_admin_revokes_a_running_lease_with_two_clicks(page, jupyter, hold, broker, admin):
    lease = hold("carol", gpus=2)
    page.goto(jupyter.admin_page())
    button = lease_row(page, lease.lease_id).get_by_role("button", name=f"revoke lease {lease.lease_id}")
    button.click()
    expect(button).to_have_text("Confirm revoke")
    assert client.call(broker.leases, admin)[0]["notice"] is None  # one click alone revokes nothing
    button.click()
    expect(page.locator("#gs-banner")).to_contain_text(f"Revoking lease {lease.lease_id} of carol")
    wait_for(lambda: not client.call(broker.leases, admin), timeout=20, message="revoked lease closed by the broker")
    lease_row(page, lease.lease_id).wait_for(state="detached", timeout=10_000)
    ended = client.call(broker.leases, admin, True, 5)
    assert next(l for l in ended if l["lease_id"] == lease.lease_id)["end_reason"] == "revoked"


def test_after_a_rejected_save_adding_a_user_and_resetting_still_show_what_the_server_holds(
        page, jupyter, broker, admin):
    """The sequence that once left the page stale: a bad save of -3, then adding alice, then Reset."""
    client.call(broker.set_quota, "bob", {"max_gpus": 1}, admin)
    try:
        page.goto(jupyter.admin_page())
        bob = quota_row(page, "bob")
        bob.wait_for()
        bob.get_by_label("max GPUs of bob").fill("-3")
        bob.get_by_role("button", name="Save").click()
        expect(bob.locator(".row-error")).to_contain_text("max_gpus must be a number >= 0")
        expect(page.locator("#gs-banner")).to_be_hidden()  # the error is on bob's row, nowhere else
        screenshot(page, "admin-1-rejected-save")

        page.locator("#gs-add-user").fill("alice")
        page.locator("#gs-add-max-gpus").fill("2")
        page.locator("#gs-add").click()
        alice = quota_row(page, "alice")
        expect(alice.get_by_label("max GPUs of alice")).to_have_value("2")  # drawn from the server's answer
        expect(page.locator("#gs-banner")).to_have_text("Saved the quota of alice.")
        expect(bob.locator(".row-error")).to_contain_text("max_gpus must be a number >= 0")  # still on its row
        assert client.call(broker.quota, "alice", admin)["max_gpus"] == 2
        screenshot(page, "admin-2-user-added")

        bob.get_by_role("button", name="Reset").click()
        expect(page.locator("#gs-banner")).to_have_text("bob is back on the default quota.")
        # bob has no row of his own now: the server lists him only if he holds or used GPUs lately
        listed = [q for q in client.call(broker.quotas, admin) if q["user"] == "bob"]
        if listed:
            expect(quota_row(page, "bob").locator(".gs-badge")).to_have_text("default")
            expect(quota_row(page, "bob").locator(".row-error")).to_have_text("")
        else:
            expect(quota_row(page, "bob")).to_have_count(0)
        expect(page.locator("#gs-quotas")).not_to_contain_text("max_gpus must be")
        expect(quota_row(page, "alice").get_by_label("max GPUs of alice")).to_have_value("2")
        screenshot(page, "admin-3-reset")
    finally:
        client.call(broker.reset_quota, "bob", admin)
        client.call(broker.reset_quota, "alice", admin)


def test_add_works_the_moment_the_page_has_loaded_while_the_theme_setting_is_still_on_its_way(
        page, jupyter, broker, admin):
    """The page asks JupyterLab for its theme first; on a busy Hub that answer came after a quick
    admin's click on Add, and the click did nothing (CI once: the banner stayed empty). Here the
    theme request is held until Add has been clicked and the quota saved."""
    held = []
    page.route("**/api/settings/**", lambda route: held.append(route))  # not answered: on its way
    try:
        page.goto(jupyter.admin_page())
        page.locator("#gs-add-user").fill("erin")
        page.locator("#gs-add-max-gpus").fill("3")
        page.locator("#gs-add").click()
        expect(page.locator("#gs-banner")).to_have_text("Saved the quota of erin.")
        assert len(held) == 1  # the theme had not come yet when the save was made
        assert client.call(broker.quota, "erin", admin)["max_gpus"] == 3
        held[0].continue_()
        expect(quota_row(page, "erin").get_by_label("max GPUs of erin")).to_have_value("3")
    finally:
        client.call(broker.reset_quota, "erin", admin)


def test_at_700_px_the_tables_scroll_inside_their_box_and_the_page_does_not(browser, jupyter, broker, admin):
    client.call(broker.set_quota, "a-user-with-a-rather-long-name", {"max_gpus": 1}, admin)
    context = browser.new_context(color_scheme="light", viewport={"width": 700, "height": 900})
    narrow = context.new_page()
    try:
        narrow.goto(jupyter.admin_page())
        quota_row(narrow, "a-user-with-a-rather-long-name").wait_for()
        assert narrow.evaluate("document.documentElement.scrollWidth") <= 700
        box = narrow.locator("#gs-quotas").locator("xpath=..")
        assert box.evaluate("b => b.scrollWidth > b.clientWidth && getComputedStyle(b).overflowX === 'auto'")
        screenshot(narrow, "admin-700px")
    finally:
        context.close()
        client.call(broker.reset_quota, "a-user-with-a-rather-long-name", admin)


def test_the_usage_total_and_the_quota_table_come_from_the_same_refresh(page, jupyter, hold):
    hold("dora", gpus=1).release()
    page.goto(jupyter.admin_page())
    quota_row(page, "dora").wait_for()
    expect(page.locator("#gs-usage-total")).to_contain_text("in the last 7 days")
    calls = page.evaluate("""() => new Promise((resolve) => {
        const seen = [];
        const observer = new PerformanceObserver((list) => {
            for (const entry of list.getEntries()) seen.push(entry.name);
            if (seen.some((n) => n.includes('/usage')) && seen.some((n) => n.includes('/quotas'))) resolve(seen);
        });
        observer.observe({ type: 'resource', buffered: false });
    })""")
    refresh = [name.split("/gpusession/api")[1].split("?")[0] for name in calls]
    assert "/usage" in refresh and "/quotas" in refresh  # one refresh fetches both, every 3 s
