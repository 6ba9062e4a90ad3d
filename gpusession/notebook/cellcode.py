"""What a %%gpu cell body reads, assigns and displays: pure static analysis, no IPython, no Ray.

The magic ships the names a body reads and brings back the names it assigns, so it needs the
same scoping Python uses: `symtable` gives it (a name read inside a function or comprehension
of the cell is still a read of the notebook's global), and `ast` splits off the last
expression, which IPython would display.
"""
from __future__ import annotations

import ast
import io
import symtable
import tokenize
from dataclasses import dataclass


@dataclass(frozen=True)
class CellCode:
    source: str
    reads: frozenset[str]  # global names the body reads, at top level or in nested scopes
    assigns: tuple[str, ...]  # names bound at top level (or declared global), in source order
    has_value: bool  # the last statement is an expression that a local cell would display


def analyze(source: str, filename: str = "<%%gpu cell>") -> CellCode:
    """Raises SyntaxError for a body that does not compile."""
    tree = ast.parse(source, filename=filename)
    table = symtable.symtable(source, filename, "exec")
    reads: set[str] = set()
    assigned: set[str] = set()
    for symbol in table.get_symbols():
        if symbol.is_referenced():
            reads.add(symbol.get_name())
        if symbol.is_assigned() or symbol.is_imported():
            assigned.add(symbol.get_name())
    for child in table.get_children():
        _collect_globals(child, reads, assigned)
    return CellCode(
        source=source,
        reads=frozenset(reads),
        assigns=tuple(sorted(assigned, key=_first_binding_order(tree))),
        has_value=_ends_with_expression(tree) and not ends_with_semicolon(source),
    )


def _collect_globals(table: symtable.SymbolTable, reads: set[str], assigned: set[str]) -> None:
    for symbol in table.get_symbols():
        if not symbol.is_global():
            continue
        if symbol.is_referenced():
            reads.add(symbol.get_name())
        if symbol.is_declared_global() and symbol.is_assigned():  # `global x; x = ...`
            assigned.add(symbol.get_name())
    for child in table.get_children():
        _collect_globals(child, reads, assigned)


def _first_binding_order(tree: ast.Module):
    """Sort key: line of the first node that names the symbol (stable, readable messages)."""
    first: dict[str, int] = {}
    for node in ast.walk(tree):
        name = getattr(node, "id", None) or getattr(node, "name", None)
        if isinstance(name, str):
            first[name] = min(first.get(name, 1 << 30), getattr(node, "lineno", 0))
        for alias in getattr(node, "names", None) or ():
            if isinstance(alias, ast.alias):
                bound = (alias.asname or alias.name).split(".")[0]
                first[bound] = min(first.get(bound, 1 << 30), node.lineno)
    return lambda name: (first.get(name, 1 << 30), name)


def _ends_with_expression(tree: ast.Module) -> bool:
    return bool(tree.body) and isinstance(tree.body[-1], ast.Expr)


def ends_with_semicolon(source: str) -> bool:
    """A trailing `;` silences the cell's result in IPython; the same holds for %%gpu."""
    last = None
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER,
                                  tokenize.INDENT, tokenize.DEDENT):
                last = token
    except (tokenize.TokenError, SyntaxError):
        return False
    return last is not None and last.type == tokenize.OP and last.string == ";"


def split_last_expression(source: str, filename: str) -> tuple[ast.Module, ast.Expression | None]:
    """The body to exec and, when it ends with one, the expression to eval for display.
    Line numbers are kept, so tracebacks point at the cell's own lines."""
    tree = ast.parse(source, filename=filename)
    if not _ends_with_expression(tree) or ends_with_semicolon(source):
        return tree, None
    last = tree.body.pop()
    return tree, ast.Expression(body=last.value)


def parse_names(text: str) -> tuple[str, ...]:
    """`--out a,b` -> ("a", "b"); raises ValueError naming a part that is not an identifier."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        if not name.isidentifier():
            raise ValueError(f"--out takes variable names separated by commas (e.g. --out model,losses); "
                             f"{name!r} is not a variable name.")
    if not names:
        raise ValueError("--out needs at least one variable name, e.g. --out model,losses.")
    return names
