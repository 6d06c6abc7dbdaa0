"""The web UI (issue 65) in a real browser: Debian's Chromium, driven by Selenium through
Debian's chromedriver, against a live pool. A real munged, redis-server, two pool agents,
Unix users the tests create (alice and bob submit; apisvc is the API service's account), and
`nodeagent api` as apisvc on HTTPS with a self-signed certificate.

alice signs in with the link `nodeagentctl ui` prints, sees her job listed, follows rank 0's
log, watches a killed worker's recovery appear on the job's timeline split into its phases,
reads where the time went from the goodput chart (its parts add up to the wall time shown),
and cancels the job from the page. bob, signed in, sees her job with no cancel button, and
the pool refuses his cancel; a POST forged without the page's CSRF header, or from another
site, is refused. Screenshots of every page are kept under the test's temporary directory."""

from __future__ import annotations

import os
import signal
import ssl
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from nodeagent.client import ApiError, Client
from tests.helpers.api import ApiService, api_beside, token_key, token_pool
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.gpus import gpu
from tests.helpers.munge import MungeDaemon
from tests.helpers.pool import PoolCluster
from tests.helpers.users import User, reachable_dir, unix_users

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("ui")]
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
STEPPER = """\
import os, time
from nodeagent.worker.progress import beat
print("rank", os.environ["RANK"], "generation", os.environ["NODEAGENT_GENERATION"], flush=True)
step = 0
while True:
    step += 1
    beat(step)
    print("step", step, flush=True)
    time.sleep(0.2)
"""


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users("alice", "bob", "apisvc") as made:
        yield made


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    with reachable_dir("na-ui-") as path:
        (path / "stepper.py").write_text(STEPPER)
        (path / "stepper.py").chmod(0o644)
        yield path


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisServer, shared: Path, munged: MungeDaemon, users: dict[str, User]
) -> Iterator[PoolCluster]:
    key = token_key(shared / "token.key")
    fake = shared / "gpus.yaml"  # two fake GPUs a node: the nodes and queues pages count them
    fake.write_text(yaml.safe_dump({"gpus": [gpu(0), gpu(1)]}))
    health = {"health": {"gpu": "on", "interval": "100ms", "fake_gpus": str(fake)}}
    with token_pool(redis_server.url, shared, munged.socket, users, key, "ui", health) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def api(
    pool: PoolCluster, shared: Path, munged: MungeDaemon, users: dict[str, User]
) -> Iterator[ApiService]:
    with api_beside(pool, shared, munged.socket, users["apisvc"]) as service:
        yield service


@pytest.fixture(scope="module")
def browser(api: ApiService, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        pytest.skip("Debian's chromium and chromium-driver are not installed (.ci/setup does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium')}")
    options.accept_insecure_certs = True  # the tests' self-signed certificate
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@contextmanager
def stepping(api: ApiService, token: str, shared: Path, name: str, nodes: str) -> Iterator[str]:
    """A job of stepper.py submitted with `token`, cancelled on the way out (whatever the test
    did), so that the next test finds the pool's nodes free."""
    with Client(api.url, token=token, verify=str(api.certificate.cert)) as client:
        job = client.submit(
            [sys.executable, str(shared / "stepper.py")], name=name, nodes=nodes,
            workdir=str(shared),
        )  # fmt: skip
        try:
            yield job
        finally:
            with suppress(ApiError):
                client.cancel(job)


def ctl(pool: PoolCluster, munged: MungeDaemon, user: User, *args: str) -> str:
    where = ["--redis", pool.redis_url, "--pool", pool.pool, "--munge-socket", munged.socket]
    done = user.nodeagentctl(*where, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def sign_in(browser: Any, link: str, user: str) -> None:
    browser.delete_all_cookies()
    browser.get(link)
    shown(browser, lambda: _text(browser, "who").startswith(user), 30, f"{user} signed in")
    assert "#" not in browser.current_url.partition("#/")[0]  # the token left the address


def shown(browser: Any, probe: Any, timeout: float, what: str) -> Any:
    """wait_for, saying on a timeout what the page showed and what its console said."""
    try:
        return wait_for(probe, timeout, what)
    except AssertionError as exc:
        page = browser.find_elements(By.TAG_NAME, "main")
        console = [e["message"] for e in browser.get_log("browser")]
        raise AssertionError(
            f"{exc}\nat {browser.current_url}:\n{page[0].text[:3000] if page else ''}\n"
            f"console: {console[-20:]}"
        ) from None


def _text(browser: Any, element_id: str) -> str:
    """The element's text now ("" if absent, or replaced as it was read: the pages draw
    themselves again every second or two)."""
    try:
        found = browser.find_elements(By.ID, element_id)
        return str(found[0].text) if found else ""
    except StaleElementReferenceException:
        return ""


def _click(browser: Any, css: str) -> bool:
    """Click the element, if it is there and not replaced meanwhile (then: False, try again)."""
    try:
        found = browser.find_elements(By.CSS_SELECTOR, css)
        if found:
            found[0].click()
        return bool(found)
    except StaleElementReferenceException:
        return False


def _counts(browser: Any, css: str, count: int) -> Any:
    """A probe: does the page show `count` elements matching `css`?"""
    return lambda: len(browser.find_elements(By.CSS_SELECTOR, css)) == count


def _csp_violations(browser: Any) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if "Content Security" in e["message"]]


def _worker_pid(api: ApiService, token: str, job: str, rank: int) -> int | None:
    with Client(api.url, token=token, verify=str(api.certificate.cert)) as client:
        for node in client.status(job)["nodes"]:
            for worker in node["workers"]:
                if worker["rank"] == rank and worker["pid"] and worker["state"] == "running":
                    return int(worker["pid"])
    return None


def test_alice_signs_in_watches_her_job_recover_and_cancels_it_from_the_page(
    pool: PoolCluster,
    api: ApiService,
    munged: MungeDaemon,
    users: dict[str, User],
    shared: Path,
    browser: Any,
    tmp_path: Path,
) -> None:
    alice = users["alice"]
    link = ctl(pool, munged, alice, "ui", "--url", api.url, "--lifetime", "20m")
    assert link.startswith(f"{api.url}/ui/signin#") and "nat1." not in link  # no token in it
    sign_in(browser, link, alice.name)

    token = ctl(pool, munged, alice, "token", "--lifetime", "20m")
    submitted = time.monotonic()
    with stepping(api, token, shared, "ui-watched", "2:2") as job:
        watched(browser, api, token, job, alice.name, submitted, tmp_path)
    assert _csp_violations(browser) == []


def watched(
    browser: Any,
    api: ApiService,
    token: str,
    job: str,
    user_name: str,
    submitted: float,
    tmp_path: Path,
) -> None:
    """alice's page from the listing to the cancel."""
    row = f'tr[data-job="{job}"]'
    shown(browser, lambda: browser.find_elements(By.CSS_SELECTOR, row), 30, "the job listed")
    listed_s = time.monotonic() - submitted
    browser.save_screenshot(str(tmp_path / "jobs.png"))
    user = browser.find_element(By.NAME, "user")
    user.send_keys("nobody-at-all")
    shown(browser, lambda: "No jobs." in _text(browser, "jobs"), 30, "no job of nobody")
    user.clear()
    user.send_keys(user_name)
    shown(browser, lambda: browser.find_elements(By.CSS_SELECTOR, row), 30, "her job filtered")

    shown(browser, lambda: _click(browser, f"{row} a"), 30, "the job's link clicked")
    shown(browser, lambda: "step " in _text(browser, "log-lines"), 90, "rank 0's log followed")
    seen = _text(browser, "log-lines").count("step ")
    shown(browser, lambda: _text(browser, "log-lines").count("step ") > seen + 3, 30, "new lines")
    shown(browser, lambda: _click(browser, "#take-stacks"), 30, "the stacks button clicked")
    taken = lambda: _text(browser, "stacks-out").count("stepper.py") >= 2  # noqa: E731
    shown(browser, taken, 60, "both ranks' stacks")
    stacks = _text(browser, "stacks-out")
    assert "=== rank 0 on " in stacks and "=== rank 1 on " in stacks, stacks

    pid = wait_for(lambda: _worker_pid(api, token, job, 1), 30, "rank 1's pid")
    os.kill(pid, signal.SIGKILL)
    recovery = '#recoveries tr[data-reason="worker_failed"]'
    shown(
        browser, lambda: browser.find_elements(By.CSS_SELECTOR, recovery), 90, "the recovery shown"
    )
    shown(
        browser,
        lambda: _phases(browser, recovery).get("start-up", 0) > 0,
        60,
        "its first step after",
    )
    phases = _phases(browser, recovery)
    assert set(phases) == {"detect", "stop", "rendezvous", "start-up"}
    assert all(v >= 0 for v in phases.values()) and sum(phases.values()) > 0, phases
    assert browser.find_elements(By.CSS_SELECTOR, "#timeline .fault")

    wall, parts = browser.execute_script(
        "const c = Chart.getChart('goodput-chart');"
        "return [Number(document.getElementById('goodput-said').dataset.wall),"
        " c.data.datasets.map(d => d.data[0])];"
    )
    assert len(parts) >= 3 and sum(parts) == pytest.approx(wall, abs=0.002 * len(parts)), parts
    browser.save_screenshot(str(tmp_path / "job.png"))

    # A change without the page's CSRF header, and a form posted from another site: refused.
    forged = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        f"fetch('/v1/jobs/{job}/cancel', {{method: 'POST', credentials: 'same-origin'}})"
        ".then(r => done(r.status));"
    )
    assert forged == 403
    _post_from_another_site(browser, f"{api.url}/v1/jobs/{job}/cancel")
    assert "401" in browser.page_source or "403" in browser.page_source
    browser.back()
    browser.back()

    # The job holds both nodes whole: its queue is charged their four GPUs, and each node shows
    # both of its GPUs held, the one its worker uses and the other (issue 81: it showed 1/2).
    held = {
        "nodes": ('tr[data-node] td[data-gpus="2"][data-held="2"]', 2),
        "queues": ('tr[data-queue="default"] td[data-gpus="4"]', 1),
    }
    for page, (cells, count) in held.items():
        browser.get(f"{api.url}/ui/#/{page}")
        shown(browser, _counts(browser, cells, count), 30, f"the {page} page counting its GPUs")
        browser.save_screenshot(str(tmp_path / f"{page}.png"))
    browser.get(f"{api.url}/ui/#/jobs/{job}")
    shown(browser, lambda: "running" in _text(browser, "job-head"), 30, "the job's page")
    assert browser.find_elements(By.ID, "cancel")  # the forged requests changed nothing
    shown(browser, lambda: _click(browser, "#cancel"), 30, "the cancel button clicked")
    shown(browser, lambda: "cancelled" in _text(browser, "job-head"), 60, "the job cancelled")
    print(f"listed {listed_s:.2f} s after its submission; screenshots in {tmp_path}")


def test_bob_sees_alices_job_without_its_actions_and_the_pool_refuses_his_cancel(
    pool: PoolCluster,
    api: ApiService,
    munged: MungeDaemon,
    users: dict[str, User],
    shared: Path,
    browser: Any,
) -> None:
    alice, bob = users["alice"], users["bob"]
    token = ctl(pool, munged, alice, "token", "--lifetime", "10m")
    trust = str(api.certificate.cert)
    with (
        stepping(api, token, shared, "ui-not-bobs", "1:2") as job,
        Client(api.url, token=token, verify=trust) as client,
    ):
        link = ctl(pool, munged, bob, "ui", "--url", api.url, "--lifetime", "10m")
        sign_in(browser, link, bob.name)
        browser.get(f"{api.url}/ui/#/jobs/{job}")
        shown(browser, lambda: alice.name in _text(browser, "job-facts"), 30, "alice's job shown")
        shown(browser, lambda: "running" in _text(browser, "job-head"), 60, "it runs")
        assert browser.find_elements(By.ID, "cancel") == []
        said = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch('/v1/session').then(r => r.json()).then(s =>"
            f" fetch('/v1/jobs/{job}/cancel', {{method: 'POST',"
            "  headers: {'x-nodeagent-csrf': s.csrf}}))"
            ".then(r => r.json().then(p => done([r.status, p.detail])));"
        )
        assert said[0] == 403 and "may not" in said[1], said
        assert client.show(job)["state"] == "running"
        # alice's log is not bob's to read: the page says so once and stops asking
        shown(browser, lambda: "not allowed" in _text(browser, "log-said"), 30, "not allowed")
        assert "it answered 403" in _text(browser, "log-said")
        browser.execute_script(  # every change of the line from now on
            "window.said = []; const line = document.getElementById('log-said');"
            "new MutationObserver(() => window.said.push(line.textContent))"
            ".observe(line, {childList: true, characterData: true, subtree: true});"
        )
        time.sleep(3)  # longer than a retry's 2 s
        assert browser.execute_script("return window.said") == []  # no retry came
        # nor are its stacks
        shown(browser, lambda: _click(browser, "#take-stacks"), 30, "the stacks button clicked")
        shown(browser, lambda: "Not taken" in _text(browser, "stacks-said"), 30, "stacks refused")
        assert "another user's" in _text(browser, "stacks-said")
        assert _text(browser, "stacks-out") == ""


def test_a_link_signs_in_once_carries_no_token_and_signing_out_revokes_the_session(
    pool: PoolCluster, api: ApiService, munged: MungeDaemon, users: dict[str, User]
) -> None:
    """The link's code is redeemed once, by the API service, for a token the link never held;
    a page of another site can neither redeem it nor swap a signed-in browser's user."""
    alice = users["alice"]
    code = ctl(pool, munged, alice, "ui", "--url", api.url, "--lifetime", "10m").partition("#")[2]
    origin = {"origin": api.url}
    trust = ssl.create_default_context(cafile=str(api.certificate.cert))
    with httpx.Client(base_url=api.url, verify=trust) as http:
        elsewhere = http.post(
            "/v1/session", json={"code": code}, headers={"origin": "https://evil.example"}
        )
        assert elsewhere.status_code == 403
        as_bearer = http.get("/v1/jobs", headers={"authorization": f"Bearer {code}"})
        assert as_bearer.status_code == 401  # a code is no token
        first = http.post("/v1/session", json={"code": code}, headers=origin)
        assert first.status_code == 200, first.text
        token = first.cookies.get("__Host-nodeagent-session")
        assert token is not None and token.startswith("nat1.") and code not in token
        assert "httponly" in first.headers["set-cookie"].lower()
        assert "samesite=strict" in first.headers["set-cookie"].lower()
        other = ctl(pool, munged, users["bob"], "ui", "--url", api.url, "--lifetime", "10m")
        swapped = http.post("/v1/session", json={"code": other.partition("#")[2]}, headers=origin)
        assert swapped.status_code == 409 and "signed in as" in swapped.json()["detail"]
        session = http.get("/v1/session").json()
        assert session["user"] == alice.name and len(session["csrf"]) == 64
        out = http.delete("/v1/session", headers={**origin, "x-nodeagent-csrf": session["csrf"]})
        assert out.status_code == 200, out.text
        http.cookies.clear()
        again = http.post("/v1/session", json={"code": code}, headers=origin)
        assert again.status_code == 401 and "works once" in again.json()["detail"]
        gone = http.get("/v1/jobs", headers={"authorization": f"Bearer {token}"})
        assert gone.status_code == 401  # revoked in the pool at sign-out


def _phases(browser: Any, row: str) -> dict[str, float]:
    try:
        cells = browser.find_elements(By.CSS_SELECTOR, f"{row} td[data-phase]")
        said = {c.get_attribute("data-phase"): c.text for c in cells}
        # the start-up of a recovery under way reads "in progress" until it is measured
        return {k: _seconds(v) for k, v in said.items() if v != "in progress"}
    except StaleElementReferenceException:
        return {}


def _seconds(text: str) -> float:
    value, _, unit = text.partition(" ")
    if value in ("\u2013", ""):
        return 0.0
    return float(value) / 1000 if unit == "ms" else float(value) * (60 if unit == "min" else 1)


def _post_from_another_site(browser: Any, action: str) -> None:
    """A form on another origin (a data: page) that posts to the API, as a hostile tab would."""
    page = (
        "data:text/html,<form id=f method=post action='" + action + "'></form>"
        "<script>document.getElementById('f').submit()</script>"
    )
    browser.get(page)
    shown(browser, lambda: browser.current_url.startswith(action), 30, "the forged form posted")
