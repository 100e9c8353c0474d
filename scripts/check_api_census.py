#!/usr/bin/env python3
"""The API census: docs/pytorch-api.md against the public names PyTorch lists (scripts/api_census.py).

  check_api_census.py tu DOC INCLUDE_DIR OUTPUT_CPP
      Writes the translation unit that compiles every mapped dtensor name of DOC: one using-declaration per
      name, a namespace member redeclared in a namespace of its own, a class member in a class derived from
      its class (a using-declaration takes an overload set, a type, a variable, a template or a data member
      alike, and must find the name, accessible). `#line` points a compiler error at the row of DOC. The
      program prints the names it compiled, so that the test knows the build checked this DOC's names.

  check_api_census.py check --census LIST --doc DOC --include INCLUDE_DIR --compiled PROGRAM
      Fails (exit 1, one line per problem) when
       - a name of LIST has no row in DOC, or a row names something LIST does not have (a stale row);
       - rows are not in LIST's order (sorted), or a name has two rows;
       - an explained row's note is empty or generic (see specific()), or a gap's note says nothing after
         "gap:";
       - a name LIST tags FSDP1 is not an explained row whose note starts with "FSDP1";
       - a mapped name is not declared in its row's headers (its last component does not appear in them as
         a word), or a header does not exist under INCLUDE_DIR;
       - PROGRAM (the compiled translation unit) did not compile exactly DOC's mapped names.
      Then prints the counts: mapped, explained, gaps, total.
"""

import argparse
import pathlib
import re
import subprocess
import sys

TABLE_HEADER = "| PyTorch name | dtensor name | header | note |"
NONE = "—"
GAP = "gap:"
FSDP1 = "FSDP1"
CPP_NAME = re.compile(r"^dtensor(::(operator\S+|[A-Za-z_]\w*))+$")
HEADER = re.compile(r"^dtensor/[\w/]+\.h$")
PYTORCH_NAME = re.compile(r"^torch(\.\w+)+$")

# Notes that say nothing about why (lower case, without a final full stop). A note is specific when it is
# not one of these and either has a detail after a "Category:" prefix that is not one of these either
# ("Python-only: pickling"), or, without a colon, has at least four words.
GENERIC = {
    "", "-", NONE, "?", "absent", "missing", "none", "n/a", "na", "todo", "tbd", "internal", "private", "deprecated",
    "not supported", "unsupported", "not implemented", "unimplemented", "not applicable", "not needed", "not available",
    "no counterpart", "no equivalent", "not ported", "python-only", "python only", "not in dtensor",
}


class Row:
    def __init__(self, line: int, pytorch: str, names: list[str], headers: list[str], note: str):
        self.line, self.pytorch, self.names, self.headers, self.note = line, pytorch, names, headers, note

    @property
    def kind(self) -> str:
        if self.names:
            return "mapped"
        return "gap" if self.note.startswith(GAP) else "explained"


def code_cells(cell: str) -> list[str]:
    """`a`, `b` -> [a, b]; — -> []."""
    if cell == NONE:
        return []
    items = [item.strip() for item in cell.split(",")]
    if not all(len(item) > 2 and item[0] == "`" and item[-1] == "`" for item in items):
        raise ValueError(f"expected {NONE} or `name`, `name`, ...: {cell!r}")
    return [item[1:-1] for item in items]


def parse_doc(path: pathlib.Path) -> tuple[list[Row], list[str]]:
    rows, problems = [], []
    lines = path.read_text().splitlines()
    try:
        start = lines.index(TABLE_HEADER) + 2  # past the separator
    except ValueError:
        return [], [f"{path}: no table headed {TABLE_HEADER!r}"]
    for number, line in enumerate(lines[start:], start + 1):
        if not line.startswith("|"):
            break
        where = f"{path}:{number}"
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if len(cells) != 4:
            problems.append(f"{where}: {len(cells)} cells, not 4 (a '|' inside a cell?)")
            continue
        try:
            pytorch = code_cells(cells[0])
            names = code_cells(cells[1])
            headers = code_cells(cells[2])
        except ValueError as e:
            problems.append(f"{where}: {e}")
            continue
        if len(pytorch) != 1 or not PYTORCH_NAME.match(pytorch[0]):
            problems.append(f"{where}: the PyTorch name must be one `torch.x.y`: {cells[0]!r}")
            continue
        problems += [f"{where}: not a qualified dtensor C++ name: {n!r}" for n in names if not CPP_NAME.match(n)]
        problems += [f"{where}: not a public header (dtensor/x.h): {h!r}" for h in headers if not HEADER.match(h)]
        if bool(names) != bool(headers):
            problems.append(f"{where}: a mapped row names its headers, an unmapped one has {NONE} in both")
        rows.append(Row(number, pytorch[0], names, headers, cells[3]))
    return rows, problems


def specific(text: str, min_words: int = 4) -> bool:
    """Whether a note says something particular (GENERIC)."""
    text = text.strip().rstrip(".").strip()
    if text.lower() in GENERIC:
        return False
    head, colon, detail = text.partition(":")
    if colon and head.strip() and " " not in head.strip():
        detail = detail.strip().rstrip(".").strip()
        return bool(detail) and detail.lower() not in GENERIC
    return len(text.split()) >= min_words


def note_problems(row: Row, tag: str) -> list[str]:
    where = f"line {row.line}: {row.pytorch}"
    if tag == FSDP1 and not (row.kind == "explained" and row.note.startswith(FSDP1)):
        return [f"{where}: an FSDP1 name (scripts/api_census.py) must be explained with a note starting {FSDP1!r}"]
    if row.kind == "gap":
        return [] if specific(row.note[len(GAP):], 3) else [
            f"{where}: a gap's note must say what is missing after {GAP!r}: {row.note!r}"]
    if row.kind == "explained":
        if row.note.lower().startswith("gap"):
            return [f"{where}: a gap's note starts with exactly {GAP!r}: {row.note!r}"]
        return [] if specific(row.note) else [f"{where}: the reason is empty or generic: {row.note!r} (say why, specifically)"]
    if row.note.startswith(GAP):
        return [f"{where}: a mapped row's note starts with {GAP!r}: a gap has {NONE} for its dtensor name"]
    return []


def declared_problems(row: Row, include: pathlib.Path) -> list[str]:
    problems, text = [], ""
    for header in row.headers:
        path = include / header
        if not path.is_file():
            problems.append(f"line {row.line}: {row.pytorch}: no header {path}")
        else:
            text += path.read_text()
    for name in row.names:
        last = name.rsplit("::", 1)[1]
        if text and not re.search(r"(?<![\w:])" + re.escape(last) + r"(?!\w)", text):
            problems.append(f"line {row.line}: {row.pytorch}: {name} is not declared in {', '.join(row.headers)}")
    return problems


def read_census(path: pathlib.Path) -> dict[str, str]:
    census = {}
    for line in path.read_text().splitlines():
        name, _, tag = line.partition("\t")
        census[name] = tag
    return census


def compiled_names(program: str) -> list[str]:
    if not pathlib.Path(program).is_file():
        raise SystemExit(f"{program} is missing: build it (ninja -C build api_census_names)")
    return subprocess.run([program], capture_output=True, text=True, check=True).stdout.splitlines()


def check(args: argparse.Namespace) -> int:
    census = read_census(pathlib.Path(args.census))
    rows, problems = parse_doc(pathlib.Path(args.doc))
    include = pathlib.Path(args.include)
    by_name = {}
    for row in rows:
        if row.pytorch in by_name:
            problems.append(f"line {row.line}: {row.pytorch} has a row already (line {by_name[row.pytorch].line})")
        by_name[row.pytorch] = row
        if row.pytorch not in census:
            problems.append(f"line {row.line}: {row.pytorch} is not a public name of PyTorch's API (stale row): remove it")
            continue
        problems += note_problems(row, census[row.pytorch])
        problems += declared_problems(row, include)
    problems += [f"{name}: no row in {args.doc} (map it, explain it, or mark it a gap)" for name in census if name not in by_name]
    listed = [row.pytorch for row in rows]
    if listed != sorted(listed):
        first = next(a for a, b in zip(listed, sorted(listed)) if a != b)
        problems.append(f"rows are not sorted by PyTorch name (from {first}); keep the census's order")
    mapped = sorted({name for row in rows for name in row.names})
    compiled = sorted(set(compiled_names(args.compiled)))
    if compiled != mapped:
        problems.append(f"{args.compiled} compiled other names than {args.doc} maps (a stale build?): "
                        f"missing {sorted(set(mapped) - set(compiled))}, extra {sorted(set(compiled) - set(mapped))}")
    for problem in problems:
        print(problem)
    counts = {kind: sum(row.kind == kind for row in rows) for kind in ("mapped", "explained", "gap")}
    print(f"API census of PyTorch's distributed tensor API: {len(census)} names; rows: {counts['mapped']} mapped "
          f"({len(compiled)} dtensor names compiled), {counts['explained']} explained, {counts['gap']} gaps, {len(rows)} total")
    return 1 if problems else 0


def namespaces(include: pathlib.Path) -> set[str]:
    """Every identifier that names a namespace in the public headers (`namespace a::b {` gives a and b)."""
    found = set()
    for header in include.rglob("*.h"):
        for match in re.finditer(r"^\s*namespace\s+([\w:]+)\s*\{", header.read_text(), re.M):
            found.update(match.group(1).split("::"))
    return found


def write_tu(args: argparse.Namespace) -> int:
    rows, problems = parse_doc(pathlib.Path(args.doc))
    if problems:
        print("\n".join(problems))
        return 1
    known = namespaces(pathlib.Path(args.include))
    doc = pathlib.Path(args.doc).resolve()
    headers = sorted({h for row in rows for h in row.headers})
    out = [
        f"// Generated by scripts/check_api_census.py from {args.doc}: do not edit. Every mapped dtensor name, as",
        "// a using-declaration that must find it; errors point at the row of the table (#line).",
        "#include <cstdio>",
        "",
        *[f'#include "{h}"' for h in headers],
        "",
    ]
    doc_lines = doc.read_text().splitlines()
    names = []

    def at_row(row: Row, code: str, name: str, part: str) -> None:
        # `code` as a line of the row: padded so that `part` (name, or its scope) ends in the column it ends in
        # the row, where the compiler's caret points at its last component.
        column = doc_lines[row.line - 1].index(f"`{name}`") + 1 + len(part)
        pad = max(0, column - (code.index(part) + len(part)))
        out.extend([f'#line {row.line} "{doc}"', " " * pad + code])

    for row in rows:
        for i, name in enumerate(row.names):
            scope = name.rsplit("::", 1)[0]
            label = f"api_census_line_{row.line}_{i}"
            if all(part in known for part in scope.split("::")):
                at_row(row, f"namespace {label} {{ using ::{name}; }}", name, name)
            else:  # a member of class `scope`, redeclared in a class derived from it
                at_row(row, f"struct {label} : ::{scope}", name, scope)
                at_row(row, f"{{ using ::{name}; }};", name, name)
            names.append(name)
    names = sorted(set(names))
    out.append(f'#line {len(out) + 2} "{pathlib.Path(args.output).resolve()}"')
    out += [
        "",
        "static const char* const kNames[] = {",
        *[f'    "{n}",' for n in names],
        "};",
        "",
        "int main() {",
        "  for (const char* name : kNames) std::puts(name);",
        "  return 0;",
        "}",
    ]
    output = pathlib.Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(out) + "\n"
    if not output.exists() or output.read_text() != text:
        output.write_text(text)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    tu = commands.add_parser("tu")
    tu.add_argument("doc")
    tu.add_argument("include")
    tu.add_argument("output")
    chk = commands.add_parser("check")
    chk.add_argument("--census", required=True)
    chk.add_argument("--doc", required=True)
    chk.add_argument("--include", required=True)
    chk.add_argument("--compiled", required=True)
    args = parser.parse_args()
    return write_tu(args) if args.command == "tu" else check(args)


if __name__ == "__main__":
    sys.exit(main())
