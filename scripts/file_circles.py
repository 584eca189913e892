#!/usr/bin/env python3
"""List the file circles of one Rust crate: files that use each other, directly or through
other files of the crate.

Usage: file_circles.py [--uses] SRC_DIR
  SRC_DIR: the crate's src/, holding lib.rs (or main.rs for a binary); exits 1 when it
  finds a circle.
  --uses: print every use between two files too.

A file uses another when its code (not its comments or strings) names an item the other
defines, by a `use` or by a path (`crate::`, `super::`, `self::`, or a child module's
name). Paths through re-exports (`pub use`) count against the file that defines the item,
so a crate root that re-exports everything is no one's dependency. `mod` declarations are
not uses. A file's inline modules (its tests) belong to the file. A method call names no
file, so an `impl` block kept apart from its type counts only where a path names it.
"""

import re
import sys
from pathlib import Path

KEYWORD_ROOTS = {"crate", "super", "self"}


def strip_code(text):
    """`text` with comments, strings and char literals blanked out (lengths kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif (m := re.match(r'(b?r)(#*)"', text[i:])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(2)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i : j + 1]))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", text[i:])):
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Module:
    def __init__(self, path, file, parent):
        self.path = path  # tuple of names from the crate root
        self.file = file
        self.parent = parent
        self.children = {}
        self.reexports = {}  # name -> absolute path tuple it re-exports
        self.code = ""


def module_file(name, own_dir):
    for candidate in (own_dir / f"{name}.rs", own_dir / name / "mod.rs"):
        if candidate.is_file():
            return candidate
    raise SystemExit(f"cannot find the file of module {name} under {own_dir}")


def build_tree(src):
    root_file = src / "lib.rs" if (src / "lib.rs").exists() else src / "main.rs"
    root = Module((), root_file, None)
    modules = {}

    def visit(module):
        modules[module.path] = module
        module.code = strip_code(module.file.read_text())
        if module.file.name in ("lib.rs", "mod.rs", "main.rs"):
            own_dir = module.file.parent
        else:
            own_dir = module.file.parent / module.file.stem
        for m in re.finditer(r"^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", module.code, re.M):
            name = m.group(1)
            child = Module(module.path + (name,), module_file(name, own_dir), module)
            module.children[name] = child
            visit(child)

    visit(root)
    return root, modules


def expand_use_tree(tree):
    """`a::{b, c::{d, self}}` -> [["a","b"], ["a","c","d"], ["a","c"]]; globs end in "*"."""
    tree = re.sub(r"\s+", "", tree)

    def parse(s, prefix):
        results = []
        depth, start, parts = 0, 0, []
        for k, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:k])
                start = k + 1
        parts.append(s[start:])
        for part in filter(None, parts):
            if "{" in part:
                head, _, rest = part.partition("{")
                head_segments = [x for x in head.split("::") if x]
                results += parse(rest[: rest.rindex("}")], prefix + head_segments)
            else:
                name = part.split(" as ")[0] if " as " in part else part
                segments = [x for x in re.sub(r"\bas\b.*", "", name).split("::") if x]
                if segments == ["self"]:
                    results.append(prefix)
                else:
                    results.append(prefix + segments)
        return results

    return parse(tree, [])


USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
PATH = re.compile(r"(?<![\w:])((?:[A-Za-z_]\w*)(?:::[A-Za-z_]\w*)+)")


def inline_spans(code):
    """The spans of a file's inline modules (`mod tests { ... }`)."""
    spans = []
    for m in re.finditer(r"\bmod\s+\w+\s*\{", code):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        spans.append((m.start(), j))
    return spans


def absolute(module, segments, inline_depth=0):
    """The path `segments` names in `module` (`inline_depth` inline modules deep), from the
    crate root; None when external."""
    if not segments:
        return None
    first = segments[0]
    base = None
    rest = list(segments)
    if first == "crate":
        base, rest = (), rest[1:]
    elif first in ("self", "super"):
        base = module.path
        while rest and rest[0] in ("self", "super"):
            if rest.pop(0) == "super":
                if inline_depth:
                    inline_depth -= 1
                else:
                    base = base[:-1]
    elif first in module.children:
        base = module.path
    else:
        return None
    return tuple(base) + tuple(rest)


def resolve(modules, path, seen=()):
    """The file that defines what `path` names (following re-exports), or None."""
    module = modules[()]
    for k, name in enumerate(path):
        if name == "*":
            return module.file
        if name in module.children:
            module = module.children[name]
            continue
        target = module.reexports.get(name)
        if target is not None and target not in seen:
            through = resolve(modules, target + tuple(path[k + 1 :]), seen + (target,))
            if through is not None:
                return through
        return module.file
    return module.file


def main():
    args = sys.argv[1:]
    show_uses = "--uses" in args
    args = [a for a in args if a != "--uses"]
    if len(args) != 1:
        raise SystemExit(__doc__)
    src = Path(args[0])
    _, modules = build_tree(src)
    # Re-exports first: `pub use` names that other files' paths go through.
    for module in modules.values():
        for m in USE.finditer(module.code):
            if not m.group(1):
                continue
            for segments in expand_use_tree(m.group(2)):
                target = absolute(module, segments)
                if target and segments[-1] != "*":
                    alias = re.search(r"\bas\s+(\w+)", m.group(2))
                    module.reexports[segments[-1]] = target
                    if alias and len(expand_use_tree(m.group(2))) == 1:
                        module.reexports[alias.group(1)] = target
    edges = {}
    for module in modules.values():
        uses = edges.setdefault(module.file, {})
        spans = inline_spans(module.code)
        depth = lambda pos: sum(start <= pos < end for start, end in spans)
        paths = []
        for m in USE.finditer(module.code):
            paths += [(segments, depth(m.start())) for segments in expand_use_tree(m.group(2))]
        for m in PATH.finditer(USE.sub(lambda u: " " * len(u.group(0)), module.code)):
            paths.append((m.group(1).split("::"), depth(m.start())))
        for segments, inline_depth in paths:
            target = absolute(module, segments, inline_depth)
            if target is None:
                continue
            file = resolve(modules, target)
            if file is not None and file != module.file:
                uses.setdefault(file, "::".join(segments))
    # Strongly connected components (Tarjan): a component of more than one file is a circle.
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in list(edges):
        if v not in index:
            connect(v)
    name = lambda f: str(f.relative_to(src))
    if show_uses:
        for f in sorted(edges, key=name):
            for g, via in sorted(edges[f].items(), key=lambda e: name(e[0])):
                print(f"{name(f)} -> {name(g)} ({via})")
    for component in circles:
        print("circle: " + ", ".join(name(f) for f in component))
        members = set(component)
        for f in component:
            for g, via in sorted(edges[f].items()):
                if g in members:
                    print(f"  {name(f)} -> {name(g)} ({via})")
    print(f"{len(modules)} files, {sum(map(len, edges.values()))} uses, {len(circles)} circle(s)")
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
