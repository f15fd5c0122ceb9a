#!/usr/bin/env python3
"""Keeps docs/ honest about the code: every code reference in docs/*.md is
checked against the tree, and every table the docs take from bench/model
is made again and compared.

    check_docs.py [--fix] [--root DIR] [DOC.md ...]

What counts as a reference, and what is checked:

  [text](../path)                 the file or folder exists
  [`name`](../path#L10-L42)       name is defined in path (a C function,
                                  struct, table or macro; a Python def or
                                  class) and its definition runs exactly
                                  from line 10 to line 42
  `name` in [..](../path)         name is defined in path; so is every name
  `a`, `b` and `c` in [..](..)    of a list that ends in " in [..](path)"
  `name` in `path`                likewise, with the path in backticks
  `dir/file.ext`                  a backticked path exists
  `some_name`                     a backticked identifier with an
                                  underscore occurs somewhere in the code
                                  (a renamed function or setting shows up)

  <!-- model: ARGS -->            the fenced block that follows is the
  ```                             output of `bench/model ARGS`, made again
  ...                             here and compared line by line
  ```

  <!-- formulas: ARGS -->          the table that follows gives closed forms:
  | plan | when | time | ...      a row whose first cell names a plan of
                                  `bench/model formulas ARGS --tsv`
                                  (`ring`, `small`, `tree`, `rhd`, `hier`)
                                  has its backticked time formula (and
                                  `when` condition) evaluated at every
                                  shape and size the model printed for that
                                  plan; each must match the model's time

Run without naming docs, it also checks the words of the whole tree:

  dir/name.c, name.h, .cu, .cuh,  in docs/*.md, ARCHITECTURE.md, README.md,
  .cc, .py (a path: also .md, .sh) tests/README.md, bench/README.md and in
                                  every source comment: names a file of the
                                  tree (a path from the root, from the
                                  naming file's folder, or the end of a
                                  longer path; a bare name anywhere), of the
                                  system (<...>) or of the build
  brg_name, brg__name in those    occurs in the sources' code (their
  docs                            comments left out)
  runtime/core/internal.h's list  each runtime file calls (a brg__ name
  of the floors                   another defines) only files listed after
                                  it, and every runtime .c file is listed

--fix rewrites what can be made again (line ranges, model blocks) in
place; references to things that are gone it can only report. Exit status
0 when every reference holds, 1 otherwise (each problem one line, with the
doc's file and line).
"""
import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CODE_EXT = (".c", ".h", ".cu", ".cc", ".cpp", ".py", ".sh", ".build", ".txt", ".map", ".json",
            ".toml", ".cfg", ".supp", ".options")
C_EXT = (".c", ".h", ".cu", ".cc", ".cpp")
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


# ------------------------------------------------------------ definitions

def c_definitions(text):
    """{name: (first line, last line)} of the definitions in C source:
    functions and tables (from the line that names them at column 0 to the
    closing brace at column 0), structs and typedefs (to their closing
    line), macros (their #define line and its continuations)."""
    lines = text.split("\n")
    defs = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"#\s*define\s+(" + IDENT + ")", line)
        if m:
            j = i
            while lines[j].endswith("\\") and j + 1 < len(lines):
                j += 1
            defs.setdefault(m.group(1), (i + 1, j + 1))
            i = j + 1
            continue
        if not line or line[0] in " \t#/*}{" or line.startswith("extern \"C\""):
            i += 1
            continue
        # A struct/union/enum body: `typedef struct name {` ... `} alias;`
        m = re.match(r"(?:typedef\s+)?(?:struct|union|enum)\s*(" + IDENT + r")?\s*\{", line)
        if m:
            j = i
            while j < len(lines) and not lines[j].startswith("}"):
                j += 1
            end = j + 1
            if m.group(1):
                defs.setdefault(m.group(1), (i + 1, end))
            if j < len(lines):
                t = re.match(r"\}\s*(" + IDENT + r")\s*;", lines[j])
                if t:
                    defs.setdefault(t.group(1), (i + 1, end))
            i = j + 1
            continue
        # A function or a table: its header may run over several lines up
        # to the `{`; a `;` first makes it a declaration.
        j, header = i, line
        while j < len(lines) and "{" not in lines[j] and ";" not in lines[j]:
            j += 1
            if j < len(lines):
                header += " " + lines[j].strip()
        if j >= len(lines) or ";" in lines[j].split("{")[0]:
            i += 1
            continue
        head = header.split("{")[0]
        m = re.search(r"(" + IDENT + r")\s*\(", head)
        if m and "=" not in head[:m.start()]:
            name = m.group(1)
        else:
            m = re.search(r"(" + IDENT + r")\s*(?:\[[^\]]*\])*\s*=\s*$", head.strip())
            name = m.group(1) if m else None
        k = j
        while k < len(lines) and not lines[k].startswith("}"):
            k += 1
        if name and not re.match(r"(if|for|while|switch|return|sizeof)$", name):
            defs.setdefault(name, (i + 1, k + 1))
        i = k + 1
    return defs


def py_definitions(text):
    """{name: (first line, last line)} of Python defs and classes at any
    depth, each to its last line that is indented further."""
    lines = text.split("\n")
    defs = {}
    for i, line in enumerate(lines):
        m = re.match(r"(\s*)(?:def|class)\s+(" + IDENT + ")", line)
        if not m:
            continue
        ind, last = len(m.group(1)), i
        for j in range(i + 1, len(lines)):
            s = lines[j]
            if s.strip() and len(s) - len(s.lstrip()) <= ind:
                break
            if s.strip():
                last = j
        defs.setdefault(m.group(2), (i + 1, last + 1))
    return defs


class Tree:
    def __init__(self, root):
        self.root = root
        self._defs = {}
        self._words = None

    def path(self, rel):
        return os.path.normpath(os.path.join(self.root, rel))

    def defs(self, rel):
        if rel not in self._defs:
            try:
                with open(self.path(rel), encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError):
                text = None
            if text is None:
                d = {}
            elif rel.endswith(C_EXT):
                d = c_definitions(text)
            else:
                first = text.split("\n", 1)[0]
                d = py_definitions(text) if rel.endswith(".py") or "python" in first else {}
            self._defs[rel] = d
        return self._defs[rel]

    def words(self):
        """Every identifier in the code (not in docs/ and Markdown files)."""
        if self._words is None:
            self._words = set()
            for dirpath, dirnames, files in os.walk(self.root):
                dirnames[:] = [d for d in dirnames if not d.startswith(("build", "."))
                               and d not in ("docs", "subprojects", "__pycache__")]
                for fn in files:
                    p = os.path.join(dirpath, fn)
                    if fn.endswith(".md") or not (fn.endswith(CODE_EXT) or os.access(p, os.X_OK)):
                        continue
                    try:
                        with open(p, encoding="utf-8") as f:
                            self._words.update(re.findall(IDENT, f.read()))
                    except (OSError, UnicodeDecodeError):
                        pass
        return self._words


# ------------------------------------------------------------ checking

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
NAME_LIST = re.compile(r"((?:`" + IDENT + r"(?:\(\))?`(?:,\s*|\s+and\s+|\s*/\s*))*`" + IDENT +
                       r"(?:\(\))?`)\s+in\s+(?:\[[^\]]*\]\(([^)\s#]+)[^)]*\)|`([\w./-]+)`)")
MODEL = re.compile(r"<!--\s*model:\s*(.*?)\s*-->")


def in_code_block(lines):
    """For each line, whether it lies in a fenced block (``` ... ```)."""
    out, inside = [], False
    for line in lines:
        if line.strip().startswith("```"):
            out.append(True)
            inside = not inside
        else:
            out.append(inside)
    return out


def resolve(doc, target):
    """A link target relative to the doc, as a path from the repo root, or
    None for a URL or an anchor within the page."""
    if re.match(r"[a-z]+:", target) or target.startswith("#"):
        return None
    path = target.split("#")[0]
    return os.path.normpath(os.path.join(os.path.dirname(doc), path))


def run_model(tree, args):
    cmd = [sys.executable, os.path.join(tree.root, "bench", "model")] + args.split()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=60)
    return p.returncode, p.stdout.rstrip("\n").split("\n")


# ------------------------------------------------------------ closed forms

FORMULAS = re.compile(r"<!--\s*formulas:\s*(.*?)\s*-->")
FORMULA_SYMBOLS = [("α_l", "a_l"), ("β_l", "b_l"), ("α_n", "b_n_a"), ("β_n", "b_n"),
                   ("α", "a"), ("β", "b"), ("·", "*"), ("−", "-"), ("≤", "<="), ("≥", ">="),
                   ("⌈", "ceil("), ("⌉", ")"), ("⌊", "floor("), ("⌋", ")")]


def formula_py(text):
    """A formula as the doc writes it (2(N-1)·α + log₂P·S·β, ⌈M/K⌉, 4K)
    as a Python expression."""
    t = text
    for a, b in FORMULA_SYMBOLS:
        t = t.replace(a, b)
    t = t.replace("b_n_a", "a_n")
    t = re.sub(r"log₂\s*(\w+)", r"log2(\1)", t)
    t = re.sub(r"(?<![\w.])(\d+)K\b", r"(\1*1024)", t)
    t = re.sub(r"(?<![<>!=])=(?!=)", "==", t)
    t = re.sub(r"(?<![A-Za-z_\d.])(\d+(?:\.\d+)?)\s*(?=[(A-Za-z])", r"\1*", t)
    t = re.sub(r"\)\s*(?=[(A-Za-z\d])", ")*", t)
    return t


def formula_value(expr, env):
    import math
    names = dict(env, min=min, max=max, ceil=math.ceil, floor=math.floor, log2=math.log2)
    return eval(compile(expr, "<formula>", "eval"), {"__builtins__": {}}, names)  # noqa: S307


def check_formulas(tree, lines, code, say):
    """The closed forms of a table after <!-- formulas: ARGS --> against
    runtime/model.c's times (bench/model formulas ARGS --tsv)."""
    import math
    for n, line in enumerate(lines):
        m = FORMULAS.search(line) if not code[n] else None
        if not m:
            continue
        rc, out = run_model(tree, "formulas --tsv " + m.group(1))
        if rc != 0 or not out or not out[0].startswith("# "):
            say(n + 1, f"bench/model formulas {m.group(1)} failed ({rc}): {' '.join(out)[:200]}")
            continue
        links = {k: float(v) for k, v in (f.split("=") for f in out[0][2:].split())}
        cases = [(f[0], int(f[1]), int(f[2]), int(f[3]), float(f[4]))
                 for f in (l.split("\t") for l in out[1:]) if len(f) == 5]
        rows, i = [], n + 1
        while i < len(lines) and not lines[i].startswith("|"):
            i += 1
        head = [c.strip().lower() for c in lines[i].strip().strip("|").split("|")] \
            if i < len(lines) else []
        t_col = next((j for j, h in enumerate(head) if h.startswith("time")), None)
        w_col = next((j for j, h in enumerate(head) if h.startswith("when")), None)
        if t_col is None:
            say(n + 1, "a formulas comment not followed by a table with a 'time' column")
            continue
        i += 1
        while i < len(lines) and lines[i].startswith("|"):
            cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            plan = re.match(r"`(\w+)`", cells[0])
            if plan and len(cells) > t_col:
                f = re.search(r"`([^`]+)`", cells[t_col])
                w = re.search(r"`([^`]+)`", cells[w_col]) if w_col is not None and \
                    len(cells) > w_col else None
                if not f:
                    say(i + 1, f"{plan.group(1)}: no `formula` in the time column")
                else:
                    rows.append((i + 1, plan.group(1), formula_py(f.group(1)),
                                 formula_py(w.group(1)) if w else "True", f.group(1)))
            i += 1
        for plan in sorted({c[0] for c in cases} - {r[1] for r in rows}):
            say(n + 1, f"the table has no row for `{plan}`, which bench/model formulas prints")
        bad = set()
        for plan, H, M, S, want in cases:
            N = H * M
            P = 1 << (N.bit_length() - 1)
            env = dict(N=N, S=S, H=H, M=M, P=P, D=int(math.log2(N)) + 1, K=links["K"],
                       s=links["s"], a=links["a"], b=links["b"], a_l=links["a_l"],
                       b_l=links["b_l"], a_n=links["a_n"], b_n=links["b_n"])
            hits = []
            for ln, p, expr, when, shown in rows:
                if p != plan or ln in bad:
                    continue
                try:
                    if formula_value(when, env):
                        hits.append((ln, formula_value(expr, env), shown))
                except Exception as e:  # a formula the doc cannot mean
                    say(ln, f"`{shown}` does not evaluate ({type(e).__name__}: {e}) as {expr}")
                    bad.add(ln)
            if len(hits) != 1 and not any(r[0] in bad for r in rows if r[1] == plan):
                say(n + 1, f"{len(hits)} rows of `{plan}` apply at {H}x{M} ranks, S = {S} "
                    "(the `when` conditions should split the cases)")
                continue
            for ln, got, shown in hits:
                if abs(got - want) > 1e-9 * max(abs(want), 1e-12):
                    say(ln, f"`{plan}` at {H}x{M} ranks, S = {S}: `{shown}` gives {got:.6g} s, "
                        f"bench/model formulas (runtime/model.c) {want:.6g} s")
                    bad.add(ln)


def check_doc(tree, doc, fix):
    """Problems of one doc, as 'doc:line: what'; rewrites it under fix."""
    with open(os.path.join(tree.root, doc), encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    code = in_code_block(lines)
    problems = []
    changed = False

    def say(n, msg):
        problems.append(f"{doc}:{n}: {msg}")

    for n, line in enumerate(lines, 1):
        if code[n - 1]:
            continue
        for m in LINK.finditer(line):
            text_, target = m.group(1), m.group(2)
            rel = resolve(doc, target)
            if rel is None:
                continue
            if not os.path.exists(tree.path(rel)):
                say(n, f"link to {rel}, which does not exist")
                continue
            r = re.search(r"#L(\d+)(?:-L(\d+))?$", target)
            if not r:
                continue
            name = re.fullmatch(r"`(" + IDENT + r")(?:\(\))?`", text_)
            if not name:
                say(n, f"line range {target} on '{text_}', which names no function in backticks")
                continue
            d = tree.defs(rel).get(name.group(1))
            if not d:
                say(n, f"{name.group(1)} is not defined in {rel}")
                continue
            a, b = int(r.group(1)), int(r.group(2) or r.group(1))
            if (a, b) != d:
                if fix:
                    new = target[:r.start()] + f"#L{d[0]}-L{d[1]}"
                    lines[n - 1] = lines[n - 1].replace(f"({target})", f"({new})", 1)
                    changed = True
                else:
                    say(n, f"{name.group(1)} is lines {d[0]}-{d[1]} of {rel}, the link says "
                        f"{a}-{b} (check_docs.py --fix rewrites the range)")
        # Names said to be in a file.
        joined = line
        if n < len(lines) and not code[n]:
            joined = line + " " + lines[n]  # a list may wrap onto the next line
        for m in NAME_LIST.finditer(joined):
            if m.start() >= len(line):
                continue
            rel = resolve(doc, m.group(2)) if m.group(2) else m.group(3)
            if rel is None or not os.path.isfile(tree.path(rel)):
                if rel is not None:
                    say(n, f"{rel} does not exist")
                continue
            for name in re.findall(r"`(" + IDENT + r")", m.group(1)):
                defs = tree.defs(rel)
                if defs and name not in defs:
                    say(n, f"{name} is not defined in {rel}")
                elif not defs and name not in open(tree.path(rel), encoding="utf-8").read():
                    say(n, f"{name} does not occur in {rel}")
        for m in re.finditer(r"`([^`\s]+)`", line):
            tok = m.group(1)
            if re.fullmatch(r"[\w.-]+(/[\w.-]+)+/?", tok) and not tok.startswith("/"):
                # build/... names what a build makes; bench/x the program
                # built from bench/x plus .c
                built = tok.split("/")[0].startswith("build") or any(
                    os.path.exists(tree.path(tok + ext)) for ext in (".c", ".cc", ".cu", ".py"))
                if os.path.relpath(tree.path(tok), tree.root).startswith(".."):
                    say(n, f"`{tok}` is outside the repository (a clone has no such path)")
                elif not built and not os.path.exists(tree.path(tok)):
                    say(n, f"`{tok}` does not exist")
                continue
            t = re.fullmatch(r"(" + IDENT + r")(?:\(\))?", tok)
            if t and "_" in t.group(1).strip("_") and t.group(1) not in tree.words():
                say(n, f"`{t.group(1)}` occurs nowhere in the code")

    # Blocks made by bench/model.
    n = 0
    while n < len(lines):
        m = MODEL.search(lines[n]) if not code[n] else None
        if not m:
            n += 1
            continue
        start = n + 1
        if start >= len(lines) or not lines[start].strip().startswith("```"):
            say(n + 1, "a model comment not followed by a ``` block")
            n += 1
            continue
        end = start + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        rc, want = run_model(tree, m.group(1))
        if rc != 0:
            say(n + 1, f"bench/model {m.group(1)} failed ({rc}): {' '.join(want)[:200]}")
        elif lines[start + 1:end] != want:
            if fix:
                lines[start + 1:end] = want
                changed = True
                code = in_code_block(lines)
                end = start + 1 + len(want)
            else:
                got = lines[start + 1:end]
                diff = next((i for i in range(max(len(got), len(want)))
                             if i >= len(got) or i >= len(want) or got[i] != want[i]), 0)
                say(start + 2 + diff, f"bench/model {m.group(1)} now prints "
                    f"{(want[diff] if diff < len(want) else '(nothing)')!r}, the doc has "
                    f"{(got[diff] if diff < len(got) else '(nothing)')!r} "
                    "(check_docs.py --fix makes the block again)")
        n = end + 1
    check_formulas(tree, lines, code, say)
    if changed:
        with open(os.path.join(tree.root, doc), "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
    return problems



# ------------------------------------------------------------ names in words

# The pages whose every file name and function name is checked (besides
# docs/*.md, which get every check above).
NAME_DOCS = ("ARCHITECTURE.md", "README.md", "tests/README.md", "bench/README.md")
SKIP_DIRS = ("docs", "subprojects", "__pycache__", "node_modules")
NAMED_EXT = "c|h|cc|cu|cuh|py"
# dir/name.ext (any of these), or a bare name.ext of a source kind.
NAMED_FILE = re.compile(r"(?<![\w./<@-])((?:[\w.-]+/)*[\w-]+\.(?:" + NAMED_EXT +
                        r"|md|sh))(?![\w/>-])")
NAMED_FN = re.compile(r"(?<![\w.>:/-])(brg_[a-z0-9_]+)\b(?!\*)")
C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
# Files of other projects that comments name (no file of ours, nor
# included with <...> here).
OTHERS = {"nccl_device/core.h": "NCCL's device API, C++ only",
          "dlpack.h": "DLPack's capsule layout, taken by ctypes",
          "pmix_common.h": "PMIx's ABI, declared by runtime/comm/launch.c"}
HASH_COMMENT = re.compile(r"(?m)(?:^|\s)#(?![!\w])[^\n]*|#\s[^\n]*")


def tree_files(root):
    """Every file of the tree as a path from root (no build trees, no VCS
    folders, no docs/ pages: those are read as docs)."""
    out = []
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if not d.startswith(("build", ".")) and d not in SKIP_DIRS[1:])
        rel = os.path.relpath(dirpath, root)
        out += [fn if rel == "." else os.path.join(rel, fn) for fn in sorted(files)]
    return out


def comments(path, text):
    """[(line, comment text)] of a source file: C-family block and line
    comments, '#' comments of Python, shell and meson."""
    if path.endswith(C_EXT + (".cuh",)):
        found = [m for m in C_COMMENT.finditer(text) if m.group(0)[0] == "/"]
    elif path.endswith((".py", ".sh")) or os.path.basename(path) == "meson.build":
        found = list(HASH_COMMENT.finditer(text))
    else:
        return []
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in found]


def check_names(root, docs):
    """Every file named in docs (and in source comments) names a file of
    the tree, and every brg_* name in docs (a function, a type) occurs in
    the sources' code, their comments left out.

    A name with a folder must be a path of the tree (from the root, from
    the naming file's folder, or the end of a longer path: cuda/ring_args.h);
    a bare name must be some file's name. Names the tree does not hold but
    the system or the build does are not files of ours: headers included
    with <...>, names in the build files' quotes (device_config.h), and
    OTHERS. Fenced blocks of docs are examples (the reader's train.py)."""
    files = tree_files(root)
    paths = set(files) | {os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs"))}
    bases = {os.path.basename(p) for p in paths}
    outside, defined, texts = set(), set(), {}
    for p in files:
        if not p.endswith(C_EXT + (".cuh", ".py", ".sh", ".build")):
            continue
        try:
            with open(os.path.join(root, p), encoding="utf-8") as f:
                texts[p] = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        t = texts[p]
        outside.update(re.findall(r"#\s*include\s*<([^>]+)>", t))
        if p.endswith("meson.build"):
            outside.update(re.findall(r"'([^'\s]+)'", t))
        if p.endswith(C_EXT + (".cuh",)):
            # the code's own words, its comments left out: a name that
            # lives on in comments alone is gone
            code = C_COMMENT.sub(lambda m: " " if m.group(0)[0] == "/" else m.group(0), t)
            defined.update(re.findall(r"\bbrg_\w+", code))
        elif p.endswith(".py"):
            defined.update(re.findall(r"\bbrg_\w+", HASH_COMMENT.sub(" ", t)))
    outside.update(OTHERS)
    # what the build makes, not a file of the tree under another folder
    outside = {o for o in outside if o in OTHERS or os.path.basename(o) not in bases}
    outside_bases = {os.path.basename(o) for o in outside}
    problems = []

    def known(name, where):
        if name in outside or name in paths or os.path.basename(name) in outside_bases:
            return True
        if "/" not in name:
            return name in bases or name in outside_bases
        near = os.path.normpath(os.path.join(os.path.dirname(where), name))
        return near in paths or any(p.endswith("/" + name) for p in paths)

    def scan(where, n, text, fns):
        for m in NAMED_FILE.finditer(text):
            name = m.group(1).rstrip(".")
            if name.startswith(("http", "www.")) or not known(name, where):
                problems.append(f"{where}:{n}: names {name}, which is no file of the tree")
        if fns:
            for m in NAMED_FN.finditer(text):
                if m.group(1) not in defined:
                    problems.append(f"{where}:{n}: names {m.group(1)}, which occurs in no "
                                    "source's code")

    for doc in docs:
        if not os.path.isfile(os.path.join(root, doc)):
            continue
        with open(os.path.join(root, doc), encoding="utf-8") as f:
            lines = f.read().split("\n")
        code = in_code_block(lines)
        for n, line in enumerate(lines, 1):
            # URLs name other projects' files
            if not code[n - 1]:
                scan(doc, n, re.sub(r"\w+://\S+", "", line), True)
    for p, t in texts.items():
        for n, c in comments(p, t):
            for k, line in enumerate(c.split("\n")):
                scan(p, n + k, re.sub(r"\w+://\S+", "", line), False)
    return problems + check_floors(root, texts)



# ------------------------------------------------------------ the floors

FLOORS_HEADER = "runtime/core/internal.h"


def check_floors(root, texts):
    """The call order internal.h states for runtime/: its list of folders
    (' * name/ ...', top floor first) and their files (' *   file.c ...',
    a path from the folder) runs top down, and each file calls only files
    listed after it. A call is a brg__ name (comments left out) that another
    runtime file defines without static; a pointer handed down is no call.
    Every runtime .c file must be listed."""
    try:
        with open(os.path.join(root, FLOORS_HEADER), encoding="utf-8") as f:
            header = f.read()
    except OSError:
        return []  # a tree without the runtime (the self-test's)
    m = re.search(r"/\*\n \* Who does what in runtime/.*?\*/", header, re.S)
    if not m:
        return [f"{FLOORS_HEADER}: no list of the floors ('Who does what in runtime/')"]
    order, folder, problems = [], None, []
    for line in m.group(0).split("\n"):
        f = re.match(r" \* ([\w/]+)/\s", line)
        if f:
            folder = f.group(1)
            continue
        e = re.match(r" \*   ([\w/]+\.c)\s", line)
        if e and folder:
            order.append(f"runtime/{folder}/{e.group(1)}")
    where = {p: i for i, p in enumerate(order)}
    sources = sorted(p for p in texts if p.startswith("runtime/") and p.endswith(".c"))
    for p in order:
        if p not in texts:
            problems.append(f"{FLOORS_HEADER}: lists {p}, which is no file of the tree")
    owner = {}
    bodies = {}
    for p in sources:
        t = texts[p]
        lines = t.split("\n")
        for name, (a, _) in c_definitions(t).items():
            if name.startswith("brg__") and not lines[a - 1].startswith("static"):
                owner.setdefault(name, p)
        bodies[p] = C_COMMENT.sub(lambda x: " " if x.group(0)[0] == "/" else x.group(0), t)
    for p in sources:
        if p not in where:
            problems.append(f"{p}: stands on no floor of {FLOORS_HEADER} (list it there)")
            continue
        seen = set()
        for name in re.findall(r"\bbrg__\w+", bodies[p]):
            q = owner.get(name)
            if q and q != p and q in where and where[q] < where[p] and (q, name) not in seen:
                seen.add((q, name))
                problems.append(f"{p}: calls {name} of {q}, which {FLOORS_HEADER} lists "
                                "before it (a call up a floor, or against the folder's order)")
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("docs", nargs="*", help="Markdown files (default: docs/*.md)")
    ap.add_argument("--root", default=os.path.normpath(os.path.join(HERE, "..", "..")),
                    help="the repository (default: two levels above this script)")
    ap.add_argument("--fix", action="store_true", help="rewrite line ranges and model blocks")
    a = ap.parse_args(argv)
    tree = Tree(a.root)
    docs = a.docs or sorted(os.path.join("docs", f) for f in os.listdir(tree.path("docs"))
                            if f.endswith(".md"))
    docs = [os.path.relpath(os.path.abspath(d), a.root) if os.path.isabs(d) else d for d in docs]
    problems = []
    for d in docs:
        problems += check_doc(tree, d, a.fix)
    if not a.docs:
        problems += check_names(a.root, docs + [d for d in NAME_DOCS
                                                 if os.path.isfile(tree.path(d))])
    for p in problems:
        print(p)
    print(f"{len(docs)} doc(s), {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
