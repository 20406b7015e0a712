"""The docs speak to someone with a clone of the repository and nothing else: no links or
paths into the development setup's ``../shared`` folder (the design card, the seeds, the
yardsticks), no references to the project's issue tracker by number, and every relative
link in docs/ and README.md points at a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

FORBIDDEN = {
    "a path into ../shared": re.compile(r"\.\./shared\b|\bshared/(?:seeds|bench|design)\b"),
    "an issue number": re.compile(r"\bissues? #?\d+|\bissue #\d+", re.I),
    "the seeds or the design card": re.compile(r"\bseeds? \d{3}\b|\bARCHITECTURE(?:\.md)?\b"),
}
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_no_doc_mentions_what_a_clone_does_not_have() -> None:
    found = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for what, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    found.append(f"{doc.relative_to(ROOT)}:{n}: {what}: {line.strip()}")
    assert not found, "\n".join(found)


def test_relative_links_point_into_the_repository() -> None:
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue                                     # http:, https:, mailto:
            path = (doc.parent / target).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken
