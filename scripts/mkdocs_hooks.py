"""MkDocs hook (mkdocs.yml `hooks:`): the reference page's generated parts. In docs/reference.md,
after `<!-- snakedvc:config-keys -->` a table of every key of the kit's schema
(src/snakedvc/schemas/snakedvc.schema.yaml: type, default, description), and after
`<!-- snakedvc:commands -->` every command of `snakedvc --help` (src/snakedvc/cli.py's parser: what it
does, its usage, its arguments), each up to its closing `<!-- /snakedvc:... -->`.

The page holds them as generated, so that it reads whole on GitHub too; the build makes them again
(the site cannot go stale) and tests/test_docs.py fails where the page's copy is stale:
`python scripts/mkdocs_hooks.py` rewrites it. A marker missing from the page fails the build."""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "src/snakedvc/schemas/snakedvc.schema.yaml"
PAGE = "reference.md"
CONFIG_MARKER = "<!-- snakedvc:config-keys -->"
COMMANDS_MARKER = "<!-- snakedvc:commands -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    from mkdocs.exceptions import PluginError

    for marker in (CONFIG_MARKER, COMMANDS_MARKER):
        if marker not in markdown:
            raise PluginError(f"{PAGE} has no {marker}: scripts/mkdocs_hooks.py puts a generated table there")
    return filled(markdown)


def filled(markdown: str) -> str:
    """``markdown`` with what follows each marker, up to its closing one, generated anew."""
    generated = {
        CONFIG_MARKER: lambda: config_table(yaml.safe_load(SCHEMA.read_text())),
        COMMANDS_MARKER: lambda: commands_reference(cli_parser()),
    }
    for marker, make in generated.items():
        if marker not in markdown:
            continue
        closing = marker.replace("<!-- ", "<!-- /")
        before, _, rest = markdown.partition(marker)
        after = rest.partition(closing)[2] if closing in rest else rest
        markdown = f"{before}{marker}\n\n{make().strip()}\n\n{closing}{after}"
    return markdown


# --- config keys -------------------------------------------------------------------------------


def config_table(schema: dict[str, Any], prefix: str = "snakedvc") -> str:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, spec in schema_keys(schema, prefix):
        rows.append(f"| `{key}` | {type_of(spec)} | {default_of(spec)} | {prose(spec.get('description', ''))} |")
    return "\n".join(rows) + "\n"


def schema_keys(schema: dict[str, Any], prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every key under ``schema``'s properties, dotted, a section before its keys."""
    for name, spec in schema.get("properties", {}).items():
        key = f"{prefix}.{name}"
        yield key, spec
        yield from schema_keys(spec, key)


def type_of(spec: dict[str, Any]) -> str:
    kind = spec.get("type", "")
    if kind == "object":
        return "section" if "properties" in spec else "mapping"
    if kind == "array":
        return f"list of {spec.get('items', {}).get('type', 'values')}"
    if "enum" in spec:
        values = [f"`{value}`" for value in spec["enum"]]
        return f"{kind}: " + ", ".join(values[:-1]) + " or " + values[-1]
    if "minimum" in spec:
        return f"{kind} ≥ {spec['minimum']}"
    return str(kind)


def default_of(spec: dict[str, Any]) -> str:
    if "default" not in spec:
        return ""
    value = spec["default"]
    if spec.get("type") == "object" and "properties" in spec:
        return ""  # a section: its keys have their own
    return f"`{value}`" if isinstance(value, str) and value else f"`{json.dumps(value)}`"


def prose(text: str) -> str:
    """Schema text as one table cell: code spans kept, Markdown and HTML characters escaped outside them."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(part if part.startswith("`") else _escape(part) for part in parts).replace("|", "\\|")


def _escape(text: str) -> str:
    # `<dir>` would be read as an HTML tag, `min_epochs * eta` as emphasis.
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.translate({ord(c): f"\\{c}" for c in "*_[]"})


# --- commands ----------------------------------------------------------------------------------


def cli_parser() -> argparse.ArgumentParser:
    """The checkout's parser (src/ first on the path, whatever snakedvc is installed)."""
    sys.path.insert(0, str(REPO / "src"))
    try:
        from snakedvc.cli import build_parser
    finally:
        sys.path.remove(str(REPO / "src"))
    return build_parser()


def commands_reference(parser: argparse.ArgumentParser) -> str:
    """A table of the commands `snakedvc --help` lists, then each one's usage and arguments."""
    commands = list(listed_commands(parser, parser.prog))
    rows = ["| command | what it does |", "|---|---|"]
    rows += [f"| [`{name}`](#{anchor(name)}) | {prose(help_text)} |" for name, help_text, _ in commands]
    sections = [command_section(name, help_text, sub) for name, help_text, sub in commands]
    return "\n".join(rows) + "\n\n" + "\n".join(sections)


def listed_commands(parser: argparse.ArgumentParser, prog: str) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(full name, help, parser) of each subcommand with a help line (`--help` lists those), nested ones by name."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for choice in action._choices_actions:
            sub = action.choices[choice.dest]
            name = f"{prog} {choice.dest}"
            nested = list(listed_commands(sub, name))
            yield from nested or [(name, choice.help or "", sub)]


def anchor(name: str) -> str:
    return name.replace(" ", "-")


def command_section(name: str, help_text: str, parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=100)
    usage = parser.format_usage().strip()
    lines = [f"### `{name}` {{#{anchor(name)}}}", "", prose(help_text), "", "```text", usage, "```", ""]
    arguments = [action for action in parser._actions if action.help != argparse.SUPPRESS]
    arguments = [action for action in arguments if not isinstance(action, argparse._HelpAction)]
    if arguments:
        lines += ["| argument | what |", "|---|---|"]
        for action in arguments:
            lines.append(f"| `{argument_name(action)}` | {prose(action.help or '')} |")
        lines.append("")
    return "\n".join(lines)


def argument_name(action: argparse.Action) -> str:
    if not action.option_strings:
        return str(action.metavar or action.dest)
    takes_value = action.nargs != 0
    metavar = action.metavar or action.dest.upper()
    return ", ".join(f"{option} {metavar}" if takes_value else option for option in action.option_strings)


if __name__ == "__main__":
    # Rewrite docs/reference.md's generated parts (tests/test_docs.py says when they are stale).
    page = REPO / "docs" / PAGE
    page.write_text(filled(page.read_text()))
    print(f"wrote the generated parts of {page.relative_to(REPO)}")
