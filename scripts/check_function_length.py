#!/usr/bin/env python3
"""Fails when a function in the given source directories is longer than the limit (lines from its
opening brace to its closing one). The graph layer keeps to 60 (issue 49): a function that outgrows it
is split into steps with names.

A function is a brace block opened on a line that ends a signature: `) {`, `) const {`, `) override {`,
`-> T {`, not `if (...) {`, `for (...) {`, a lambda (`[...](...) {`) or a block nested in a function.
Comments and strings are blanked first, so their braces do not count.

Usage: check_function_length.py LIMIT DIR [DIR ...]   (exit 1 and one line per long function)
"""

import pathlib
import re
import sys

SIGNATURE_END = re.compile(r"\)\s*(const\s*)?(override\s*)?(noexcept\s*)?(->\s*[\w:<>,\s*&]+)?\{\s*$")
CONTROL = re.compile(r"\b(if|for|while|switch|catch)\s*\(")
LAMBDA = re.compile(r"\[[^\]]*\]\s*\(")


def code_of(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return re.sub(r"//.*", "", line)


def functions(path):
    """(length, first line, signature line) of every function in `path`."""
    lines = path.read_text().split("\n")
    out, stack = [], []  # stack: (line index, is a function not nested in one)
    for i, raw in enumerate(lines):
        code = code_of(raw)
        for ch in code:
            if ch == "{":
                text = code.strip()
                is_function = (SIGNATURE_END.search(text) and not CONTROL.search(text) and not LAMBDA.search(text)
                               and not any(f for _, f in stack))
                stack.append((i, bool(is_function)))
            elif ch == "}" and stack:
                start, is_function = stack.pop()
                if is_function:
                    out.append((i - start + 1, start + 1, lines[start].strip()))
    return out


def main():
    limit = int(sys.argv[1])
    long_ones = []
    for directory in sys.argv[2:]:
        for path in sorted(pathlib.Path(directory).rglob("*")):
            if path.suffix in (".cpp", ".h"):
                long_ones += [(n, f"{path}:{line}", sig) for n, line, sig in functions(path) if n > limit]
    for n, where, signature in sorted(long_ones, reverse=True):
        print(f"{where}: {n} lines (at most {limit}): {signature[:100]}")
    if long_ones:
        return 1
    print(f"no function over {limit} lines in {', '.join(sys.argv[2:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
