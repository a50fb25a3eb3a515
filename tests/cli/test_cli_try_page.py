"""The try-it page of ``run-local-server``, driven in a real headless Chromium (Debian's, with
its chromedriver, through selenium): JSON, an image, a multipart form and a binary answer, with
screenshots checked by looking at their pixels; the project's own request to start from, a
handler's error with its log lines, and the request as a curl line that is run for real."""

from __future__ import annotations

import http.client
import io
import json
import shutil
import socket
import subprocess
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import PROJECTS, SAMPLES, CliProcess, Result, assert_flipped, http_request

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


def serve(start_abeja: Start, folder: Path, handler: str = "main:handler") -> tuple[str, str]:
    """Start run-local-server on ``folder``: (the try-it page's URL, the model's endpoint)."""
    cli = start_abeja("model", "run-local-server", "--engine", "local", "-h", handler, cwd=folder)
    line = cli.wait_for(r" Try it :   http://127\.0\.0\.1:\d+/", stream="stdout")
    return line.split("Try it :", 1)[1].split()[0], cli.endpoint()


def page_of(start_abeja: Start, folder: Path, handler: str = "main:handler") -> str:
    return serve(start_abeja, folder, handler)[0]


def text_of(driver: Any, element_id: str) -> str:
    """The shown text of an element, trimmed as selenium's ``text`` is, or "" while there is none.
    It is read in one script, so an element that the page replaces while an answer streams in
    cannot go stale between being found and being read."""
    script = "const e = document.getElementById(arguments[0]); return e ? e.innerText.trim() : '';"
    return str(driver.execute_script(script, element_id))


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
    """The page opens on the README's form (two fields, a file); a field edited, one added."""
    from selenium.webdriver.common.by import By

    browser.get(page_of(start_abeja, copy("multipart_form", tmp_path)))
    wait_for_example(browser)
    assert kind_of(browser) == "form"
    assert shown_request(browser) == [
        ["title", "Q3"], ["author", "abeja"], ["document", "@report.txt"],
    ]  # fmt: skip
    title = browser.find_elements(By.CSS_SELECTOR, "#fields .field-value")[0]
    title.clear()
    title.send_keys("Q4")
    browser.find_element(By.ID, "add-field").click()
    added = browser.find_elements(By.CSS_SELECTOR, "#fields .row")[-1]
    added.find_element(By.CLASS_NAME, "field-name").send_keys("extra")
    added.find_element(By.CLASS_NAME, "field-value").send_keys("yes")
    assert send_and_wait(browser) == "200 OK"
    answer = answer_json(browser)
    assert answer["fields"] == {"title": "Q4", "author": "abeja", "extra": "yes"}
    assert [(f["form_name"], f["file_name"], f["size"]) for f in answer["files"]] == [
        ("document", "report.txt", (SAMPLES / "multipart_form" / "report.txt").stat().st_size)
    ]


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


# -- the project's own request, a handler's error, the curl line ------------------------


def wait_for_example(driver: Any) -> None:
    """Until the page has put the project's request in place (its files fetched)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT).until(
        lambda d: d.execute_script("return document.body.dataset.example") == "loaded"
    )


def kind_of(driver: Any) -> str:
    return str(
        driver.execute_script("return document.querySelector('input[name=kind]:checked').value")
    )


def shown_request(driver: Any) -> list[Any]:
    """What the page would send, by its kind: JSON text, [type, text], the chosen file as
    [name, type, size], or the form's rows as [name, value] (a file's value ``@`` its name)."""
    return list(
        driver.execute_script(
            """const $ = (id) => document.getElementById(id);
            const kind = document.querySelector('input[name=kind]:checked').value;
            if (kind === 'json') return [$('json').value];
            if (kind === 'text') return [$('text-type').value, $('text').value];
            if (kind === 'file') {
              const f = $('file').files[0];
              return f ? [f.name, f.type, f.size] : [];
            }
            return [...document.querySelectorAll('#fields .row')].map((row) => {
              const value = row.querySelector('.field-value');
              return [row.querySelector('.field-name').value, value.type === 'file'
                ? (value.files.length ? '@' + value.files[0].name : '@') : value.value];
            });"""
        )
    )


def answer_json(driver: Any) -> Any:
    from selenium.webdriver.common.by import By

    return json.loads(driver.find_element(By.ID, "answer-text").text)


def init_project(abeja: Callable[..., Result], tmp_path: Path, template: str) -> Path:
    made = abeja("model", "init", template, "--template", template, cwd=tmp_path)
    assert made.returncode == 0, str(made)
    return tmp_path / template


def test_an_image_project_opens_on_its_request_image(
    browser: Any, abeja: Callable[..., Result], start_abeja: Start, tmp_path: Path
) -> None:
    """``abeja model init --template image``: the page opens on request.jpg, ready to send as
    a file (not on JSON ``{}``), and sending it as it opened shows the model's image."""
    from selenium.webdriver.common.by import By

    folder = init_project(abeja, tmp_path, "image")
    browser.get(page_of(start_abeja, folder))
    wait_for_example(browser)
    assert kind_of(browser) == "file"
    assert browser.find_element(By.ID, "kind-file").is_displayed()
    assert not browser.find_element(By.ID, "kind-json").is_displayed()
    size = (folder / "request.jpg").stat().st_size
    assert shown_request(browser) == ["request.jpg", "image/jpeg", size]
    assert send_and_wait(browser) == "200 OK"
    image = browser.find_element(By.ID, "answer-image")
    assert browser.execute_script("return arguments[0].naturalWidth", image) > 0
    assert_rendered(browser, tmp_path / "image-project.png")


#: What each template's page opens on: its kind, and what it shows (from the project folder).
OPENS_ON: dict[str, tuple[str, Callable[[Path], list[Any]]]] = {
    "multipart": ("form", lambda folder: [["title", "notes"], ["document", "@request.txt"]]),
    "csv": ("text", lambda folder: ["text/csv", (folder / "request.csv").read_text()]),
}


@pytest.mark.parametrize("template", sorted(OPENS_ON))
def test_a_project_opens_on_its_own_request(
    browser: Any,
    abeja: Callable[..., Result],
    start_abeja: Start,
    tmp_path: Path,
    template: str,
) -> None:
    """A template's page opens on its README's request, in its kind, answered 200 as it is."""
    folder = init_project(abeja, tmp_path, template)
    browser.get(page_of(start_abeja, folder))
    wait_for_example(browser)
    kind, shown = OPENS_ON[template]
    assert kind_of(browser) == kind
    assert shown_request(browser) == shown(folder)
    assert send_and_wait(browser) == "200 OK"


FAILING = """\
def handler(request, context):
    print("dividing by", request["content_type"])
    return {"ratio": 1 / 0}
"""


def test_a_handler_error_shows_its_log_lines(
    browser: Any, start_abeja: Start, tmp_path: Path
) -> None:
    """A 500 says that the handler failed and shows the log lines of that request, traceback
    included (the runtime's body says only ``unexpected error occurred``)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    (tmp_path / "main.py").write_text(FAILING)
    browser.get(page_of(start_abeja, tmp_path))
    for _ in range(2):  # the second answer shows its own lines, not the first one's as well
        assert send_and_wait(browser) == "500 Internal Server Error"
        WebDriverWait(browser, WAIT).until(lambda d: "division by zero" in text_of(d, "answer-log"))
    failure = browser.find_element(By.ID, "failure").text
    assert failure == (
        "The handler failed: its log for this request is below; the whole log is in the "
        "terminal where run-local-server runs."
    )
    log = browser.find_element(By.ID, "answer-log").text
    assert log.count("dividing by application/json") == 1, log
    assert "ERROR: unexpected error occurred in the handler main:handler" in log
    assert 'return {"ratio": 1 / 0}' in log and log.endswith("ZeroDivisionError: division by zero")
    assert_rendered(browser, tmp_path / "failure.png")


def curl_line(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.ID, "curl").text)


def run_curl(line: str, folder: Path) -> bytes:
    """The page's curl line, as a user pastes it into a shell in the project's folder."""
    done = subprocess.run(["bash", "-c", line], cwd=folder, capture_output=True, timeout=WAIT)
    assert done.returncode == 0, (line, done.stderr)
    return done.stdout


def test_the_request_as_a_curl_line(browser: Any, start_abeja: Start, tmp_path: Path) -> None:
    """The page's request as a curl line: the model's port, the header, the JSON inline."""
    folder = copy("tax", tmp_path)
    page, endpoint = serve(start_abeja, folder)
    browser.get(page)
    wait_for_example(browser)
    line = curl_line(browser)
    assert line == (
        f"curl -s {endpoint}/ -H 'Content-Type: application/json' "
        """--data-binary '{"total_without_tax":100}'"""
    )
    assert run_curl(line, folder) == b'{"total": 108.0}'


TRICKY = 'it\'s "quoted" $HOME `id` \\ back\\slash 日本語'


@pytest.mark.parametrize("kind", ["json", "text"])
def test_a_curl_line_quotes_what_a_shell_would_change(
    browser: Any, start_abeja: Start, tmp_path: Path, kind: str
) -> None:
    """Quotes, ``$``, backquotes and backslashes reach the model as typed (an echo handler)."""
    from selenium.webdriver.common.by import By

    folder = Path(shutil.copytree(PROJECTS / "responder", tmp_path / "responder"))
    page, endpoint = serve(start_abeja, folder, "main:echo")
    browser.get(page)
    wait_for_example(browser)
    browser.find_element(By.CSS_SELECTOR, f"input[name=kind][value={kind}]").click()
    body = browser.find_element(By.ID, kind)
    body.clear()
    if kind == "json":
        body.send_keys('{"note": ' + json.dumps(TRICKY, ensure_ascii=False) + ',\n "n": [1.0, 2]}')
        sent = ('{"note":' + json.dumps(TRICKY, ensure_ascii=False) + ',"n":[1.0,2]}').encode()
    else:
        body.send_keys(TRICKY + "\nsecond line")
        sent = (TRICKY + "\nsecond line").encode()
    line = curl_line(browser)
    assert line.startswith(f"curl -s {endpoint}/ -H "), line
    assert run_curl(line, folder) == sent
    assert send_and_wait(browser) == "200 OK"  # what the page sends, the line sends


@pytest.mark.parametrize(
    ("sample", "ending"),
    [
        ("image_flip", "-H 'Content-Type: image/jpeg' --data-binary @cat.jpg -o flipped_cat.jpg"),
        ("multipart_form", "-F title=Q3 -F author=abeja -F document=@report.txt"),
    ],
    ids=["file", "form"],
)
def test_a_curl_line_sends_files_by_name(
    browser: Any, start_abeja: Start, tmp_path: Path, sample: str, ending: str
) -> None:
    """A file (or a form's file) is ``@`` its name, for a shell in the project's folder."""
    folder = copy(sample, tmp_path)
    page, endpoint = serve(start_abeja, folder)
    browser.get(page)
    wait_for_example(browser)
    line = curl_line(browser)
    assert line == f"curl -s {endpoint}/ {ending}"
    answer = run_curl(line, folder)
    if sample == "image_flip":
        assert_flipped(folder / "cat.jpg", (folder / "flipped_cat.jpg").read_bytes())
    else:
        assert json.loads(answer)["fields"] == {"title": "Q3", "author": "abeja"}


def test_the_page_serves_the_files_of_its_request_only(start_abeja: Start, tmp_path: Path) -> None:
    """``/project-file/`` serves the files the project's request names, no other file."""
    folder = copy("image_flip", tmp_path)
    url = page_of(start_abeja, folder)
    for name, expected in (
        ("cat.jpg", (200, (folder / "cat.jpg").read_bytes())),
        ("main.py", (404, b"not found")),
        ("..%2Fimage_flip%2Fcat.jpg", (404, b"not found")),
    ):
        assert http_request(f"{url}project-file/{name}") == expected, name


def test_a_streamed_answer_shows_as_it_arrives(
    browser: Any, start_abeja: Start, tmp_path: Path
) -> None:
    """The handler's second line is produced only once the page shows the first (issue 29:
    the try-it page shows a streamed answer as it arrives, not once it is complete)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    folder = Path(shutil.copytree(PROJECTS / "responder", tmp_path / "responder"))
    release = tmp_path / "release"
    cli = start_abeja(
        "model", "run-local-server", "--engine", "local", "-h", "main:held_stream",
        "-e", f"RELEASE={release}", cwd=folder,
    )  # fmt: skip
    line = cli.wait_for(r" Try it :   http://127\.0\.0\.1:\d+/", stream="stdout")
    browser.get(line.split("Try it :", 1)[1].split()[0])
    browser.find_element(By.ID, "send").click()

    def shown(driver: Any) -> str:
        return text_of(driver, "answer-text")

    WebDriverWait(browser, WAIT).until(lambda d: "first" in shown(d))
    assert "second" not in shown(browser)
    assert not browser.find_element(By.ID, "send").is_enabled()  # the answer goes on
    release.touch()
    WebDriverWait(browser, WAIT).until(lambda d: "second" in shown(d))
    assert shown(browser) == "first\nsecond"
    WebDriverWait(browser, WAIT).until(lambda d: d.find_element(By.ID, "send").is_enabled())


# -- --try-port, and the answers' headers over HTTP -------------------------------------------


def head_counts(answer: http.client.HTTPResponse) -> dict[str, int]:
    """How many times ``Date`` and ``Server`` came in an answer's head."""
    return {name: len(answer.msg.get_all(name) or []) for name in ("Date", "Server")}


def test_the_page_listens_on_try_port_and_sends_each_header_once(
    start_abeja: Start, tmp_path: Path
) -> None:
    """``--try-port`` is where the page listens; its own answers, and the model's answers it
    passes on (whole or streamed), carry one ``Date`` and one ``Server`` each, the model's
    where they are the model's."""
    from abeja_runtime.launch import free_port

    try_port = free_port()
    folder = Path(shutil.copytree(PROJECTS / "responder", tmp_path / "responder"))
    release = tmp_path / "release"
    cli = start_abeja(
        "model", "run-local-server", "--engine", "local", "-h", "main:held_stream",
        "-e", f"RELEASE={release}", "--try-port", str(try_port), cwd=folder,
    )  # fmt: skip
    cli.wait_for(rf" Try it :   http://127\.0\.0\.1:{try_port}/ ", stream="stdout")
    endpoint = urllib.parse.urlsplit(cli.endpoint())
    model = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=WAIT)
    page = http.client.HTTPConnection("127.0.0.1", try_port, timeout=WAIT)
    try:
        page.request("GET", "/")
        own = page.getresponse()
        own.read()
        assert (own.status, head_counts(own)) == (200, {"Date": 1, "Server": 1})

        release.touch()  # the streamed answer goes to its end at once
        model.request("POST", "/", b"{}", {"Content-Type": "application/json"})
        direct = model.getresponse()
        assert direct.read() == b"first\nsecond\n"
        page.request("POST", "/model/", b"{}", {"Content-Type": "application/json"})
        passed = page.getresponse()
        assert passed.read() == b"first\nsecond\n"
        assert head_counts(passed) == {"Date": 1, "Server": 1}, passed.getheaders()
        assert passed.getheader("Server") == direct.getheader("Server")
    finally:
        page.close()
        model.close()


def test_a_whole_answer_passed_on_sends_each_header_once(
    start_abeja: Start, tmp_path: Path
) -> None:
    url = page_of(start_abeja, copy("tax", tmp_path))
    port = urllib.parse.urlsplit(url).port
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        body = b'{"total_without_tax": 100}'
        connection.request("POST", "/model/", body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        assert (answer.status, answer.read()) == (200, b'{"total": 108.0}')
    finally:
        connection.close()
    assert head_counts(answer) == {"Date": 1, "Server": 1}, answer.getheaders()


@pytest.mark.parametrize("taken", ["by another program", "by the model (-p)"])
def test_a_try_port_that_is_taken_is_refused_before_anything_starts(
    abeja: Callable[..., Result], tmp_path: Path, taken: str
) -> None:
    folder = copy("tax", tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        if taken == "by another program":
            args = ["--try-port", str(port)]
            said = (
                f"[error] port {port} on 127.0.0.1 is already in use; choose another for the "
                "try-it page with --try-port"
            )
        else:
            holder.close()
            args = ["-p", str(port), "--try-port", str(port)]
            said = (
                f"[error] --try-port {port} is the model's port too (-p); give the try-it page "
                "another"
            )
        result = abeja(
            "model", "run-local-server", "--engine", "local", "-h", "main:handler", *args,
            cwd=folder,
        )  # fmt: skip
    assert result.returncode == 2, str(result)
    assert result.error_lines() == [said], str(result)
