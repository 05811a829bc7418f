#!/usr/bin/env python3
"""Import loops and upward imports between the source files of each workspace crate.

For every crate root (src/lib.rs, src/main.rs, src/bin/*.rs) the script follows the `mod name;`
declarations to the files of its module tree, then reads each file's paths that stay inside the
crate (`crate::…`, `super::…`, `self::…`, and paths starting at a module the file declares) and
draws an edge from the file to the file that defines the item the path names. A path is resolved
through the `use` imports of the file it passes through (so `crate::Error`, re-exported by lib.rs
from `error.rs`, points at `error.rs`, not at lib.rs). The crate root itself (lib.rs, main.rs,
a bin's file) is left out of both checks: it is the crate's table of contents and its
crate-wide vocabulary (an `Error` every module returns), named from everywhere. Test code is left out: `#[cfg(test)]` items
and the files a `#[cfg(test)] mod name;` declares.

It reports, per crate:
  - loops: groups of files that import each other, directly or around a loop (strongly connected
    components of the file graph with more than one file), each with one loop spelled out;
  - upward imports: a file naming an item defined in a file above it in the module tree (its
    parent `mod.rs` or `name.rs`, or further up). The `mod child;` declaration itself is not an
    import, so a parent using its children is the normal direction, and a child using its parent's
    own items is "up": move the shared piece down into a module both import.

Exit status: 0, unless --strict is given and some crate has a loop or an upward import (1).

Usage: scripts/module-deps.py [--crate NAME]... [--strict] [--edges]
  --crate NAME  only that member crate (package name or folder); repeatable.
  --strict      exit 1 when any loop or upward import is found.
  --edges       also print every file-to-file edge.
"""
import argparse
import os
import re
import sys

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def members():
    """(package name, folder) of each workspace member, from the root Cargo.toml."""
    text = open("Cargo.toml", encoding="utf-8").read()
    found = re.search(r"members\s*=\s*\[(.*?)\]", text, re.S)
    if not found:
        sys.exit("module-deps: no workspace members in Cargo.toml")
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


CFG_TEST = re.compile(r"#\[cfg\((?:test|all\(test[^\]]*)\)\]")
MOD_DECL = re.compile(r"(?:^|[;}\]\s])(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
PATH_ATTR = re.compile(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;')
USE = re.compile(r"(?:^|[;{}\]\s])(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
PATH = re.compile(r"(?<![\w:])((?:crate|super|self|r#\w+|\w+)(?:\s*::\s*(?:\w+|\*))+)")


def without_tests(code):
    """`code` with the `#[cfg(test)]` items blanked, and the names of test modules it declares."""
    test_mods = set()
    spans = []
    for hit in CFG_TEST.finditer(code):
        end = block_end(code, hit.end())
        spans.append((hit.start(), end))
        declared = re.match(r"\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;",
                            code[hit.end():end])
        if declared:
            test_mods.add(declared.group(1))
    out = list(code)
    for a, b in spans:
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "
    return "".join(out), test_mods


def parse_use(text):
    """[(path segments, bound name)] of one `use` statement's tree (spaces kept for `as`)."""
    text = " ".join(text.split())
    out = []

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        parts.append(cur)
        return [p.strip() for p in parts if p.strip()]

    def walk(prefix, s):
        for part in split_top(s):
            brace = part.find("{")
            if brace >= 0:
                head = [x.strip() for x in part[:brace].split("::") if x.strip()]
                walk(prefix + head, part[brace + 1:part.rfind("}")])
                continue
            alias = None
            m = re.match(r"^(.*?)\s+as\s+(\w+)$", part)
            if m:
                part, alias = m.group(1), m.group(2)
            segs = [x.strip() for x in part.split("::") if x.strip()]
            if not segs:
                continue
            if segs[-1] == "self":
                segs = segs[:-1]
                if not segs:
                    continue
            bound = alias or segs[-1]
            out.append((prefix + segs, bound))

    walk([], text.lstrip(":"))
    return out


class Crate:
    """The module tree of one crate root: module path (tuple) -> file facts."""

    def __init__(self, root_file):
        self.files = {}  # module path -> dict(path=, code=, children=set(), uses={name: abs})
        self.load((), root_file, is_root=True)

    def load(self, modpath, file, is_root=False):
        if modpath in self.files or not os.path.exists(file):
            return
        src = open(file, encoding="utf-8", errors="replace").read()
        code, test_mods = without_tests(mask(src))
        base = os.path.basename(file)
        if is_root or base == "mod.rs":
            folder = os.path.dirname(file)
        else:
            folder = os.path.splitext(file)[0]
        info = {"path": file, "code": code, "children": set(), "uses": {}, "globs": []}
        self.files[modpath] = info
        explicit = {}
        for hit in PATH_ATTR.finditer(src):
            explicit[hit.group(2)] = os.path.join(os.path.dirname(file), hit.group(1))
        for hit in MOD_DECL.finditer(code):
            name = hit.group(1)
            if name in test_mods:
                continue
            info["children"].add(name)
            if name in explicit:
                candidates = [explicit[name]]
            else:
                candidates = [os.path.join(folder, name + ".rs"),
                              os.path.join(folder, name, "mod.rs")]
            for cand in candidates:
                if os.path.exists(cand):
                    self.load(modpath + (name,), cand)
                    break
        for hit in USE.finditer(code):
            for segs, bound in parse_use(hit.group(1)):
                absolute = self.absolute(modpath, segs)
                if absolute is None:
                    continue
                if bound == "*":
                    info["globs"].append(absolute[:-1])
                else:
                    info["uses"][bound] = absolute

    def absolute(self, modpath, segs):
        """`segs` as a path from the crate root, or None when it leaves the crate."""
        segs = [s[2:] if s.startswith("r#") else s for s in segs]
        if not segs:
            return None
        head = segs[0]
        if head == "crate":
            return tuple(segs[1:])
        if head in ("self", "super"):
            cur = list(modpath)
            k = 0
            while k < len(segs) and segs[k] in ("self", "super"):
                if segs[k] == "super":
                    if not cur:
                        return None
                    cur.pop()
                k += 1
            return tuple(cur) + tuple(segs[k:])
        info = self.files.get(modpath)
        if info is not None and head in info["children"]:
            return tuple(modpath) + tuple(segs)
        return None

    def resolve(self, path, depth=0):
        """The module path of the file defining the item `path` names."""
        best = ()
        for k in range(len(path), -1, -1):
            if tuple(path[:k]) in self.files:
                best = tuple(path[:k])
                break
        rest = path[len(best):]
        if rest and depth < 16:
            info = self.files[best]
            target = info["uses"].get(rest[0])
            if target is not None and target != tuple(best) + (rest[0],):
                return self.resolve(tuple(target) + tuple(rest[1:]), depth + 1)
        return best

    def edges(self):
        """{from module path: set(to module path)} over the files of this tree."""
        out = {m: set() for m in self.files}
        for modpath, info in self.files.items():
            code = info["code"]
            refs = []
            for hit in USE.finditer(code):
                for segs, bound in parse_use(hit.group(1)):
                    absolute = self.absolute(modpath, segs)
                    if absolute is not None:
                        refs.append(absolute[:-1] if bound == "*" else absolute)
            for hit in PATH.finditer(code):
                segs = [s.strip() for s in hit.group(1).split("::")]
                absolute = self.absolute(modpath, segs)
                if absolute is not None:
                    refs.append(tuple(s for s in absolute if s != "*"))
            for ref in refs:
                target = self.resolve(ref)
                if target != modpath:
                    out[modpath].add(target)
        return out


def sccs(graph):
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def one_loop(graph, comp):
    """A shortest loop through the first node of `comp`, inside `comp` (breadth first)."""
    members_ = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node]):
            if nxt not in members_:
                continue
            if nxt == start:
                path = [node]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if nxt not in prev:
                prev[nxt] = node
                queue.append(nxt)
    return comp


def roots(folder):
    src = os.path.join(folder, "src")
    out = []
    for name in ("lib.rs", "main.rs"):
        if os.path.exists(os.path.join(src, name)):
            out.append(os.path.join(src, name))
    bins = os.path.join(src, "bin")
    if os.path.isdir(bins):
        for name in sorted(os.listdir(bins)):
            full = os.path.join(bins, name)
            if name.endswith(".rs"):
                out.append(full)
            elif os.path.exists(os.path.join(full, "main.rs")):
                out.append(os.path.join(full, "main.rs"))
    return out


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--crate", action="append", default=[])
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--edges", action="store_true")
    args = parser.parse_args()
    wanted = set(args.crate)
    crates = [(n, f) for n, f in members() if not wanted or n in wanted or f in wanted]
    unknown = wanted - {n for n, _ in crates} - {f for _, f in crates}
    if unknown:
        sys.exit(f"module-deps: no member crate named {', '.join(sorted(unknown))}")

    total_loops = total_up = 0
    summary = []
    details = []
    for name, folder in crates:
        loops, ups, files = [], [], 0
        for root in roots(folder):
            tree = Crate(root)
            graph = tree.edges()
            files += len(tree.files)
            label = lambda m, t=tree: t.files[m]["path"][len(folder) + 1:]
            if args.edges:
                for a in sorted(graph):
                    for b in sorted(graph[a]):
                        details.append(f"  edge {name}: {label(a)} -> {label(b)}")
            # The crate root is the crate's table of contents (its `mod` lines, re-exports and the
            # crate-wide vocabulary such as `Error`): every file may name it, so it is left out.
            graph = {a: {b for b in bs if b != ()} for a, bs in graph.items() if a != ()}
            for comp in sccs(graph):
                shown = one_loop(graph, comp)
                rest = [label(m) for m in comp if m not in shown]
                loops.append(" -> ".join(label(m) for m in shown) + f"  ({len(comp)} files"
                             + (f"; also {', '.join(rest)})" if rest else ")"))
            for a in sorted(graph):
                for b in sorted(graph[a]):
                    if len(b) < len(a) and a[:len(b)] == b:
                        ups.append(f"{label(a)} -> {label(b)}")
        total_loops += len(loops)
        total_up += len(ups)
        summary.append(f"{name:<14} {files:>5} {len(loops):>6} {len(ups):>9}")
        for text in loops:
            details.append(f"  loop {name}: {text}")
        for text in ups:
            details.append(f"  up   {name}: {text}")

    print(f"{'crate':<14} {'files':>5} {'loops':>6} {'upward':>9}")
    for line in summary:
        print(line)
    print()
    print(f"import loops: {total_loops}")
    print(f"upward imports: {total_up}")
    for line in details:
        print(line)
    if args.strict and (total_loops or total_up):
        sys.exit(1)


if __name__ == "__main__":
    main()
