"""The SHA-256 of the JupyterLab extension's sources (labextension/: package.json, its lock file,
tsconfig.json, src/ and style/), as recorded next to the built bundle in
jupyter_ext/labextension/sources.sha256 by scripts/build-labextension. A test compares the two,
so a bundle that is stale against its sources fails fast instead of shipping."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "labextension"
RECORD = ROOT / "jupyter_ext" / "labextension" / "sources.sha256"


def source_files() -> list[Path]:
    top = [SOURCES / name for name in ("package.json", "package-lock.json", "tsconfig.json")]
    tree = [p for folder in ("src", "style") for p in (SOURCES / folder).rglob("*") if p.is_file()]
    return sorted(top + tree)


def sources_hash() -> str:
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(path.relative_to(SOURCES).as_posix().encode() + b"\0")
        digest.update(path.read_bytes().replace(b"\r\n", b"\n") + b"\0")
    return digest.hexdigest()


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        RECORD.write_text(sources_hash() + "\n")
    print(sources_hash())
