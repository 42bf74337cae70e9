#!/usr/bin/env python3
"""Size bounds of hand-written product code.

Lists every product file over MAX_FILE_LINES lines and every C++ function
whose body is over MAX_FUNCTION_LINES lines, and exits 1 when it found any
that scripts/size_allow.txt does not name. Product code: the C++ sources and
headers (and the status page's scripts) under the module folders; tests/,
bench/, docs/ and build trees are not product code.

The function scanner is a brace matcher, not a parser: it drops comments,
string and character literals (raw strings included), then takes a `{` as a
function body when the text before it, since the previous `;`, `{` or `}` of
the same scope, ends in a parameter list (`)`, optionally followed by
qualifiers, a trailing return type or a constructor's initializer list) and
no function encloses it (a lambda inside a function counts as part of that
function). A body's size is the number of lines between its braces.

Usage: check_sizes.py [--root DIR] [--allow FILE] [--max-file N]
                      [--max-function N] [PATH...]
PATHs (files or folders, relative to the root) replace the default folders.
Allow-list lines: `PATH  REASON` (a file over the bound) or
`PATH:FUNCTION  REASON` (one function); `#` starts a comment. Every entry
needs a reason.
"""
import argparse
import os
import re
import sys

PRODUCT_DIRS = ["common", "config", "events", "fleet", "indexer", "mocker", "router", "scheduler", "sim",
                "tokenizer"]
CPP_EXT = (".cpp", ".h", ".hpp", ".cc")
OTHER_EXT = (".js", ".py", ".sh")
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100

CONTROL = {"if", "for", "while", "switch", "catch", "do", "else", "try", "return"}
SCOPE_RE = re.compile(r"\b(namespace|class|struct|union|enum)\b|^\s*extern\s+\"")
# A head ending in a parameter list: `) const noexcept override -> T` or
# `) : member_(x), base{}` (constructor initializer list).
FUNC_TAIL_RE = re.compile(r"\)\s*(?:(?:const|noexcept|override|final|mutable|volatile|&|&&)\s*|noexcept\s*\([^()]*\)\s*)*"
                          r"(?:->\s*[^;{}()]+)?$")
CTOR_INIT_RE = re.compile(r"\)\s*(?:noexcept\s*)?:(?!:)")


def strip_code(text):
    """Comments, string and character literals replaced by spaces; newlines kept."""
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
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
                                                       or text[i - 1] in "u8LU"):
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:end]))
            i = end
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):  # ' after a digit: 1'000
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def function_name(head):
    """The qualified name before the parameter list of a function head."""
    depth = 0
    for k in range(len(head) - 1, -1, -1):  # find the ( matching the ) that ends the parameters
        ch = head[k]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                m = re.search(r"([~\w:<>]*(?:operator\s*\S+?|[~\w]+))\s*$", head[:k])
                if m:
                    return m.group(1)
                return "?"
    return "?"


def classify(head):
    """'scope', 'function' or 'other' for the text before a `{`."""
    h = " ".join(head.split())
    if not h:
        return "other"
    first = re.match(r"[A-Za-z_]\w*", h)
    if first and first.group(0) in CONTROL:
        return "other"
    # Only the part after the last top-level `:` of an initializer list matters for the tail test.
    if FUNC_TAIL_RE.search(h) or CTOR_INIT_RE.search(h) and not h.rstrip().endswith("="):
        if h.endswith("]") or "=" in h.split("(")[0] and not "operator" in h:
            return "other"
        return "function"
    if SCOPE_RE.search(h) and "=" not in h:
        return "scope"
    return "other"


def scan_functions(text):
    """[(name, first_line, body_lines)] of every function body not inside another function."""
    code = strip_code(text)
    found = []
    stack = []  # (kind, line of '{', name)
    head_start = 0
    line = 1
    in_init = []  # depth marks of initializer-list braces (do not reset the head)
    for i, ch in enumerate(code):
        if ch == "\n":
            line += 1
        elif ch == "{":
            in_function = any(k == "function" for k, _, _ in stack)
            head = code[head_start:i]
            if in_function:
                kind = "inner"
            else:
                h = " ".join(head.split())
                if CTOR_INIT_RE.search(h) and re.search(r"[\w>]\s*$", h) and stack and stack[-1][0] == "scope" \
                        or CTOR_INIT_RE.search(h) and re.search(r",\s*[\w:]+\s*$|:\s*[\w:]+\s*$", h):
                    kind = "init"  # `member_{...}` inside a constructor's initializer list
                else:
                    kind = classify(head)
            name = function_name(" ".join(head.split())) if kind == "function" else ""
            stack.append((kind, line, name))
            if kind != "init":
                head_start = i + 1
        elif ch == "}":
            if not stack:
                head_start = i + 1
                continue
            kind, start, name = stack.pop()
            if kind == "function":
                found.append((name, start, line - start - 1))
            if kind != "init":
                head_start = i + 1
        elif ch == ";":
            if not stack or stack[-1][0] != "init":
                head_start = i + 1
    return found


def load_allow(path):
    allow = {}
    if not path or not os.path.exists(path):
        return allow
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            s = raw.split("#", 1)[0].strip()
            if not s:
                continue
            parts = s.split(None, 1)
            if len(parts) < 2:
                sys.exit(f"{path}:{n}: entry `{parts[0]}` has no reason")
            allow[parts[0]] = parts[1]
    return allow


def product_files(root, paths):
    for p in paths:
        full = os.path.join(root, p)
        if os.path.isfile(full):
            yield p
            continue
        for dirpath, dirnames, filenames in os.walk(full):
            dirnames[:] = sorted(d for d in dirnames if d not in ("node_modules", "__pycache__")
                                 and not d.startswith("build"))
            for fn in sorted(filenames):
                if fn.endswith(CPP_EXT + OTHER_EXT):
                    yield os.path.relpath(os.path.join(dirpath, fn), root)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--root", default=os.path.dirname(here))
    ap.add_argument("--allow", default=os.path.join(here, "size_allow.txt"))
    ap.add_argument("--max-file", type=int, default=MAX_FILE_LINES)
    ap.add_argument("--max-function", type=int, default=MAX_FUNCTION_LINES)
    ap.add_argument("paths", nargs="*")
    args = ap.parse_args()
    allow = load_allow(args.allow)
    used = set()
    over = []
    files = 0
    functions = 0
    for rel in product_files(args.root, args.paths or PRODUCT_DIRS):
        files += 1
        with open(os.path.join(args.root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        lines = text.count("\n")
        if lines > args.max_file:
            if rel in allow:
                used.add(rel)
            else:
                over.append(f"{rel}: {lines} lines (file bound {args.max_file})")
        if not rel.endswith(CPP_EXT):
            continue
        for name, start, body in scan_functions(text):
            functions += 1
            if body <= args.max_function:
                continue
            key = f"{rel}:{name}"
            if key in allow or rel in allow:
                used.add(key if key in allow else rel)
            else:
                over.append(f"{rel}:{start}: {name}: {body} body lines (function bound {args.max_function})")
    stale = sorted(set(allow) - used)
    for s in over:
        print(s)
    for s in stale:
        print(f"{args.allow}: `{s}` is within the bounds or gone: drop the entry")
    print(f"check_sizes: {files} files, {functions} functions scanned; {len(over)} over the bounds, "
          f"{len(used)} allowed, {len(stale)} stale allow-list entries")
    return 1 if over or stale else 0


if __name__ == "__main__":
    sys.exit(main())
