#!/usr/bin/env python3
"""CHANGELOG.md (Keep a Changelog) as the Debian package's changelog, or a check of it.

    hack/changelog.py debian VERSION COMMIT DATE MAINTAINER   the Debian changelog on stdout
    hack/changelog.py check VERSION                           exit 1 unless VERSION has a section

A VERSION with its own section gets the entries of that version and the ones below it. Any other
VERSION (a build between versions, such as the VM node's 0.1.0+vm1) gets an entry of its own on
top, saying which commit it was built from and carrying the Unreleased section's items, then the
versions below it. DATE (RFC 2822) dates that entry; released versions are dated by their section.
Lines stay within 80 columns (lintian's debian-changelog-line-too-long).
"""

import datetime
import re
import sys
import textwrap
from pathlib import Path

CHANGELOG = Path(__file__).resolve().parent.parent / "CHANGELOG.md"
HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?\s*$")


def sections(text):
    """[(version, date or None, [item, ...])] in file order, items as single lines."""
    out = []
    for line in text.splitlines():
        m = HEADING.match(line)
        if m:
            out.append((m["version"], m["date"], [], []))
            continue
        if not out:
            continue
        items, para = out[-1][2], out[-1][3]
        sub = re.match(r"^### (.+)$", line)
        if sub:
            para.clear()
            para.append(sub.group(1))
        elif line.startswith("- "):
            items.append([para[0] if para else "", line[2:].strip()])
        elif line.startswith("  ") and items and line.strip():
            items[-1][1] += " " + line.strip()
        elif line.strip() and not line.startswith("#") and para:
            # A paragraph under a subsection (Performance) is one item.
            if items and items[-1][0] == para[0] and items[-1][1].startswith("\x00"):
                items[-1][1] += " " + line.strip()
            else:
                items.append([para[0], "\x00" + line.strip()])
    result = []
    for version, date, items, _ in out:
        lines = []
        for kind, body in items:
            body = body.lstrip("\x00")
            body = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", body).replace("`", "")
            lines.append(body if kind in ("", "Added") else f"{kind}: {body}")
        result.append((version, date, lines))
    return result


def entry(version, items, maintainer, date):
    out = [f"scute ({version}) unstable; urgency=medium", ""]
    for item in items or ["No user-visible change."]:
        out += textwrap.wrap(item, 78, initial_indent="  * ", subsequent_indent="    ", break_on_hyphens=False)
    out += ["", f" -- {maintainer}  {date}", ""]
    return "\n".join(out)


def rfc2822(day):
    d = datetime.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=datetime.timezone.utc)
    return d.strftime("%a, %d %b %Y %H:%M:%S +0000")


def main(argv):
    parsed = sections(CHANGELOG.read_text())
    released = [s for s in parsed if s[0] != "Unreleased"]
    if argv[:1] == ["check"] and len(argv) == 2:
        if any(v == argv[1] for v, _, _ in released):
            return 0
        print(f"changelog.py: CHANGELOG.md has no section for version {argv[1]} (Cargo.toml's)", file=sys.stderr)
        return 1
    if argv[:1] != ["debian"] or len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    version, commit, date, maintainer = argv[1:]
    chunks = []
    below = released
    if not any(v == version for v, _, _ in released):
        unreleased = next((items for v, _, items in parsed if v == "Unreleased"), [])
        base = released[0][0] if released else "nothing"
        chunks.append(entry(version, [f"Built from commit {commit}, after {base}."] + unreleased, maintainer, date))
    else:
        below = released[[v for v, _, _ in released].index(version):]
    for v, day, items in below:
        if not day:
            print(f"changelog.py: version {v} has no date in CHANGELOG.md", file=sys.stderr)
            return 1
        chunks.append(entry(v, items, maintainer, rfc2822(day)))
    sys.stdout.write("\n".join(chunks))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
