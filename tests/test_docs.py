"""The repository stands alone: every document it cites is in it, and every cited section exists.

Code, tests and docs cite the contract as `docs/semantics.md#rows-and-sequences` or
`docs/http-api.md#refusals-in-order`; a citation of a Markdown file the repository does not
hold, or of a heading a page does not have, leaves the reader with nothing to follow.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: A Markdown file named in text: `docs/semantics.md`, `README.md#install`, `../docs/x.md`.
MD_NAME = re.compile(r"(?<![\w/.-])([\w./-]*[\w-]+\.md)(?:#([\w-]+))?\b")
#: Paths and phrases that point at material outside the repository.
OUTSIDE = re.compile(r"/work/shared|shared/(spec|seeds)/|spec sheet|fact sheet", re.IGNORECASE)
SELF = "tests/test_docs.py"
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".json", ".yaml", ".yml", ".cfg", ".ini", ".sh", ""}


@cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return tuple(out.stdout.split())


def text_files() -> list[str]:
    """Every tracked text file but this one, whose examples name documents on purpose."""
    return [f for f in tracked() if Path(f).suffix in TEXT_SUFFIXES and (ROOT / f).is_file() and f != SELF]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(page: str) -> frozenset[str]:
    text = (ROOT / page).read_text(encoding="utf-8")
    return frozenset(slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.MULTILINE))


def cited(path: str):
    """(line number, cited name, anchor or None) for every Markdown file a tracked file names."""
    text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        for match in MD_NAME.finditer(line):
            yield number, match.group(1), match.group(2)


def resolve(path: str, name: str) -> str | None:
    """The tracked page `name` means when written in `path`: relative to the file, else to the root."""
    pages = {f for f in tracked() if f.endswith(".md")}
    for base in (ROOT / path).parent, ROOT:
        candidate = (base / name).resolve()
        if candidate.is_relative_to(ROOT) and str(candidate.relative_to(ROOT)) in pages:
            return str(candidate.relative_to(ROOT))
    by_name = [p for p in pages if Path(p).name == Path(name).name]
    return by_name[0] if len(by_name) == 1 else None


def test_every_cited_document_is_in_the_repository():
    names = {Path(f).name for f in tracked() if f.endswith(".md")}
    missing = [
        "%s:%d: %s" % (path, number, name)
        for path in text_files()
        for number, name, _ in cited(path)
        if Path(name).name not in names
    ]
    assert not missing, "citations of documents the repository does not hold:\n" + "\n".join(missing)


def test_every_cited_section_exists():
    broken = []
    for path in text_files():
        for number, name, anchor in cited(path):
            page = resolve(path, name)
            if anchor and page is not None and anchor not in anchors(page):
                broken.append("%s:%d: %s#%s" % (path, number, name, anchor))
    assert not broken, "citations of headings the page does not have:\n" + "\n".join(broken)


#: A file of the test suite named in text: `tests/export/test_export.py`, `tests/serve/test_x.py`.
TEST_FILE = re.compile(r"(?<![\w/.-])(tests/[\w/]+\.py)\b")


def test_every_cited_test_file_exists():
    files = set(tracked())
    missing = [
        "%s:%d: %s" % (path, number, match.group(1))
        for path in text_files()
        for number, line in enumerate((ROOT / path).read_text(errors="replace").splitlines(), 1)
        for match in TEST_FILE.finditer(line)
        if match.group(1) not in files
    ]
    assert not missing, "citations of test files that do not exist:\n" + "\n".join(missing)


def test_nothing_points_outside_the_repository():
    found = [
        "%s:%d" % (path, number)
        for path in text_files()
        for number, line in enumerate((ROOT / path).read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, "references to material outside the repository:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "text, found",
    [
        ("see notes.md §3", ["notes.md"]),
        ("(wire.md §7.1 order)", ["wire.md"]),
        ("docs/semantics.md#rows-and-sequences", ["docs/semantics.md"]),
        ("[x](../docs/http-api.md#limits)", ["../docs/http-api.md"]),
        ("no file here: fmt.mdx or a.md5", []),
    ],
)
def test_citation_pattern(text, found):
    assert [m.group(1) for m in MD_NAME.finditer(text)] == found
