"""docs/benchmarks.md opens with one table of current figures: every line names its setting, figure, device,
date and command and links to a section of the lab notebook below it that exists."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
COLUMNS = ["setting", "figure", "device", "date", "command", "section"]


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def current_table(text: str) -> list[list[str]]:
    """The rows of the first table after the "## Current figures" heading (header first)."""
    part = text.split("\n## Current figures\n", 1)
    assert len(part) == 2, "docs/benchmarks.md: no '## Current figures' section"
    before, after = part
    assert before.count("\n## ") == 0, "the current figures must come before the lab notebook's sections"
    rows, started = [], False
    for line in after.splitlines():
        if line.startswith("|"):
            started = True
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        elif started:
            break
    return rows


def test_current_figures_table_opens_the_page_and_links_to_existing_sections():
    text = DOC.read_text()
    rows = current_table(text)
    assert rows[0] == COLUMNS
    anchors = {anchor(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}
    body = rows[2:]
    assert len(body) >= 15
    for row in body:
        assert len(row) == len(COLUMNS), row
        setting, figure, device, date, command, section = row
        assert setting and figure and device, row
        assert re.fullmatch(r"20\d\d-\d\d-\d\d", date), row
        assert "`" in command or command.startswith("the "), row
        link = re.fullmatch(r"\[[^\]]+\]\(#([^)]+)\)", section)
        assert link, row
        assert link.group(1) in anchors, f"{setting}: no section #{link.group(1)} in docs/benchmarks.md"
