"""When the static figures cannot be exported, the warning says why and what to install: kaleido (plotly's
image exporter) run for real with no browser it can find, never an empty reason."""
from __future__ import annotations

import os

from helpers.campaign_files import write_campaign

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
