"""Write the topology reference of docs/configuration.md from the pydantic models.

    python scripts/gen_config_docs.py           # rewrite the generated part
    python scripts/gen_config_docs.py --check   # exit 1 if it is out of date

Only the part between the BEGIN/END GENERATED markers is written; the text above it is
kept as it is. The rendering is scripts/config_reference.py's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"
# Run as a file (python scripts/gen_config_docs.py), the repository root is not on the path.
sys.path.insert(0, str(ROOT))

from scripts.config_reference import generated_part, render, splice  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only say whether the file is current")
    args = p.parse_args()
    text = DOC.read_text() if DOC.exists() else ""
    fresh = render()
    if generated_part(text) == fresh:
        print(f"{DOC.relative_to(ROOT)} is up to date")
        return 0
    if args.check:
        print(f"{DOC.relative_to(ROOT)} is out of date: run python scripts/gen_config_docs.py")
        return 1
    DOC.write_text(splice(text, fresh))
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
