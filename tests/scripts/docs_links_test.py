#!/usr/bin/env python3
"""docs/sim/README.md is the entry to the simulator's results: every report
in docs/sim/ (each *.md) is linked from it, and every relative link in it
names a file that exists. sim/report.sh writes that README, so the link list
is checked in the script too (a regenerated README keeps it)."""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "sim"
LINK = re.compile(r"\]\(([^)#\s]+)\)")


def check(readme_text, names, where):
    errors = []
    links = set(LINK.findall(readme_text))
    for name in names:
        if name not in links:
            errors.append(f"{where}: no link to {name}")
    return errors, links


def main():
    reports = sorted(p.name for p in DOCS.glob("*.md") if p.name != "README.md")
    # The checker itself: a README without the links fails it.
    bad, _ = check("# results\n\nno links here\n", reports, "synthetic")
    assert len(bad) == len(reports) and reports, "the link check passes vacuously"
    errors, links = check((DOCS / "README.md").read_text(), reports, "docs/sim/README.md")
    for link in links:
        if "://" in link:
            continue
        if not (DOCS / link).exists():
            errors.append(f"docs/sim/README.md: link to {link}, which does not exist")
    script_errors, _ = check((ROOT / "sim" / "report.sh").read_text(), reports, "sim/report.sh")
    errors += script_errors
    for e in errors:
        print(e)
    print(f"{len(reports) * 2 - len(errors)} passed, {len(errors)} failed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
