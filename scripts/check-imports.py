#!/usr/bin/env python3
"""Finds import circles between the files of each crate (house style: each folder reads top-down).

For every crate in the workspace, every `.rs` file under `src/` is a module (`lib.rs`/`main.rs` is the
crate root, `a/mod.rs` and `a.rs` are `crate::a`, `a/b.rs` is `crate::a::b`). A file depends on another
when it names a path inside it: `use crate::x::y`, `use super::z`, `self::`, or an inline `crate::a::b`
in code. A path resolves to the deepest module file it names, so `use super::Thing` from `a/b.rs` is an
edge to `a/mod.rs` (the parent), while `use super::c::Thing` is an edge to the sibling `a/c.rs`. Inline
`mod name { ... }` blocks count as part of their file, except `#[cfg(test)]` modules: a unit test may
drive its module through any layer. Edges from a file to itself are ignored.

A circle (a strongly connected component of more than one file) fails the check. `mod x;` declarations
and `pub use` re-exports are not imports: a parent may declare and re-export its children (that is its
table of contents), and a path through a re-export resolves to the file that defines the item. What a
parent must not do is define something its children use and also use its children.

Usage: scripts/check-imports.py [CRATE_DIR ...]   (default: every workspace member)
Exit status: 0 no circles, 1 circles found (each printed with the edges that close it).
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def workspace_members():
    text = open(os.path.join(ROOT, "Cargo.toml")).read()
    m = re.search(r"members\s*=\s*\[(.*?)\]", text, re.S)
    return [s.strip().strip('"') for s in m.group(1).split(",") if s.strip().strip('"')]


def strip_comments_and_strings(src):
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if src[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j + 1
        elif c == "'":
            # char literal ('a', '\n', '\u{..}') or lifetime ('a)
            m = re.match(r"'(\\.[^']*|[^\\'])'", src[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_files(crate_dir):
    """Maps module path tuples to files, for the library and for each binary root."""
    src = os.path.join(crate_dir, "src")
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, src)[:-3].split(os.sep)
            if rel[0] == "bin":
                continue  # binaries are roots of their own; they import the library by name
            if rel[-1] in ("lib", "main") and len(rel) == 1:
                path = ()
            elif rel[-1] == "mod":
                path = tuple(rel[:-1])
            else:
                path = tuple(rel)
            mods[path] = full
    return mods


TOKEN = re.compile(r"#\[cfg\(test\)\]\s*mod\s+[A-Za-z_][A-Za-z0-9_]*\s*\{|\bpub(?:\s*\([^)]*\))?\s+use\b[^;]*;|\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{|[{}]|\buse\b[^;]*;|(?<![A-Za-z0-9_:])[A-Za-z_][A-Za-z0-9_]*(?:\s*::\s*(?:[A-Za-z_][A-Za-z0-9_]*|\{))+")


def expand_use(body):
    """Expands a use tree (`a::{b::C, d}`) into a list of paths (lists of segments)."""
    body = re.sub(r"\s+as\s+(?=\w)", "@", body)
    body = re.sub(r"\s+", "", body)

    def parse(s, i, prefix, out):
        seg, segs = "", list(prefix)
        while i < len(s):
            c = s[i]
            if c == ":" and s.startswith("::", i):
                if seg:
                    segs.append(seg)
                seg, i = "", i + 2
            elif c == "{":
                i = parse(s, i + 1, segs + ([seg] if seg else []), out)
                seg = None
            elif c in ",}":
                if seg:
                    out.append(segs + [seg])
                if c == "}":
                    return i + 1
                seg, segs, i = "", list(prefix), i + 1
            else:
                if seg is None:
                    seg = ""
                seg += c
                i += 1
        if seg:
            out.append(segs + [seg])
        return i

    out = []
    parse(body, 0, [], out)
    return out


def resolve(segs, here, mods):
    """Resolves a path used in module `here` to the deepest module file it names, or None."""
    if not segs:
        return None
    base = list(here)
    i = 0
    if segs[0] == "crate":
        base, i = [], 1
    elif segs[0] in ("super", "self"):
        while i < len(segs) and segs[i] in ("super", "self"):
            if segs[i] == "super":
                if not base:
                    return None
                base.pop()
            i += 1
    elif tuple(base) + (segs[0],) not in mods:
        return None  # an external crate, std, or an item of this module
    path = tuple(base)
    best = path if path in mods else None
    item = None
    for s in segs[i:]:
        path = path + (s,)
        if path in mods:
            best = path
        else:
            item = s
            break
    # An item the module only re-exports (`pub use child::Item;`) lives where it is defined.
    seen = set()
    while best is not None and item is not None and (best, item) in REEXPORTS and (best, item) not in seen:
        seen.add((best, item))
        best, item = REEXPORTS[(best, item)]
    return best


REEXPORTS = {}  # (module, name) -> (module it comes from, name there)


def collect_reexports(mods):
    REEXPORTS.clear()
    for modpath, file in mods.items():
        src = strip_comments_and_strings(open(file).read())
        for m in re.finditer(r"\bpub(?:\s*\([^)]*\))?\s+use\b([^;]*);", src):
            body = m.group(1).strip()
            for segs in expand_use_named(body):
                orig, name = segs
                if not orig or orig[-1] in ("*", "self"):
                    continue
                rel = list(orig[:-1])
                if rel and rel[0] not in ("crate", "super", "self"):
                    rel = ["self"] + rel
                if not rel:
                    continue
                target = resolve_module(rel, modpath, mods)
                if target is not None and target != modpath:
                    REEXPORTS[(modpath, name)] = (target, orig[-1])


def resolve_module(segs, here, mods):
    base, i = list(here), 0
    if segs[0] == "crate":
        base, i = [], 1
    while i < len(segs) and segs[i] in ("super", "self"):
        if segs[i] == "super":
            if not base:
                return None
            base.pop()
        i += 1
    path = tuple(base) + tuple(segs[i:])
    return path if path in mods else None


def expand_use_named(body):
    """Like expand_use, but keeps `as` renames: a list of (path segments, name bound here)."""
    out = []
    for segs in expand_use(re.sub(r"\s+as\s+", "@", body)):
        last = segs[-1]
        if "@" in last:
            orig, name = last.split("@", 1)
            out.append((segs[:-1] + [orig], name))
        else:
            out.append((segs, last))
    return out


def crate_edges(crate_dir):
    mods = module_files(crate_dir)
    collect_reexports(mods)
    edges = {}
    for modpath, file in mods.items():
        src = strip_comments_and_strings(open(file).read())
        stack = []  # (inline module name or None, ...) per open brace
        inline = []
        deps = set()
        skip_depth = None  # brace depth at which a #[cfg(test)] module opened
        for m in TOKEN.finditer(src):
            t = m.group(0)
            if t.startswith("#[cfg(test)]"):
                stack.append("#test")
                inline.append("tests")
                if skip_depth is None:
                    skip_depth = len(stack)
                continue
            if m.group(1):
                stack.append(m.group(1))
                inline.append(m.group(1))
                continue
            if t == "{":
                stack.append(None)
                continue
            if t == "}":
                if skip_depth is not None and len(stack) == skip_depth:
                    skip_depth = None
                if stack and stack.pop() is not None:
                    inline.pop()
                continue
            if skip_depth is not None:
                continue  # unit tests may use any layer: they are not part of the layering
            here = modpath + tuple(inline)
            if t.startswith("pub"):
                continue  # a re-export is the module's table of contents, not a dependency
            if t.startswith("use"):
                body = t[3:-1].strip()
                if body.startswith("::"):
                    continue
                paths = expand_use(body)
            else:
                paths = [re.sub(r"\s+", "", t).rstrip(":{").split("::")]
            for segs in paths:
                segs = [s.split("@")[0] for s in segs if s and s != "*"]
                target = resolve(segs, here, mods)
                if target is not None and target != modpath:
                    deps.add(target)
        edges[modpath] = deps
    return mods, edges


def sccs(nodes, edges):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return out


def main():
    crates = sys.argv[1:] or workspace_members()
    bad = 0
    for c in crates:
        crate_dir = os.path.join(ROOT, c)
        if not os.path.isdir(os.path.join(crate_dir, "src")):
            continue
        mods, edges = crate_edges(crate_dir)
        for comp in sccs(list(mods), edges):
            if len(comp) < 2:
                continue
            bad += 1
            names = sorted(os.path.relpath(mods[m], ROOT) for m in comp)
            print(f"import circle in {c}: {' '.join(names)}")
            inside = set(comp)
            for m in sorted(comp):
                for d in sorted(edges[m] & inside):
                    print(f"    {os.path.relpath(mods[m], ROOT)} -> {os.path.relpath(mods[d], ROOT)}")
    if bad:
        print(f"check-imports: {bad} circle(s); make each folder read top-down (import siblings by name, "
              f"keep shared types in a leaf file)")
        return 1
    print(f"check-imports: no import circles in {len(crates)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
