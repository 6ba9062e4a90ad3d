"""The admin page in a real headless Chromium: capacity, leases, quotas and the usage chart;
an admin edits a quota and revokes a running lease; HTML in a user name stays text."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from gpusession.broker import client
from gpusession.identity import Identity
from gpusession.lease import Lease
from gpusession.options import validate_run_options

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
        page, browser, jupyter, hold, broker, admin):
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
        assert "logical" in page.locator("#gs-cards").inner_text()
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
