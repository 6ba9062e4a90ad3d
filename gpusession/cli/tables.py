"""PURE: rows of dicts as the text tables the commands print."""
from __future__ import annotations


def table(rows: list[dict], columns: tuple[str, ...]) -> str:
    """The columns of each row under a header, left-aligned; "(none)" for no rows."""
    if not rows:
        return "(none)"
    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
