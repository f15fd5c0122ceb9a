#!/usr/bin/env python3
"""check_docs.py on a small tree made here: each kind of stale reference
must be reported on its own line (with the doc's line number), a doc whose
references hold must pass, and --fix must rewrite line ranges and model
blocks so that a second check passes.

    test_check_docs.py CHECK_DOCS
"""
import os
import shutil
import stat
import subprocess
import sys
import tempfile

CHECK = sys.argv[1]
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)
    return cond


C_SRC = """\
/* a file of the tree */
#include <stddef.h>

#define WIDTH 4

typedef struct ring_plan {
  int t0, t1;
} ring_plan;

static int helper(int a,
                  int b) {
  return a + b;
}

int walk_ring(int n) {
  int s = 0;
  for (int i = 0; i < n; i++) s = helper(s, i);
  return s;
}

const int table_of_things[2] = {
    1,
    2,
};

int brg_walk(void) { return walk_ring(3); }
"""
# walk_ring: lines 15-19; helper: 10-13; ring_plan: 6-8; table_of_things: 21-24

PY_SRC = """\
#!/usr/bin/python3
def outer(x):
    def inner():
        return x

    return inner


class Thing:
    pass
"""
# outer: 2-6; inner: 3-4; Thing: 9-10

MODEL = """\
#!/usr/bin/python3
import sys
print("# model of", " ".join(sys.argv[1:]))
print("    size   ring")
print("      4K   %d us" % (len(sys.argv) * 10))
"""

GOOD = """\
# A doc

The walk is [`walk_ring`](../src/ring.c#L15-L19) and its
[`helper`](../src/ring.c#L10-L13); `ring_plan`, `table_of_things` and
`WIDTH` in [src/ring.c](../src/ring.c). `outer` and `inner` in
`tools/tool.py`; [`Thing`](../tools/tool.py#L9-L10). See `src/ring.c` and
[the folder](../src/).

<!-- model: predict --hosts 2 -->
```
# model of predict --hosts 2
    size   ring
      4K   40 us
```

```
`not_checked_here` inside a code block
```

brg_walk() walks; tools/tool.py and ring.c exist.
"""

# the line of GOOD that names files and a function in prose
LAST = GOOD.split("\n").index("brg_walk() walks; tools/tool.py and ring.c exist.") + 1


def make_tree(root, doc):
    for d in ("src", "tools", "docs", "bench"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for path, text in (("src/ring.c", C_SRC), ("tools/tool.py", PY_SRC), ("bench/model", MODEL),
                       ("docs/a.md", doc)):
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    os.chmod(os.path.join(root, "bench/model"), stat.S_IRWXU)


def run(root, *extra):
    p = subprocess.run([sys.executable, CHECK, "--root", root] + list(extra),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    return p.returncode, p.stdout


# A bench/model whose `formulas --tsv` prints ring and rhd times on one
# host, worked out here from the textbook forms (not from the checker).
FORMULA_MODEL = """\
#!/usr/bin/python3
import math
a, b = 1e-5, 1e-9
print("# a=%r b=%r a_l=%r b_l=%r a_n=5e-05 b_n=4e-09 K=1 s=131072 small=4096" % (a, b, a, b))
for n in (2, 3, 4):
    for S in (8, 1 << 20):
        print("ring\\t1\\t%d\\t%d\\t%r" % (n, S, 2 * (n - 1) * a + 2 * (n - 1) / n * S * b))
        p = 1 << (n.bit_length() - 1)
        t = 2 * math.log2(p) * a + 2 * (p - 1) / p * S * b + (2 * a + 2 * S * b if n > p else 0)
        print("rhd\\t1\\t%d\\t%d\\t%r" % (n, S, t))
"""

FORMULA_DOC = """\
# Costs

<!-- formulas: --ranks 2,3,4 -->
| plan | when | time | notes |
|---|---|---|---|
| `ring` | | `2(N-1)·α + 2(N-1)/N·S·β` | the ring |
| `rhd` | `N = P` | `2·log₂N·α + 2(N-1)/N·S·β` | a power of two |
| `rhd` | `N > P` | `2(log₂P + 1)·α + 2(P-1)/P·S·β + 2S·β` | folded |
| binomial tree | | 2·log₂N·(α + S·β) | not checked: no plan |
"""


def formula_checks(root):
    """The closed-form table: right formulas pass; a wrong one, a missing
    plan, overlapping conditions and a formula that does not parse are each
    reported at their line."""
    make_tree(root, FORMULA_DOC)
    with open(os.path.join(root, "bench/model"), "w") as f:
        f.write(FORMULA_MODEL)
    rc, out = run(root)
    check(rc == 0, f"formulas: a right table fails: {out}")
    cases = {
        "wrong": (FORMULA_DOC.replace("`2(N-1)·α + 2(N-1)/N·S·β` | the ring",
                                      "`(N-1)·α + 2(N-1)/N·S·β` | the ring"),
                  "docs/a.md:6: `ring` at 1x2 ranks, S = 8: `(N-1)·α + 2(N-1)/N·S·β` gives"),
        "missing": ("\n".join(l for l in FORMULA_DOC.split("\n") if "`rhd`" not in l),
                    "docs/a.md:3: the table has no row for `rhd`"),
        "overlap": (FORMULA_DOC.replace("| `N > P` |", "| `N >= P` |"),
                    "docs/a.md:3: 2 rows of `rhd` apply at 1x2 ranks"),
        "parse": (FORMULA_DOC.replace("+ 2S·β` | folded", "+` | folded"),
                  "docs/a.md:8: `2(log₂P + 1)·α + 2(P-1)/P·S·β +` does not evaluate"),
    }
    for name, (doc, want) in cases.items():
        make_tree(root, doc)
        with open(os.path.join(root, "bench/model"), "w") as f:
            f.write(FORMULA_MODEL)
        rc, out = run(root)
        check(rc == 1 and want in out and "Traceback" not in out,
              f"formulas {name}: expected '{want}', got exit {rc}: {out}")
HEADER = """\
/*
 * Who does what in runtime/, one folder per floor, from the top floor down.
 *
 * top/      what calls
 *   a.c         calls b.c
 * low/      what is called
%s */
"""


def floors(root):
    for d in ("runtime/core", "runtime/top", "runtime/low"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    with open(os.path.join(root, "runtime/top/a.c"), "w") as f:
        f.write("/* a */\nint brg__a(void) {\n  return brg__b() + brg__same();\n}\n")
    with open(os.path.join(root, "runtime/low/b.c"), "w") as f:
        f.write("int brg__b(void) {\n  return 1;\n}\n\nstatic int brg__same(void) {\n  "
                "return 2;\n}\n")

    def with_list(entries):
        with open(os.path.join(root, "runtime/core/internal.h"), "w") as f:
            f.write(HEADER % entries)
        return run(root)

    rc, out = with_list(" *   b.c         called\n")
    check(rc == 0, f"floors in order: exit {rc}: {out}")
    # low/ listed above top/: the call of top/ runs up
    with open(os.path.join(root, "runtime/core/internal.h"), "w") as f:
        f.write(HEADER.replace(" * top/      what calls\n *   a.c         calls b.c\n", "") %
                (" *   b.c         called\n * top/      what calls\n *   a.c         calls\n"))
    rc, out = run(root)
    check(rc == 1 and "runtime/top/a.c: calls brg__b of runtime/low/b.c" in out
          and "brg__same" not in out, f"a call up a floor: {out}")
    rc, out = with_list("")
    check(rc == 1 and "runtime/low/b.c: stands on no floor" in out, f"an unlisted file: {out}")
    rc, out = with_list(" *   b.c         called\n *   c.c         gone\n")
    check(rc == 1 and "lists runtime/low/c.c, which is no file" in out,
          f"a listed file gone: {out}")
    shutil.rmtree(os.path.join(root, "runtime"))


def main():
    with tempfile.TemporaryDirectory(prefix="check-docs-") as root:
        make_tree(root, GOOD)
        rc, out = run(root)
        print(out)
        check(rc == 0 and "0 problem(s)" in out, f"a doc whose references hold: exit {rc}")

        bad_lines = {
            "range": (3, "[`walk_ring`](../src/ring.c#L14-L19)", "walk_ring is lines 15-19"),
            "gone_fn": (4, "`no_such_fn` in [src/ring.c](../src/ring.c)",
                        "no_such_fn is not defined in src/ring.c"),
            "list": (5, "`outer`, `ghost` and `inner` in `tools/tool.py`",
                     "ghost is not defined in tools/tool.py"),
            "file": (6, "[gone](../src/gone.c)", "src/gone.c, which does not exist"),
            "path": (7, "see `src/gone.h` here", "`src/gone.h` does not exist"),
            "ident": (8, "the setting `BRIGADE_NO_SUCH_THING`",
                      "`BRIGADE_NO_SUCH_THING` occurs nowhere"),
            "wrong_file": (9, "[`Thing`](../src/ring.c#L9-L10)", "Thing is not defined in src/ring.c"),
            "named_path": (LAST, "as src/old/ring.c says",
                           "names src/old/ring.c, which is no file"),
            "named_file": (LAST, "see gone.h first", "names gone.h, which is no file"),
            "named_fn": (LAST, "call brg_walk_gone() here",
                         "names brg_walk_gone, which occurs in no"),
        }
        for name, (n, text, want) in bad_lines.items():
            lines = GOOD.split("\n")
            lines[n - 1] = text
            make_tree(root, "\n".join(lines))
            rc, out = run(root)
            got = [l for l in out.splitlines() if l.startswith("docs/a.md:")]
            check(rc == 1 and any(l.startswith(f"docs/a.md:{n}: ") and want in l for l in got),
                  f"{name}: expected 'docs/a.md:{n}: ...{want}...', got exit {rc}: {got}")

        # A model block that no longer matches, and a range that moved.
        stale = GOOD.replace("      4K   40 us", "      4K   99 us").replace("#L15-L19", "#L1-L3")
        make_tree(root, stale)
        rc, out = run(root)
        check(rc == 1 and "now prints '      4K   40 us', the doc has '      4K   99 us'" in out
              and "walk_ring is lines 15-19" in out, f"stale block and range: {out}")
        rc, out = run(root, "--fix")
        rc2, out2 = run(root)
        with open(os.path.join(root, "docs/a.md")) as f:
            fixed = f.read()
        check(rc2 == 0 and fixed == GOOD, f"--fix then check: exit {rc2}: {out2}\n{fixed}")

        # A model command that fails is a problem, not a traceback.
        make_tree(root, GOOD)
        with open(os.path.join(root, "bench/model"), "w") as f:
            f.write("#!/usr/bin/python3\nimport sys\nsys.exit('bench/model: no constants')\n")
        rc, out = run(root)
        check(rc == 1 and "failed (1)" in out and "Traceback" not in out,
              f"failing bench/model: {out}")
        # A source comment that names a file that is gone; one with <...>
        # or a name the build makes (in a meson.build's quotes) passes.
        make_tree(root, GOOD)
        with open(os.path.join(root, "src/meson.build"), "w") as f:
            f.write("configure_file(output: 'made.h')\n")
        with open(os.path.join(root, "src/use.c"), "w") as f:
            f.write("#include <stddef.h>\n/* made.h, <other.h>, ring.c;\n * and old.c */\n")
        rc, out = run(root)
        check(rc == 1 and "src/use.c:3: names old.c, which is no file" in out
              and out.count("which is no file") == 1, f"a comment naming a gone file: {out}")
        os.remove(os.path.join(root, "src/use.c"))
        os.remove(os.path.join(root, "src/meson.build"))

        # The floors of runtime/: the order internal.h lists holds the calls.
        floors(root)
    with tempfile.TemporaryDirectory(prefix="check-docs-") as root:
        formula_checks(root)
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("all checks passed")


if __name__ == "__main__":
    main()
