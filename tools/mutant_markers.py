"""How a mutant of tools/mutants/ finds the statements it changes, and changes them.

The library marks each safety line with a comment naming the mutant, ``# guard: <mutant-id>``
(several ids: ``# guard: a, b``), so the code can be formatted freely:

* The marker trails the statement's line (any line of a statement written over several, usually
  its first), or, where the line has no room for it, is a comment line of its own directly above
  the statement. It marks the smallest statement holding that line (or the next line of code):
  for a compound statement (if, elif, while, for, with, try, def) the line is one of its header's,
  and the target is the header, never the body.
* A mutant that changes several statements marks each of them; its marked statements must be one
  run of consecutive statements of one block. A marker missing, or a single-statement mutant's
  marker in two places, makes the list stale.
* ``Mutant.original`` is Python source compared by its syntax tree, never by its text, so
  formatting (line breaks, parentheses, trailing commas, quotes) changes nothing. If it is the
  marked statements themselves, ``replacement`` replaces them, re-indented. Otherwise it is an
  expression that must occur exactly once in the marked statement (a compound statement's header
  only), and ``replacement`` replaces that expression, in parentheses. Either way an original that
  no longer matches the code makes the list stale: update the mutant with the code, never drop
  it silently. A marker naming no listed mutant is stale too.
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from collections.abc import Iterator

from mutants import Mutant

MARKER = re.compile(r"#\s*guard:([^#]*)")
BODIES = ("body", "orelse", "finalbody", "handlers", "cases")
NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}


class StaleMutant(Exception):
    """A mutant the code no longer matches (or a marker no mutant names): the list must be updated."""


def markers(source: str) -> dict[str, list[int]]:
    """Each id a ``# guard:`` comment names, with the lines it marks: a trailing comment's own line,
    a comment line's next line of code (the statement below it)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    marked: dict[str, list[int]] = {}
    for i, token in enumerate(tokens):
        found = MARKER.search(token.string) if token.type == tokenize.COMMENT else None
        if found is None:
            continue
        line = token.start[0]
        if not token.line[: token.start[1]].strip():
            line = next((t.start[0] for t in tokens[i + 1 :] if t.type not in NOT_CODE), line)
        for mutant_id in filter(None, re.split(r"[\s,]+", found.group(1))):
            marked.setdefault(mutant_id, []).append(line)
    return marked


def blocks(statement: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists a compound statement holds: its bodies, its handlers' and cases' bodies."""
    for name in BODIES:
        items = getattr(statement, name, None) or []
        if items and isinstance(items[0], ast.stmt):
            yield items
        else:
            yield from (item.body for item in items)


def statement_at(body: list[ast.stmt], line: int) -> tuple[list[ast.stmt], int] | None:
    """The smallest statement holding ``line``, as its block and index: a compound statement only
    when no statement of its bodies holds the line (the line is its header's)."""
    for index, statement in enumerate(body):
        if statement.lineno <= line <= (statement.end_lineno or statement.lineno):
            inner = (statement_at(block, line) for block in blocks(statement))
            return next((hit for hit in inner if hit is not None), (body, index))
    return None


def marked_statements(mutant: Mutant, source: str, tree: ast.Module) -> list[ast.stmt]:
    """The run of consecutive statements ``mutant``'s markers select in ``source``."""
    lines = markers(source).get(mutant.id)
    if not lines:
        raise StaleMutant(f"no `# guard: {mutant.id}` marker in {mutant.file}")
    places: dict[tuple[int, int], tuple[list[ast.stmt], int]] = {}
    for line in lines:
        hit = statement_at(tree.body, line)
        if hit is None:
            raise StaleMutant(f"its marker on line {line} of {mutant.file} is on no statement")
        places[(id(hit[0]), hit[1])] = hit
    body = next(iter(places.values()))[0]
    indices = sorted(index for block, index in places.values())
    if len({key[0] for key in places}) > 1 or indices != list(range(indices[0], indices[-1] + 1)):
        raise StaleMutant(
            f"its marker is in {len(places)} places of {mutant.file} (lines {sorted(lines)}) that "
            "are not one run of consecutive statements"
        )
    return body[indices[0] : indices[-1] + 1]


def header_nodes(statement: ast.stmt) -> Iterator[ast.AST]:
    """Every node of a simple statement, or of a compound statement's header (never its bodies)."""
    for name, value in ast.iter_fields(statement):
        if name in BODIES:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, ast.AST):
                yield from ast.walk(item)


def offset(source: str, line: int, column: int) -> int:
    """The character offset of an AST position (its column counts UTF-8 bytes)."""
    lines = source.splitlines(keepends=True)
    return sum(map(len, lines[: line - 1])) + len(lines[line - 1].encode()[:column].decode())


def splice(source: str, first: ast.stmt | ast.expr, last: ast.stmt | ast.expr, text: str) -> str:
    """``source`` with the code from ``first``'s start to ``last``'s end replaced by ``text``."""
    start = offset(source, first.lineno, first.col_offset)
    end = offset(source, last.end_lineno, last.end_col_offset)
    return source[:start] + text + source[end:]


def parsed(source: str, mode: str) -> ast.AST | None:
    try:
        return ast.parse(source, mode=mode)
    except SyntaxError:
        return None


def mutate(mutant: Mutant, source: str) -> str:
    """``source`` with ``mutant`` applied (see the module docstring); StaleMutant if it does not match."""
    statements = marked_statements(mutant, source, ast.parse(source))
    original = textwrap.dedent(mutant.original).strip()
    replacement = textwrap.dedent(mutant.replacement).strip()
    as_statements, as_expression = parsed(original, "exec"), parsed(original, "eval")
    if isinstance(as_statements, ast.Module) and [ast.dump(s) for s in statements] == [
        ast.dump(s) for s in as_statements.body
    ]:
        line = source.splitlines()[statements[0].lineno - 1]
        indent = line[: len(line) - len(line.lstrip())]
        mutated = splice(source, statements[0], statements[-1], replacement.replace("\n", "\n" + indent))
    elif len(statements) > 1:
        raise StaleMutant(
            f"its marker is on {len(statements)} statements of {mutant.file} (lines "
            f"{statements[0].lineno}-{statements[-1].end_lineno}) and its original is not those"
        )
    elif not isinstance(as_expression, ast.Expression):
        raise StaleMutant(
            f"its original is not the statement marked on line {statements[0].lineno} of "
            f"{mutant.file} nor an expression"
        )
    else:
        wanted = ast.dump(as_expression.body)
        found = [node for node in header_nodes(statements[0]) if ast.dump(node) == wanted]
        if len(found) != 1:
            raise StaleMutant(
                f"its original occurs {len(found)} times in the statement marked on line "
                f"{statements[0].lineno} of {mutant.file} (must be once)"
            )
        mutated = splice(source, found[0], found[0], f"({replacement})")
    if parsed(mutated, "exec") is None:
        raise StaleMutant(f"its replacement does not parse in {mutant.file}")
    return mutated
