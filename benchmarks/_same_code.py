"""PURE: whether two versions of a Python file run the same code: the same syntax tree once every
docstring (of the module, its classes and functions) and every `pass` is set aside; comments and
layout are not in the tree at all. A speed row stays current across a change that only rewrites prose
(benchmarks/_git_facts.py): what was measured did not change."""
from __future__ import annotations

import ast

_HOLDERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def same_code(before: str, after: str) -> bool:
    """False as well when either side does not parse: nothing is known to be the same then."""
    try:
        return _without_docstrings(before) == _without_docstrings(after)
    except (SyntaxError, ValueError):
        return False


def _without_docstrings(text: str) -> str:
    """The tree's dump without docstrings, nor `pass` (which does nothing: `def f(): pass` and
    `def f(): "doc"` run the same)."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, _HOLDERS) and node.body and _is_docstring(node.body[0]):
            node.body = node.body[1:]
        for name in ("body", "orelse", "finalbody"):
            statements = getattr(node, name, None)
            if isinstance(statements, list):
                setattr(node, name, [s for s in statements if not isinstance(s, ast.Pass)])
    return ast.dump(tree, include_attributes=False)


def _is_docstring(statement: ast.stmt) -> bool:
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))
