"""``memorm demo`` run twice on one database: what the second run prints makes sense."""

from __future__ import annotations

import re

import pytest

from memorm.cli import main
from memorm.demo import FACTS, QUERIES


def sections(output: str) -> dict[str, list[str]]:
    """The demo's output: each section's title (``── title ───``) and its non-blank lines."""
    found: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in output.splitlines():
        if line.startswith("── "):
            lines = found.setdefault(line.strip("─ "), [])
        elif line.strip():
            lines.append(line)
    return found


def section(output: str, title: str) -> list[str]:
    [lines] = [lines for name, lines in sections(output).items() if name.startswith(title)]
    return lines


@pytest.fixture
def second_run(plain_url: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["demo", "--url", plain_url]) == 0
    capsys.readouterr()
    assert main(["demo", "--url", plain_url]) == 0
    return capsys.readouterr().out


def test_second_run_labels_recall_hits_with_their_sessions_and_repeats_no_line(second_run: str) -> None:
    [header] = [name for name in sections(second_run) if name.startswith("full-text recall search")]
    assert "best 3 of 4" in header  # run 2's three cycling messages, and run 1's one left by its trim
    hits = section(second_run, "full-text recall search")
    assert len(set(hits)) == len(hits) == 3
    labelled = [re.match(r"  (demo run \d+) #(\d+) ", hit) for hit in hits]
    assert all(labelled), hits
    runs = {(match[1], int(match[2])) for match in labelled if match}
    assert {run for run, _ in runs} == {"demo run 1", "demo run 2"}
    assert {seq for run, seq in runs if run == "demo run 1"} == {8}  # the one its trim kept
    for name, lines in sections(second_run).items():
        assert len(lines) == len(set(lines)), name

    assert "session 'demo run 2'" in second_run
    assert "agent sam: sessions 2 · messages 6 · passages 4" in second_run  # facts stored once
    assert "agents in the database: 1" in second_run


def test_archival_queries_find_the_facts_sharing_their_words_first(second_run: str) -> None:
    lines = section(second_run, "archival similarity search")
    expected = {"cycling trip": FACTS[3], "favourite tea": FACTS[1]}
    assert set(QUERIES) == set(expected)
    for query, fact in expected.items():
        best = lines[lines.index(f"  query '{query}':") + 1]
        assert best.split(maxsplit=1)[1] == fact
    note = " ".join(line.strip() for line in lines)
    assert "HashingEmbedder, a stand-in for an embedding model" in note
    assert "no model download and no network" in note
