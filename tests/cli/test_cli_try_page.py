"""The try-it page of ``run-local-server``, driven in a real headless Chromium (Debian's, with
its chromedriver, through selenium): JSON, an image, a multipart form and a binary answer, with
screenshots checked by looking at their pixels."""

from __future__ import annotations

import http.client
import io
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import SAMPLES, CliProcess

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WAIT = 30.0

Start = Callable[..., CliProcess]


@pytest.fixture
def browser() -> Iterator[Any]:
    if not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()):
        pytest.skip("Chromium and chromedriver are not installed (apt-get install chromium "
                    "chromium-driver)")  # fmt: skip
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1000,900"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT)
    yield driver
    driver.quit()


def page_of(start_abeja: Start, folder: Path, handler: str = "main:handler") -> str:
    cli = start_abeja("model", "run-local-server", "--engine", "local", "-h", handler, cwd=folder)
    line = cli.wait_for(r" Try it :   http://127\.0\.0\.1:\d+/", stream="stdout")
    return line.split("Try it :", 1)[1].split()[0]


def send_and_wait(driver: Any) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.find_element(By.ID, "send").click()
    WebDriverWait(driver, WAIT).until(
        lambda d: (
            d.find_element(By.ID, "status").text and d.find_element(By.ID, "send").is_enabled()
        )
    )
    return str(driver.find_element(By.ID, "status").text)


def assert_rendered(driver: Any, path: Path) -> None:
    """The screenshot shows a page: not blank, with the page's blue Send button in it."""
    from PIL import Image

    png = driver.get_screenshot_as_png()
    path.write_bytes(png)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    colors = image.getcolors(maxcolors=1 << 20) or []
    assert len(colors) > 50, f"{path}: the screenshot looks blank"
    blue = sum(n for n, (r, g, b) in colors if (r, g, b) == (0x1F, 0x6F, 0xEB))
    assert blue > 200, f"{path}: the Send button is not visible"


def copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(SAMPLES / name, tmp_path / name))


def test_json_request_and_pretty_answer(browser: Any, start_abeja: Start, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.get(page_of(start_abeja, copy("tax", tmp_path)))
    body = browser.find_element(By.ID, "json")
    assert "total_without_tax" in body.get_attribute("value")  # the project's request.json
    assert send_and_wait(browser) == "200 OK"
    answer = browser.find_element(By.ID, "answer-text").text
    assert answer == '{\n  "total": 108\n}'  # pretty-printed
    assert browser.find_element(By.ID, "elapsed").text.endswith(" ms")
    assert_rendered(browser, tmp_path / "json.png")

    body.clear()
    body.send_keys("{}")
    assert send_and_wait(browser) == "400 Bad Request"
    assert "total_without_tax is need" in browser.find_element(By.ID, "answer-text").text


def test_an_image_file_and_an_image_answer(
    browser: Any, start_abeja: Start, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    folder = copy("image_flip", tmp_path)
    browser.get(page_of(start_abeja, folder))
    browser.find_element(By.CSS_SELECTOR, "input[name=kind][value=file]").click()
    browser.find_element(By.ID, "file").send_keys(str(folder / "cat.jpg"))
    assert send_and_wait(browser) == "200 OK"
    image = browser.find_element(By.ID, "answer-image")
    width = browser.execute_script("return arguments[0].naturalWidth", image)
    assert width > 0, "the answer image did not load"
    assert_rendered(browser, tmp_path / "image.png")


def test_a_multipart_form(browser: Any, start_abeja: Start, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    folder = copy("multipart_form", tmp_path)
    browser.get(page_of(start_abeja, folder))
    browser.find_element(By.CSS_SELECTOR, "input[name=kind][value=form]").click()
    first = browser.find_element(By.CSS_SELECTOR, "#fields .row")
    first.find_element(By.CLASS_NAME, "field-name").send_keys("title")
    first.find_element(By.CLASS_NAME, "field-value").send_keys("Q3")
    browser.find_element(By.ID, "add-file").click()
    second = browser.find_elements(By.CSS_SELECTOR, "#fields .row")[1]
    second.find_element(By.CLASS_NAME, "field-name").send_keys("document")
    second.find_element(By.CLASS_NAME, "field-value").send_keys(str(folder / "report.txt"))
    assert send_and_wait(browser) == "200 OK"
    answer = browser.find_element(By.ID, "answer-text").text
    assert '"title": "Q3"' in answer and '"file_name": "report.txt"' in answer


def test_other_answers_are_a_download(browser: Any, start_abeja: Start, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    folder = Path(shutil.copytree(Path(__file__).parent / "projects" / "responder",
                                  tmp_path / "responder"))  # fmt: skip
    browser.get(page_of(start_abeja, folder, "main:echo"))
    browser.find_element(By.CSS_SELECTOR, "input[name=kind][value=text]").click()
    kind = browser.find_element(By.ID, "text-type")
    kind.clear()
    kind.send_keys("application/octet-stream")
    browser.find_element(By.ID, "text").send_keys("raw bytes")
    assert send_and_wait(browser) == "200 OK"
    link = browser.find_element(By.ID, "answer-download")
    assert link.text == "download the answer (9 bytes, application/octet-stream)"


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({}, True),  # curl, the page's own GET
        ({"Origin": "{page}"}, True),
        ({"Origin": "{page}", "Sec-Fetch-Site": "same-origin"}, True),
        ({"Host": "evil.example:{port}"}, False),  # DNS rebinding
        ({"Origin": "http://evil.example"}, False),  # a form or fetch of another site
        ({"Sec-Fetch-Site": "cross-site"}, False),
        ({"Origin": "null"}, False),
    ],
    ids=lambda value: "" if isinstance(value, bool) else "+".join(value) or "plain",
)
def test_only_the_page_itself_may_drive_the_model(
    start_abeja: Start, tmp_path: Path, headers: dict[str, str], allowed: bool
) -> None:
    url = page_of(start_abeja, copy("tax", tmp_path))
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    sent = {k: v.format(page=url.rstrip("/"), port=port) for k, v in headers.items()}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = b'{"total_without_tax": 100}'
        json_type = {"Content-Type": "application/json"}
        connection.request("POST", "/model/", body=body, headers={**json_type, **sent})
        answer = connection.getresponse()
        body = answer.read()
    finally:
        connection.close()
    if allowed:
        assert (answer.status, body) == (200, b'{"total": 108.0}')
    else:
        assert answer.status == 403, body
        assert body.startswith(b"forbidden: the try-it page serves only itself"), body
