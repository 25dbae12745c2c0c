"""When the static figures cannot be exported, the warning says why and what to install: kaleido (plotly's
image exporter) run for real with no browser it can find, never an empty reason."""
from __future__ import annotations

import os

from helpers.campaign_files import write_campaign
from helpers.processes import running

from qkvsearch.search.cli import main
from qkvsearch.spaces.errors import reason


def test_report_without_a_browser_says_which_executable_is_missing(tmp_path, capsys, monkeypatch):
    exp = tmp_path / "exp"
    write_campaign(exp, ["completed", "completed", "failed"])
    # BROWSER_PATH overrides kaleido's search (PATH, /usr/bin): a path with no browser is one it cannot find
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chromium-here"))
    assert main(["report", str(exp), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if "static png/svg figures skipped" in x]
    assert "found no Chromium or Chrome executable" in line and "apt-get install chromium" in line, line
    assert "no-chromium-here" in line and "RuntimeError: )" not in line, line
    written = sorted(os.listdir(tmp_path / "out"))
    assert "pareto.html" in written and not [n for n in written if n.endswith((".png", ".svg"))]


def test_a_reason_is_never_empty():
    assert reason(RuntimeError()) == "RuntimeError()"
    assert reason(RuntimeError("\n\n  Kaleido requires Chrome.\nmore")) == "RuntimeError: Kaleido requires Chrome."
    try:
        try:
            raise FileNotFoundError(2, "No such file or directory", "/x")
        except OSError:
            raise RuntimeError("\n") from None
    except RuntimeError as exc:
        assert reason(exc) == repr(exc)  # "from None": nothing else to say
    try:
        try:
            raise KeyError("width")
        except KeyError as inner:
            raise ValueError() from inner
    except ValueError as exc:
        assert reason(exc) == "ValueError, from KeyError: 'width'"


def test_a_browser_that_never_answers_is_stopped_and_the_report_goes_on(tmp_path, caplog, monkeypatch):
    """kaleido waits on its browser without a time limit: the export's child is stopped after its own limit,
    with the browser it started, and the report is written without the static figures, saying why."""
    import logging
    import time

    from qkvsearch.search.analysis import static_export
    from qkvsearch.search.analysis.report import build_report

    exp = tmp_path / "exp"
    write_campaign(exp, ["completed", "completed"])
    pid_file = tmp_path / "browser.pid"
    browser = tmp_path / "mute-chromium"
    browser.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")  # started, then silent
    browser.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(browser))
    monkeypatch.setattr(static_export, "EXPORT_TIMEOUT_S", 5)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="qkvsearch.search.analysis.report"):
        paths = build_report(exp, out_dir=tmp_path / "out", static=True)
    assert time.monotonic() - started < 120  # bounded by the limit, not by the browser
    assert "pareto_html" in paths or (tmp_path / "out" / "pareto.html").exists()
    assert not [p for p in paths if p.endswith(("_png", "_svg"))]
    assert "did not finish within 5 s" in caplog.text, caplog.text
    started_browser = pid_file.read_text().strip() if pid_file.exists() else ""
    if started_browser:  # the browser was started: the export returned only once it had ended with the child
        assert not running(int(started_browser))


def test_no_static_skips_the_image_exporter_without_a_warning(tmp_path, capsys, monkeypatch):
    exp = tmp_path / "exp"
    write_campaign(exp, ["completed", "completed"])
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chromium-here"))  # it would warn, were it run
    assert main(["report", str(exp), "--out", str(tmp_path / "out"), "--no-static"]) == 0
    assert "static png/svg figures skipped" not in capsys.readouterr().err
    written = sorted(os.listdir(tmp_path / "out"))
    assert "pareto.html" in written and not [n for n in written if n.endswith((".png", ".svg"))]
