#!/usr/bin/env python3
"""scripts/check_sizes.py: its scanner on synthetic files, then the tree.

The synthetic part proves the check can fail: a function of 101 body lines
and a file of 801 lines must each be reported (exit 1), 100 body lines and
800 lines must pass, an allow-list entry must silence its finding, an entry
without a reason or no longer needed must fail. Then the repository itself
must be within the bounds (scripts/size_allow.txt).
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check_sizes.py")
failures = []


def run(root, paths, allow_text=""):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(allow_text)
        allow = f.name
    try:
        p = subprocess.run([sys.executable, SCRIPT, "--root", root, "--allow", allow, *paths],
                           capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr
    finally:
        os.unlink(allow)


def expect(name, got, want_rc, want_text=None):
    rc, out = got
    if rc != want_rc or (want_text and want_text not in out):
        failures.append(f"{name}: exit {rc} (want {want_rc}), output:\n{out}")
    else:
        print(f"ok: {name}")


def function_of(body_lines, name="f", qual=""):
    body = "".join(f"  x += {i};  // {{ not a brace: in a comment\n" for i in range(body_lines))
    return f'{qual}int {name}(int x) {{\n  const char* s = "}}";\n{body}  return x;\n}}\n'


with tempfile.TemporaryDirectory() as d:
    def write(rel, text):
        path = os.path.join(d, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    # 1 string line + N statements + return = N + 2 body lines.
    write("m/long.cpp", "namespace a {\nstruct S {\n" + function_of(99, "g", "static ") + "};\n}  // namespace a\n")
    expect("a 101-line member function is reported", run(d, ["m/long.cpp"]), 1, "long.cpp:3: g: 101 body lines")
    write("m/ok.cpp", function_of(98) + "Foo::Foo() : a_{1}, b_(2) {\n}\n")
    expect("a 100-line function passes", run(d, ["m/ok.cpp"]), 0)
    write("m/big.cpp", "// line\n" * 801)
    expect("an 801-line file is reported", run(d, ["m/big.cpp"]), 1, "big.cpp: 801 lines")
    write("m/edge.cpp", "// line\n" * 800)
    expect("an 800-line file passes", run(d, ["m/edge.cpp"]), 0)
    expect("an allow-list entry silences its function", run(d, ["m/long.cpp"], "m/long.cpp:g  a table\n"), 0)
    expect("an allow-list entry silences its file", run(d, ["m/big.cpp"], "m/big.cpp  generated\n"), 0)
    expect("an entry without a reason fails", run(d, ["m/big.cpp"], "m/big.cpp\n"), 1, "has no reason")
    expect("an entry no longer needed fails", run(d, ["m/edge.cpp"], "m/edge.cpp  once big\n"), 1, "drop the entry")

p = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
print(p.stdout, end="")
if p.returncode != 0:
    failures.append(f"the tree is over the bounds (scripts/size_allow.txt):\n{p.stdout}{p.stderr}")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
