#!/usr/bin/env bash
# Checks that what the code and the docs cite exists. Prints file:line and why for each broken
# reference and exits 1 when there is one:
#   - a cited repository path that does not exist: a path under docs/, src/, tests/, bench/,
#     tools/ or fuzz/ (`a.{h,cc}` names both; a program built from `x.cc` may be cited as `x`),
#     a path under src/ written from its module (`model/chunk.cc`), or a bare Markdown file name
#     (looked for beside the citing file, at the top and in docs/);
#   - a cited section that the Markdown file does not have: a file name followed by a quoted
#     title (`docs/<file>.md "Title"`, also with a comma or an opening parenthesis between)
#     needs a heading `## Title` there;
#   - a cited Note that is defined nowhere: a Note is defined by `Note [Title]:` followed by its
#     text, or by a heading, a line `// Note [Title]` (or `# Note [Title]`) at the start of a
#     line with the text on the comment lines below;
#   - a Note title split across two lines (grep for the title would miss it);
#   - the word "session" in src/, docs/ or README.md: comments and docs say what the code does;
#     history belongs in bench/results/ and in commit messages.
# In code only comments are read; in Markdown and Python every line. bench/results/ records
# past runs and is not checked. Uses bash and python3's standard library only.
# Usage: tools/check_refs.sh [REPOSITORY_ROOT]
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"

exec python3 - <<'PY'
import os
import re
import subprocess
import sys

ROOTS = ("README.md", "Makefile", "CMakeLists.txt", ".ci", "docs", "src", "tests", "bench",
         "fuzz", "tools")
NOT_CHECKED = ("bench/results/",)
C_LIKE = (".h", ".cc", ".cu", ".cuh", ".inc")
HASH_LIKE = (".sh", ".cmake", ".supp", ".dict")
HASH_NAMED = ("CMakeLists.txt", "Makefile", "run")
PROSE = (".md", ".py")
NO_SESSION = ("src/", "docs/")

MODULES = ("core", "ops", "comm", "schedule", "model", "runtime", "data", "io", "cli")
# A path starts a word: not right after a letter, digit, '/', '.', '-', '$' or '{'.
START = r"(?<![\w/.$\-{])"
PATH_RE = re.compile(START + r"((?:docs|src|tests|bench|tools|fuzz)/(?:[\w./\-]|\{[\w.,]+\})*[\w/}])")
MODULE_RE = re.compile(START + r"((?:" + "|".join(MODULES) + r")/[\w/\-]+\.(?:h|cc|cu|cuh|inc))\b")
MD_RE = re.compile(START + r"([A-Za-z][\w\-]*\.md)\b")
SECTION_RE = re.compile(START + r"((?:docs/)?[\w\-]+\.md)(?:,? \(?|, )\"([^\"]+)\"")
PLACEHOLDER = re.compile(r"\*|NNN|\.\.\.|<|XXXX")
NOTE_RE = re.compile(r"Note \[([^\]]*)\]")
NOTE_DEFINED_RE = re.compile(r"Note \[([^\]]+)\]:")
NOTE_HEADING_RE = re.compile(r"^(?://|#) Note \[([^\]]+)\]$")
COMMENT_RE = re.compile(r"^\s*(?://|#)")
NOTE_WRAPPED_RE = re.compile(r"Note \[[^\]]*$")
SESSION_RE = re.compile(r"\bsessions?\b", re.IGNORECASE)


def checked_files():
    try:
        listed = subprocess.run(["git", "ls-files", "--", *ROOTS], check=True, text=True,
                                capture_output=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file
        listed = [r for r in ROOTS if os.path.isfile(r)]
        for r in ROOTS:
            for d, _, names in os.walk(r):
                listed += [os.path.join(d, n) for n in names]
    out = []
    for f in listed:
        base = os.path.basename(f)
        text = base.endswith(C_LIKE + HASH_LIKE + PROSE) or base in HASH_NAMED
        if f and text and not f.startswith(NOT_CHECKED) and os.path.isfile(f):
            out.append(f)
    return sorted(out)


def prose_of(f, line):
    """The part of `line` that is prose: a comment in code, the whole line in Markdown, Python."""
    base = os.path.basename(f)
    if base.endswith(C_LIKE):
        at = line.find("//")
        return "" if at < 0 else line[at:]
    if base.endswith(HASH_LIKE) or base in HASH_NAMED:
        m = re.search(r"(?:^|\s)#(?!include|!)", line)
        return "" if m is None else line[m.start():]
    return line


def exists(path):
    return os.path.exists(path.rstrip("/"))


def expand(path):
    m = re.search(r"\{([^}]*)\}", path)
    if m is None:
        return [path]
    return [path[:m.start()] + alt + path[m.end():] for alt in m.group(1).split(",")]


def path_exists(path):
    return all(exists(p) or exists(p + ".cc") or exists(p + ".cu") for p in expand(path))


def find_md(name, here):
    for d in (here, ".", "docs"):
        if os.path.isfile(os.path.join(d, name)):
            return os.path.join(d, name)
    return None


_headings = {}


def headings(md):
    if md not in _headings:
        found, fenced = set(), False
        with open(md, encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("```"):
                    fenced = not fenced
                elif not fenced and line.startswith("#"):
                    found.add(line.lstrip("#").strip().replace("`", "").lower())
        _headings[md] = found
    return _headings[md]


def main():
    files = checked_files()
    errors, cited, defined = [], [], set()
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                lines = fh.read().split("\n")
        except UnicodeDecodeError:
            continue
        here = os.path.dirname(f)
        for n, full in enumerate(lines, 1):
            at = f"{f}:{n}"
            line = prose_of(f, full)
            for m in PATH_RE.finditer(line):
                if not PLACEHOLDER.search(m.group(1)) and not path_exists(m.group(1)):
                    errors.append(f"{at}: cites {m.group(1)}, which does not exist")
            for m in MODULE_RE.finditer(line):
                if not any(exists(os.path.join(d, m.group(1))) for d in ("src", "tests", here)):
                    errors.append(f"{at}: cites {m.group(1)}, which is not in src/")
            for m in MD_RE.finditer(line):
                if find_md(m.group(1), here) is None:
                    errors.append(f"{at}: cites {m.group(1)}, which is not beside it, at the "
                                  f"top or in docs/")
            for m in SECTION_RE.finditer(line):
                md = find_md(m.group(1), here)
                if md is not None and m.group(2).replace("`", "").lower() not in headings(md):
                    errors.append(f"{at}: cites section \"{m.group(2)}\" of {md}, which has "
                                  f"no such heading")
            defined.update(m.group(1) for m in NOTE_DEFINED_RE.finditer(line))
            heading = NOTE_HEADING_RE.match(full)
            if heading and n < len(lines) and COMMENT_RE.match(lines[n]):
                defined.add(heading.group(1))
            cited += [(at, m.group(1)) for m in NOTE_RE.finditer(line)]
            if NOTE_WRAPPED_RE.search(line):
                errors.append(f"{at}: a Note title runs on to the next line; keep "
                              f"'Note [Title]' on one line")
            if (f.startswith(NO_SESSION) or f == "README.md") and SESSION_RE.search(full):
                errors.append(f"{at}: says 'session'; say what the code does (history goes to "
                              f"bench/results/ or the commit message)")
    for at, title in cited:
        if title not in defined:
            errors.append(f"{at}: cites Note [{title}], which is defined nowhere "
                          f"(no 'Note [{title}]:')")
    for e in errors:
        print(e)
    if errors:
        print(f"check_refs: {len(errors)} broken reference(s)", file=sys.stderr)
        return 1
    print(f"check_refs: {len(files)} files, {len(defined)} Notes; every reference resolves")
    return 0


sys.exit(main())
PY
