"""Code lines of files at a git revision: lines holding a token that is not a comment, a docstring or a bare
string statement (docs/benchmarks.md, issue 40's lines of code).

    python3 -m benchmarks.lines_of_code 15c9225 harness/batch/tuning.py harness/batch/tune_runs.py ...
"""

from __future__ import annotations

import io
import subprocess
import sys
import tokenize

SKIP = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
        tokenize.ENDMARKER)


def code_lines(source: str) -> int:
    lines: set[int] = set()
    previous = None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in SKIP:
            if token.type not in (tokenize.NL, tokenize.COMMENT):
                previous = token
            continue
        if token.type == tokenize.STRING and (previous is None or previous.type in (
                tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)):
            previous = token   # a docstring or a bare string statement
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
        previous = token
    return len(lines)


def main(argv: list[str]) -> None:
    revision, files = argv[0], argv[1:]
    total = 0
    for name in files:
        shown = subprocess.run(["git", "show", f"{revision}:{name}"], capture_output=True, text=True)
        if shown.returncode:
            print(f"{'-':>6} {name} (not at {revision})")
            continue
        count = code_lines(shown.stdout)
        total += count
        print(f"{count:6d} {name}")
    print(f"{total:6d} total")


if __name__ == "__main__":
    main(sys.argv[1:])
