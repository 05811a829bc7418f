#!/usr/bin/env bash
# Code size of the workspace's production code: for every crate, its longest function and its
# longest source file, then every function longer than MAX_FN lines and every file longer than
# MAX_FILE lines. Exits 1 when there is any such offender, 0 otherwise.
#
# Production code: the `.rs` files of a member crate outside its `tests/` and `benches/`
# folders, without the items marked `#[cfg(test)]` (the `mod tests` blocks, and the files a
# `#[cfg(test)] mod name;` declares). The e2e crate (folder `tests/`) is test support, measured
# only when named by --crate. A function's length runs from its `fn` line to its closing brace;
# a file's length is its line count less its test items. Comments and string literals are
# skipped when matching braces.
#
# Usage: scripts/code-size.sh [--crate NAME]... [--max-fn N] [--max-file N]
#   --crate NAME  only that member crate (by package name or folder); repeatable.
set -euo pipefail
cd "$(dirname "$0")/.."

crates=()
max_fn=120
max_file=1000
while [ $# -gt 0 ]; do
    case "$1" in
        --crate) crates+=("${2:?--crate needs a name}"); shift 2 ;;
        --max-fn) max_fn="${2:?--max-fn needs a number}"; shift 2 ;;
        --max-file) max_file="${2:?--max-file needs a number}"; shift 2 ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "code-size: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

exec python3 - "$max_fn" "$max_file" "${crates[@]+"${crates[@]}"}" <<'PY'
import os
import re
import sys

max_fn, max_file = int(sys.argv[1]), int(sys.argv[2])
wanted = set(sys.argv[3:])


def members():
    """(package name, folder) of each workspace member, from the root Cargo.toml."""
    text = open("Cargo.toml", encoding="utf-8").read()
    found = re.search(r"members\s*=\s*\[(.*?)\]", text, re.S)
    if not found:
        sys.exit("code-size: no workspace members in Cargo.toml")
    out = []
    for folder in re.findall(r'"([^"]+)"', found.group(1)):
        manifest = open(os.path.join(folder, "Cargo.toml"), encoding="utf-8").read()
        name = re.search(r'^\s*name\s*=\s*"([^"]+)"', manifest, re.M)
        out.append((name.group(1) if name else folder, folder))
    return out


def mask(src):
    """`src` with comments, strings and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif (raw := re.match(r'b?r(#*)"', src[i:i + 260])) and (
            i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")
        ):
            end = '"' + raw.group(1)
            j = src.find(end, i + raw.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}', '{'), not a lifetime ('a).
            lit = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", src[i:i + 12])
            if lit:
                out.append(" " * lit.end())
                i += lit.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(code, start):
    """Index just past the item starting at `start`: its matching `}` or a `;` before any `{`."""
    depth = 0
    for j in range(start, len(code)):
        ch = code[j]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return j + 1
        elif ch == ";" and depth == 0:
            return j + 1
    return len(code)


FN = re.compile(
    r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?(?:default\s+)?(?:const\s+)?(?:async\s+)?"
    r'(?:unsafe\s+)?(?:extern\s+"[^"]*"\s+)?fn\s+(\w+)',
    re.M,
)
CFG_TEST = re.compile(r"#\[cfg\(test\)\]")


TEST_MOD_FILE = re.compile(r"\A\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
# Files declared as `#[cfg(test)] mod name;`: test code in a file of its own.
test_files = set()


def module_dir(path):
    """The folder where the modules `path` declares live."""
    base = os.path.basename(path)
    if base in ("lib.rs", "main.rs", "mod.rs"):
        return os.path.dirname(path)
    return os.path.splitext(path)[0]


def measure(path):
    """(production lines, [(fn name, first line, lines)]) of one file."""
    src = open(path, encoding="utf-8", errors="replace").read()
    code = mask(src)
    line_of = lambda index: code.count("\n", 0, index) + 1
    test_spans = []
    for hit in CFG_TEST.finditer(code):
        end = block_end(code, hit.end())
        test_spans.append((hit.start(), end))
        declared = TEST_MOD_FILE.match(code[hit.end():end])
        if declared:
            folder = module_dir(path)
            test_files.add(os.path.join(folder, declared.group(1) + ".rs"))
            test_files.add(os.path.join(folder, declared.group(1), "mod.rs"))
    in_test = lambda index: any(a <= index < b for a, b in test_spans)
    total = src.count("\n") + (0 if src.endswith("\n") or not src else 1)
    test_lines = sum(line_of(b - 1) - line_of(a) + 1 for a, b in test_spans)
    fns = []
    for hit in FN.finditer(code):
        if in_test(hit.start()):
            continue
        end = block_end(code, hit.start())
        if code[end - 1] != "}":
            continue  # a declaration without a body
        fns.append((hit.group(1), line_of(hit.start()), line_of(end - 1) - line_of(hit.start()) + 1))
    return total - test_lines, fns


def sources(folder):
    for root, dirs, files in os.walk(folder):
        rel = os.path.relpath(root, folder)
        parts = [] if rel == "." else rel.split(os.sep)
        dirs[:] = sorted(
            d for d in dirs
            if not (not parts and d in ("tests", "benches", "target")) and not d.startswith(".")
        )
        for name in sorted(files):
            if name.endswith(".rs"):
                yield os.path.join(root, name)


# The e2e crate (folder `tests/`) is test support: its library is the harness, the fake model
# and the scenario bodies the integration tests share, built only for tests. It is measured
# only when named with --crate (docs/decisions/repo.md#D-REPO-03).
TEST_SUPPORT = {"tests"}
crates = [
    (n, f) for n, f in members()
    if (n in wanted or f in wanted) or (not wanted and f not in TEST_SUPPORT)
]
unknown = wanted - {n for n, _ in crates} - {f for _, f in crates}
if unknown:
    sys.exit(f"code-size: no member crate named {', '.join(sorted(unknown))}")

long_fns, long_files = [], []
print(f"{'crate':<14} {'longest fn (lines)':<58} longest file (production lines)")
for name, folder in crates:
    best_fn, best_file = None, None
    measured = [(path, measure(path)) for path in sources(folder)]
    for path, (lines, fns) in measured:
        if path in test_files:
            continue
        if best_file is None or lines > best_file[1]:
            best_file = (path, lines)
        if lines > max_file:
            long_files.append((lines, path))
        for fn_name, line, length in fns:
            where = f"{path}:{line} {fn_name}"
            if best_fn is None or length > best_fn[1]:
                best_fn = (where, length)
            if length > max_fn:
                long_fns.append((length, where))
    fn_text = f"{best_fn[1]:>5}  {best_fn[0]}" if best_fn else "    -"
    file_text = f"{best_file[1]:>5}  {best_file[0]}" if best_file else "    -"
    print(f"{name:<14} {fn_text:<58} {file_text}")

print()
print(f"functions over {max_fn} lines: {len(long_fns)}")
for length, where in sorted(long_fns, reverse=True):
    print(f"  {length:>5}  {where}")
print(f"files over {max_file} production lines: {len(long_files)}")
for lines, path in sorted(long_files, reverse=True):
    print(f"  {lines:>5}  {path}")
sys.exit(1 if long_fns or long_files else 0)
PY
