"""Every command README.md and docs/*.md show runs, and prints what the page says it prints.

The runner is ``tests/docs_check.py`` (also a script: ``.venv/bin/python tests/docs_check.py``).
A block that cannot run here carries a skip marker with its reason; the checker itself is tested
first, on small documents, including ones that must fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_check import ROOT, DocsCheckError, match_output, parse_document, run_document

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_match_output_wildcards_and_order() -> None:
    out = "a 1\nnoise\nb two three\nc\n"
    assert match_output(["a ...", "b ... three"], out) == []
    assert match_output(["b ...", "a ..."], out) == ["a ..."], "documented lines keep their order"
    assert match_output(["d"], out) == ["d"]
    assert match_output(["a 1."], out) == ["a 1."], "a dot is a dot, only ... is a wildcard"


def test_a_page_whose_output_lies_fails_and_a_skip_needs_its_marker(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```console\n$ echo hello\nhello\n$ echo bye\nwelcome\n$ sh -c 'exit 3'\n(exit 3)\n```\n\n"
        "<!-- docs-check: skip needs a GPU -->\n```sh\nfalse\n```\n\n```sh\nfalse   # a comment\n```\n"
    )
    blocks = parse_document(page)
    assert [b.skip for b in blocks] == [None, "needs a GPU", None]
    results = run_document(blocks, timeout_s=60)
    verdict = [(r.command.text, r.skipped, r.problems) for r in results]
    assert verdict == [
        ("echo hello", None, []),
        ("echo bye", None, ["output lacks: welcome"]),
        ("sh -c 'exit 3'", None, []),
        ("false", "needs a GPU", []),
        ("false", None, ["exit 1, documented 0"]),
    ]


def test_background_jobs_live_across_blocks_and_are_stopped(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    flag = tmp_path / "flag"
    page.write_text(f"```sh\nsleep 300 &\n```\n\n```console\n$ jobs | wc -l\n1\n$ kill %1 && touch {flag}\n```\n")
    results = run_document(parse_document(page), timeout_s=60)
    assert [r.problems for r in results] == [[], [], []]
    assert flag.exists()


def test_an_unclosed_fence_is_an_error(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```sh\necho never closed\n")
    with pytest.raises(DocsCheckError, match="never closed"):
        parse_document(page)


@pytest.mark.timeout(1200)  # README runs make demo, the placement bench and icl sim (minutes on a busy machine)
@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_the_documented_commands_do_what_the_page_says(doc: Path) -> None:
    results = run_document(parse_document(doc))
    failures = [
        f"{doc.name}:{r.command.line}: {r.command.text.splitlines()[0]}: {'; '.join(r.problems)}\n"
        + "\n".join(r.output.splitlines()[-10:])
        for r in results
        if r.problems
    ]
    assert not failures, "\n\n".join(failures)
    for r in results:
        if r.skipped is not None:
            assert r.skipped.strip(), f"{doc.name}:{r.command.line}: a skip needs a reason"
