"""Reference pages generated from the code, so they cannot drift from it.

- ``gpusession-cli``: every command of ``gpusession.cli.main.build_parser()`` with its options;
- ``gpusession-magic``: the flags of ``%%gpu`` and ``%gpu`` (their magic_arguments parsers);
- ``gpusession-config``: every trait of ``jupyter_ext.config.GPUSession``: type, default, help.

Each directive writes reStructuredText lines and parses them in place. What they import may load
Ray's package, but nothing starts or joins a cluster: the CLI's parsers and the magics' are plain
argparse, the server's settings plain traitlets.
"""
from __future__ import annotations

import argparse
import importlib
import textwrap

from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def _rst(directive: SphinxDirective, lines: list[str]):
    """Parse generated reStructuredText in place (use the directives inside ``{eval-rst}`` on a
    MyST page: the surrounding parser must be the reStructuredText one)."""
    from docutils import nodes

    container = nodes.section()
    container.document = directive.state.document
    source = directive.get_source_info()[0]
    nested_parse_with_titles(directive.state, StringList(lines, source=source), container)
    return container.children


def _escape(text: str) -> str:
    return text.replace("*", r"\*").replace("|", r"\|").replace("_ ", r"\_ ")


def _literal(text: str) -> str:
    return "``" + text + "``" if text else ""


def _option_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += " " + (action.metavar or action.dest.upper())
        else:
            name = action.metavar or action.dest
        help_text = " ".join((action.help or "").split())
        named = action.choices and all(str(choice) in help_text for choice in action.choices)
        if action.choices and not named and not isinstance(action.choices, dict):
            help_text += f" (one of: {', '.join(map(str, action.choices))})"
        rows.append((name, help_text))
    return rows


def _option_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = _option_rows(parser)
    if not rows:
        return ["No options but ``--help``.", ""]
    lines = [".. list-table::", "   :header-rows: 1", "   :widths: 30 70", "",
             "   * - option", "     - what"]
    for name, text in rows:
        lines += [f"   * - {_literal(name)}", f"     - {_escape(text) or '-'}"]
    return lines + [""]


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _usage(parser: argparse.ArgumentParser) -> list[str]:
    usage = parser.format_usage().strip()
    if usage.startswith("::"):  # IPython's magic parsers write their usage as a literal block
        usage = usage[2:].strip()
    return ["::", ""] + ["   " + line for line in usage.splitlines()] + [""]


class CliDirective(SphinxDirective):
    """``.. gpusession-cli::`` — the whole ``gpusession`` command line, a section a command."""

    def run(self):
        from gpusession.cli.main import build_parser

        parser = build_parser()
        lines: list[str] = [_escape(parser.description or ""), ""] + _usage(parser)
        for name, help_text, sub in _subcommands(parser):
            lines += self._command(f"gpusession {name}", help_text, sub, "-")
        return _rst(self, lines)

    def _command(self, title: str, help_text: str, parser, underline: str) -> list[str]:
        lines = [title, underline * len(title), ""]
        if help_text:
            lines += [_escape(help_text[0].upper() + help_text[1:]) + ".", ""]
        if parser.description:
            lines += [_escape(" ".join(parser.description.split())), ""]
        lines += _usage(parser) + _option_table(parser)
        if parser.epilog:
            lines += [_escape(" ".join(parser.epilog.split())), ""]
        for name, sub_help, sub in _subcommands(parser):
            lines += self._command(f"{title} {name}", sub_help, sub, "~")
        return lines


class MagicDirective(SphinxDirective):
    """``.. gpusession-magic:: gpu_cell`` — a magic's flags, from its magic_arguments parser."""

    required_arguments = 1

    def run(self):
        from gpusession.notebook.magics import GPUMagics

        method = getattr(GPUMagics, self.arguments[0])
        parser = method.parser
        return _rst(self, _usage(parser) + _option_table(parser))


def _trait_type(trait) -> str:
    return type(trait).__name__


class ConfigDirective(SphinxDirective):
    """``.. gpusession-config:: jupyter_ext.config.GPUSession`` — every trait, in source order."""

    required_arguments = 1

    def run(self):
        module_name, _, class_name = self.arguments[0].rpartition(".")
        cls = getattr(importlib.import_module(module_name), class_name)
        from traitlets.traitlets import DefaultHandler

        own = [name for name in cls.__dict__ if name in cls.class_own_traits()]
        computed = {v.trait_name for v in cls.__dict__.values() if isinstance(v, DefaultHandler)}
        lines: list[str] = []
        for name in own:
            trait = cls.class_own_traits()[name]
            default = ("computed when the server starts (below)" if name in computed
                       else f"``{trait.default_value_repr()}``")
            kind = _trait_type(trait)
            lines += [f"``c.{class_name}.{name}``", f"   *{kind}*, default {default}", ""]
            help_text = textwrap.dedent(trait.help or "").strip()
            for paragraph in help_text.split("\n\n"):
                lines += ["   " + _escape(" ".join(paragraph.split())), ""]
        return _rst(self, lines)


def transcripts_as_literal_blocks(app, what, name, obj, options, lines: list[str]) -> None:
    """Docstrings carry IPython transcripts (``In [1]: ...`` and ``   ...: ...`` lines, as
    STYLE.md asks); show each run of them as a literal block instead of reStructuredText."""
    out: list[str] = []
    inside = False
    for line in lines:
        transcript = line.lstrip().startswith("In [") or line.lstrip().startswith("...:")
        if transcript and not inside:
            if out and out[-1].strip():
                out.append("")
            out += ["::", ""]
            inside = True
        elif not transcript and inside:
            out.append("")
            inside = False
        out.append("    " + line if transcript else line)
    lines[:] = out


def setup(app):
    app.connect("autodoc-process-docstring", transcripts_as_literal_blocks)
    app.add_directive("gpusession-cli", CliDirective)
    app.add_directive("gpusession-magic", MagicDirective)
    app.add_directive("gpusession-config", ConfigDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
