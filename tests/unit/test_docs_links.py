"""Every relative link in README.md, BENCHMARKS.md and docs/**/*.md resolves: the file (or directory)
exists, and a `#fragment` into a markdown file names one of its headings (GitHub's anchors). No network:
links with a scheme (https:, mailto:) are not checked. Links inside code blocks and code spans are not
links and are skipped."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def documents() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in found if p.is_file()]


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks, with code spans blanked."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, CODE_SPAN.sub("", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def dead_links(paths: list[Path] | None = None) -> list[str]:
    dead = []
    cache: dict[Path, set[str]] = {}
    for doc in paths or documents():
        for n, line in _prose_lines(doc.read_text(encoding="utf-8")):
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                    continue  # https:, mailto: ...: not checked (no network)
                where, _, fragment = target.partition("#")
                dest = (doc.parent / unquote(where)).resolve() if where else doc
                name = f"{doc.relative_to(ROOT)}:{n}: {target}"
                if not dest.exists():
                    dead.append(f"{name} (no such file)")
                elif fragment and dest.suffix == ".md":
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if unquote(fragment).lower() not in cache[dest]:
                        dead.append(f"{name} (no heading #{fragment})")
    return dead


def test_every_relative_link_in_the_docs_resolves():
    assert dead_links() == []


def test_the_checker_finds_a_dead_file_and_a_dead_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Per-function controls (live)\n\ntext\n")
    doc = tmp_path / "b.md"
    doc.write_text(
        "[ok](a.md) [ok](a.md#per-function-controls-live) [self](#b)\n"
        "[gone](missing.md) [bad](a.md#nope)\n```\n[in code](nowhere.md)\n```\n"
        "`[span](nowhere.md)` [web](https://example.org/x)\n\n# B\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert dead_links([doc]) == ["b.md:2: missing.md (no such file)", "b.md:2: a.md#nope (no heading #nope)"]
    finally:
        ROOT = saved


MENTION = re.compile(r"(?<![\w./-])((?:docs/[\w./-]+|[A-Z][A-Z_-]+)\.md)\b")


def test_every_markdown_file_the_docs_name_in_passing_exists():
    """`docs/x.md` or `DESIGN.md` written as text (not a link) in a document names a file of this repository."""
    missing = []
    for doc in documents():
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for m in MENTION.finditer(line):
                if not (ROOT / m.group(1)).exists():
                    missing.append(f"{doc.relative_to(ROOT)}:{n}: {m.group(1)}")
    assert missing == []
