#!/usr/bin/env python3
"""Checks the relative links of every Markdown file in the repository (Python 3, stdlib only).

Every link `[text](target)` or `![alt](target)` (and reference definition `[name]: target`)
outside code must resolve: a relative target to a file or directory of the repository, a
`#fragment` to a heading of the target file (GitHub's slugs) or an explicit `id`/`name` anchor.
No link may leave the repository: a target that climbs above the root with `../`, an absolute
path, or one into `shared/` (files the repository does not hold) is an error. Links with a
scheme (`https:`, `mailto:`) are not followed.

Run from anywhere: `python3 tests/check_links.py [ROOT]`. Prints `file:line: link: problem` for
each bad link and exits 1 if there is one, 0 otherwise. `deploy/test.sh` runs it.
"""

import os
import re
import sys
import unicodedata
from pathlib import Path

SKIP_DIRS = {".git", "target", ".venv", ".run", "node_modules", "__pycache__", ".pytest_cache"}

INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s>]*(?:\([^()\s]*\)[^()\s>]*)*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:name|id)\s*=\s*\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")


def markdown_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith(".md"):
                yield Path(dirpath) / name


def lines_outside_code(text):
    """(line number, line) for every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), start=1):
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif match.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield number, line


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = unicodedata.normalize("NFC", text).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, seen = set(), {}
        text = path.read_text(encoding="utf-8")
        for _, line in lines_outside_code(text):
            match = HEADING.match(line)
            if match:
                base = slug(match.group(2))
                count = seen.get(base, 0)
                seen[base] = count + 1
                found.add(base if count == 0 else f"{base}-{count}")
            found.update(HTML_ANCHOR.findall(line))
        cache[path] = found
    return cache[path]


def links(text):
    """(line number, target) of every link outside code."""
    for number, line in lines_outside_code(text):
        plain = re.sub(r"(`+).*?\1", "", line)  # inline code spans
        for match in INLINE.finditer(plain):
            yield number, match.group(1)
        match = REFDEF.match(plain)
        if match:
            yield number, match.group(1)


def problem(root, source, target):
    """What is wrong with `target`, linked from `source`, or None."""
    if not target or SCHEME.match(target):
        return None
    path_part, _, fragment = target.partition("#")
    if path_part.startswith("/"):
        return "absolute path: link relative to the file instead"
    if path_part:
        resolved = Path(os.path.normpath(source.parent / path_part))
        try:
            inside = resolved.relative_to(root)
        except ValueError:
            return "points outside the repository"
        if inside.parts[:1] == ("shared",):
            return "points into shared/, which the repository does not hold"
        if not resolved.exists():
            return f"{inside} does not exist"
    else:
        resolved = source
    if fragment:
        if resolved.is_dir() or resolved.suffix != ".md":
            return None  # anchors are checked in Markdown files only
        if fragment not in anchors(resolved):
            return f"no heading with anchor #{fragment} in {resolved.relative_to(root)}"
    return None


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    bad = 0
    checked = 0
    for source in markdown_files(root):
        text = source.read_text(encoding="utf-8")
        for number, target in links(text):
            checked += 1
            why = problem(root, source, target)
            if why:
                bad += 1
                print(f"{source.relative_to(root)}:{number}: {target}: {why}")
    if bad:
        print(f"check_links: {bad} bad link(s) of {checked}", file=sys.stderr)
        return 1
    print(f"check_links: {checked} links checked, all resolve inside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main())
