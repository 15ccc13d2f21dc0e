#!/usr/bin/env python3
"""gen_api.py - docs/api.md from the headers, so the API reference cannot drift.

  python3 tools/gen_api.py            writes docs/api.md (also: make api)
  python3 tools/gen_api.py --check    the checks make test runs (below)
  python3 tools/gen_api.py --selftest the generator's own test only
  python3 tools/gen_api.py --stdout   prints what it would write

It reads the public declaration part of mstar_kv.h, mstar_kv_cuda.h and
mstar_kv_ucx.h (between the include guard's #ifndef and its
"#endif /* GUARD */": never the implementation sections, so never the
embedded kernels copy) and writes one entry per public function (every
MSKV_API declaration, multi-line prototypes joined; what MSKV_API expands to
does not matter), type (typedef'd structs with their fields and each field's
comment, enums, function pointer and other typedefs), enum constant and
public #define constant (MSKV_* macros; include guards, MSKV_API and internal
MSKV__ names are left out), each with its doc comment, grouped by the
headers' own section banners ("// >>name"; what precedes the first banner is
"general").

Doc comments, the rules the check holds every entry to:
  * a function, a type or the first #define of a run: the comment block
    right above it (preprocessor conditionals in between are looked
    through; a blank line or anything else breaks the link), and the comment
    beside it on the line where it ends; both when both are there.
  * an enum constant: the comment beside it on its line (a comment beside a
    one-line enum documents every constant on it); a comment on a line of
    its own inside an enum is a heading for the constants after it.
  * a #define in a run of #defines (no blank line or other declaration in
    between) without a comment of its own: the block that heads the run.
  * a struct field: the comment above it and the one beside it (optional).
  A comment block followed by a blank line is section prose: it goes into the
  section's introduction, as does the text of the banner itself.

--check prints the harness's lines ("[ RUN  ]", "[  OK  ]", "[ FAIL ]" and
"N passed, N failed, N skipped", as tests/mskv_test.h does) for
tests/run.sh: api_reference_fresh (docs/api.md is what this script writes now;
else it names the entries that differ), api_documented (every function, type
and constant has a doc comment; the count of functions equals the MSKV_API
lines of the declaration parts), and the generator's test on the fixture
tests/api_fixture.h (api_generator_fixture). Exit status 1 when any failed.
Python 3 standard library only; the output depends only on the headers.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADERS = ["mstar_kv.h", "mstar_kv_cuda.h", "mstar_kv_ucx.h"]
OUTPUT = os.path.join("docs", "api.md")
FIXTURE = os.path.join("tests", "api_fixture.h")
REGEN = "python3 tools/gen_api.py"
SKIP_MACROS = {"MSKV_API"}   # the linkage of every function: its expansion is the build's business


class ParseError(Exception):
    pass


# ---- lexing: one record per line, comments split from code -------------------------------------

class Comment(object):
    def __init__(self, line, col, own):
        self.line, self.col, self.own = line, col, own
        self.end = line
        self.parts = []

    def text_lines(self):
        """The comment's lines without /* */, dedented, blank ends dropped."""
        first = self.parts[0].strip() if self.parts else ""
        rest = [p.rstrip() for p in self.parts[1:]]
        ind = [len(p) - len(p.lstrip()) for p in rest if p.strip()]
        cut = min(ind) if ind else 0
        lines = [first] + [p[cut:] for p in rest]
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        return [l.rstrip() for l in lines]


class Rec(object):
    """One physical line: its code (comments blanked out, columns kept), the
    comments that start on it, whether it is a preprocessor line, whether it
    starts inside a comment."""
    def __init__(self, no, text):
        self.no, self.text = no, text
        self.code = ""
        self.comments = []
        self.directive = False
        self.cont = False

    def blank(self):
        return not self.cont and not self.text.strip()


def lex(lines):
    recs = []
    cur = None          # the comment still open
    dir_cont = False    # the previous line was a directive ending in a backslash
    for no, text in lines:
        r = Rec(no, text)
        r.cont = cur is not None
        r.directive = cur is None and (dir_cont or text.lstrip().startswith("#"))
        code = []
        i = 0
        n = len(text)
        while i < n:
            if cur is not None:
                j = text.find("*/", i)
                if j < 0:
                    cur.parts.append(text[i:])
                    code.append(" " * (n - i))
                    i = n
                    break
                cur.parts.append(text[i:j])
                cur.end = no
                code.append(" " * (j + 2 - i))
                cur = None
                i = j + 2
                continue
            if text.startswith("/*", i):
                cur = Comment(no, i, "".join(code).strip() == "")
                r.comments.append(cur)
                code.append("  ")
                i += 2
                continue
            if text.startswith("//", i):
                c = Comment(no, i, "".join(code).strip() == "")
                c.parts.append(text[i + 2:])
                r.comments.append(c)
                code.append(" " * (n - i))
                break
            ch = text[i]
            if ch == '"' or ch == "'":
                j = i + 1
                while j < n and text[j] != ch:
                    j += 2 if text[j] == "\\" else 1
                code.append(text[i:j + 1])
                i = j + 1
                continue
            code.append(ch)
            i += 1
        r.code = "".join(code)
        dir_cont = r.directive and r.code.rstrip().endswith("\\")
        recs.append(r)
    return recs


def declaration_part(text, path):
    """(line number, text) of the lines between the include guard's #define and
    its closing #endif: the public declarations."""
    lines = text.split("\n")
    guard = start = None
    for i, l in enumerate(lines[:-1]):
        m = re.match(r"#ifndef (\w+)\s*$", l)
        if m and re.match(r"#define %s\s*$" % m.group(1), lines[i + 1]):
            guard, start = m.group(1), i + 2
            break
    if guard is None:
        raise ParseError("%s: no include guard (#ifndef X / #define X)" % path)
    for j in range(start, len(lines)):
        if re.match(r"#endif\s*/\*\s*%s\s*\*/" % guard, lines[j]):
            return guard, [(k + 1, lines[k]) for k in range(start, j)]
    raise ParseError("%s: no '#endif /* %s */' closing the declarations" % (path, guard))


# ---- the model --------------------------------------------------------------------------------

class Entry(object):
    def __init__(self, kind, name, header, section, line):
        self.kind, self.name, self.header, self.section, self.line = kind, name, header, section, line
        self.decl = []          # code lines
        self.doc = []           # doc comment lines
        self.what = ""          # struct, enum, function pointer, ...
        self.fields = []        # (declaration, doc text) of a struct
        self.members = []       # constant entries of an enum
        self.enum = None        # an enum constant's type
        self.heading = ""       # an enum constant's heading inside the enum
        self.group_of = None    # a #define documented by the run's block: the run's first name


class Section(object):
    def __init__(self, header, name):
        self.header, self.name = header, name
        self.intro = []
        self.entries = []


def comment_doc(c):
    return c.text_lines() if c is not None else []


def join_doc(*parts):
    out = []
    for p in parts:
        if p:
            if out:
                out.append("")
            out.extend(p)
    return out


BANNER = re.compile(r"^//\s*>>\s*(.*?)[\s-]*$")


def parse_header(path, text):
    """The sections of one header, and the number of lines of its declaration
    part that start with MSKV_API (the sanity count)."""
    name = os.path.basename(path)
    guard, lines = declaration_part(text, path)
    recs = lex(lines)
    sections = [Section(name, "general")]
    sec = sections[0]
    pending = None          # the comment block right above what comes next
    pending_rec = None
    group = None            # (doc, first name) of the current run of #defines
    conds = []              # enclosing #if lines
    defines = {}            # name -> entry (a macro defined in several branches is one entry)
    api_lines = sum(1 for _, l in lines if l.startswith("MSKV_API"))
    i = 0
    n = len(recs)

    def orphan():
        if pending is not None and pending.text_lines():
            sec.intro.extend(([""] if sec.intro else []) + pending.text_lines())

    while i < n:
        r = recs[i]
        if r.blank():
            orphan()
            pending, group = None, None
            i += 1
            continue
        if r.cont and not r.code.strip() and not r.comments:
            i += 1
            continue
        if r.directive:
            j = i
            while recs[j].code.rstrip().endswith("\\") and j + 1 < n:
                j += 1
            text_ = " ".join(recs[k].code.strip() for k in range(i, j + 1))
            m = re.match(r"#\s*(\w+)\s*(.*)", text_)
            kw = m.group(1) if m else ""
            if kw == "define":
                dm = re.match(r"(\w+)", m.group(2))
                mname = dm.group(1)
                public = mname.startswith("MSKV_") and not mname.startswith("MSKV__") and mname not in SKIP_MACROS
                if public:
                    own = [c for c in recs[j].comments if not c.own] + [c for k in range(i, j) for c in recs[k].comments]
                    trailing = comment_doc(own[0]) if own else []
                    above = comment_doc(pending)
                    if above:
                        doc = join_doc(above, trailing)
                        group = (above, mname)
                    elif trailing:
                        doc = trailing
                    elif group is not None:
                        doc = list(group[0])
                    else:
                        doc = []
                    deflines = [recs[k].code.rstrip() for k in range(i, j + 1)]
                    deflines[0] = deflines[0].strip()
                    if conds:
                        deflines[-1] = deflines[-1] + "   // " + conds[-1]
                    e = defines.get(mname)
                    if e is None:
                        e = Entry("constant", mname, name, sec.name, r.no)
                        e.what = "macro"
                        e.group_of = group[1] if (group and not above and not trailing and group[1] != mname) else None
                        defines[mname] = e
                        sec.entries.append(e)
                    e.decl.extend(deflines)
                    if not e.doc:
                        e.doc = doc
                elif not mname.startswith("MSKV_"):
                    group = None
                pending = None
            elif kw in ("if", "ifdef", "ifndef"):
                conds.append(text_)
            elif kw in ("else", "elif"):
                if conds:
                    conds[-1] = "#%s of %s" % (kw, conds[-1].split(" of ")[-1])
            elif kw == "endif":
                if conds:
                    conds.pop()
            else:
                pending, group = None, None
            i = j + 1
            continue
        if not r.code.strip():
            # a comment on a line of its own (the last one on the line counts)
            c = r.comments[-1]
            tl = c.text_lines()
            m = BANNER.match(tl[0]) if tl else None
            orphan()
            if m:
                sec = Section(name, m.group(1).strip())
                sections.append(sec)
                sec.intro = [l for l in tl[1:]]
                while sec.intro and not sec.intro[0].strip():
                    sec.intro.pop(0)
                pending, group = None, None
            else:
                pending = c
            k = i + 1
            while k < n and recs[k].cont and not recs[k].code.strip() and not recs[k].comments and c.end >= recs[k].no:
                k += 1
            i = k
            continue
        s = r.code.strip()
        if s.startswith('extern "C"') or s == "}":
            pending, group = None, None
            i += 1
            continue
        # a declaration: up to the ';' that ends it outside braces and parentheses
        j, depth, end_col = i, 0, None
        while j < n:
            rj = recs[j]
            if not rj.directive:
                for col, ch in enumerate(rj.code):
                    if ch in "{(":
                        depth += 1
                    elif ch in "})":
                        depth -= 1
                    elif ch == ";" and depth == 0:
                        end_col = col
                        break
            if end_col is not None:
                break
            j += 1
        if end_col is None:
            raise ParseError("%s:%d: a declaration without its ';'" % (path, r.no))
        if recs[j].code[end_col + 1:].strip():
            raise ParseError("%s:%d: code after the ';' of a declaration" % (path, recs[j].no))
        tr = [c for c in recs[j].comments if c.col > end_col]
        trailing = comment_doc(tr[0]) if tr else []
        above = comment_doc(pending)
        doc = join_doc(above, trailing)
        for e in declaration(path, name, sec.name, recs[i:j + 1], end_col, trailing):
            if e.kind != "constant":
                e.doc = doc
            sec.entries.append(e)
        pending, group = None, None
        i = j + 1
    orphan()
    return [s for s in sections if s.entries or s.intro], api_lines


def norm(s):
    return " ".join(s.split())


def body_stream(recs, end_col):
    """The characters between the declaration's first '{' and its matching '}':
    [(line, col, ch)] with '\\n' at line ends, the comments inside, and where
    the body ends."""
    chars, comments = [], []
    depth, started, closed = 0, False, None
    for idx, r in enumerate(recs):
        if r.directive:
            if started and closed is None:
                chars.append((r.no, 0, "\n"))
            continue
        code = r.code if idx < len(recs) - 1 else r.code[:end_col + 1]
        lo = None
        for col, ch in enumerate(code):
            if closed is not None:
                break
            if ch == "{":
                depth += 1
                if not started:
                    started, lo = True, col
                    continue
            elif ch == "}":
                depth -= 1
                if started and depth == 0:
                    closed = (r.no, col)
                    break
            if started:
                chars.append((r.no, col, ch))
        if started:
            lim = closed[1] if closed is not None and closed[0] == r.no else len(code) + 1
            for c in r.comments:
                if (lo is None or c.col > lo) and c.col < lim:
                    comments.append(c)
            if closed is None:
                chars.append((r.no, len(code), "\n"))
        if closed is not None:
            break
    return chars, comments, closed


def split_fields(chars):
    """Struct fields: [(text, first line, last line, col of ';')]. A macro call on
    a line of its own (an X-macro that expands to fields) is one field too."""
    out, cur, depth = [], [], 0
    for (ln, col, ch) in chars:
        if ch == "\n":
            t = "".join(c for _, _, c in cur).strip()
            if depth == 0 and re.match(r"^[A-Z_][A-Z0-9_]*\s*\(.*\)$", t):
                last = [x for x in cur if x[2].strip()][-1]
                first = [x for x in cur if x[2].strip()][0]
                out.append((norm(t), first[0], ln, last[1]))
                cur = []
            elif cur:
                cur.append((ln, col, " "))
            continue
        if ch in "{(":
            depth += 1
        elif ch in "})":
            depth -= 1
        if ch == ";" and depth == 0:
            t = "".join(c for _, _, c in cur).strip()
            if t:
                first = next(x for x in cur if x[2].strip())
                out.append((norm(t) + ";", first[0], ln, col))
            cur = []
            continue
        if not cur and not ch.strip():
            continue
        cur.append((ln, col, ch))
    return out


def split_members(chars):
    """Enum constants: [(name, value, line, col)]."""
    out, cur, depth = [], [], 0
    for (ln, col, ch) in chars + [(None, None, ",")]:
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
        if ch == "," and depth == 0:
            t = "".join(c for _, _, c in cur).strip()
            if t:
                first = next(x for x in cur if x[2].strip())
                m = re.match(r"([A-Za-z_]\w*)\s*(?:=\s*(.*))?$", norm(t))
                if not m:
                    raise ParseError("line %d: an enum constant I cannot read: %r" % (first[0], t))
                out.append((m.group(1), m.group(2), first[0], first[1]))
            cur = []
            continue
        cur.append((ln, col, " " if ch == "\n" else ch))
    return out


def declaration(path, header, section, recs, end_col, trailing):
    code = norm(" ".join(r.code for r in recs[:-1] if not r.directive) + " " + recs[-1].code[:end_col + 1])
    line = recs[0].no
    if code.startswith("MSKV_API "):
        proto = code[len("MSKV_API "):]
        m = re.search(r"([A-Za-z_]\w*)\s*\(", proto)
        if not m:
            raise ParseError("%s:%d: a function whose name I cannot find" % (path, line))
        e = Entry("function", m.group(1), header, section, line)
        e.what = "function"
        e.decl = [proto.replace("( ", "(").replace(" )", ")")]
        return [e]
    m = re.match(r"^(typedef\s+)?(struct|union|enum)\s*(\w*)\s*\{", code)
    if m:
        kind = m.group(2)
        chars, comments, closed = body_stream(recs, end_col)
        if closed is None:
            raise ParseError("%s:%d: an unclosed %s" % (path, line, kind))
        tail = code[code.rfind("}") + 1:-1].strip()
        alias = tail if m.group(1) else (m.group(3) and "%s %s" % (kind, m.group(3)))
        entries = []
        if alias:
            if not re.match(r"^(struct |union |enum )?[A-Za-z_]\w*$", alias):
                raise ParseError("%s:%d: a typedef I cannot read: %r" % (path, line, tail))
            t = Entry("type", alias, header, section, line)
            t.what = kind
            entries.append(t)
        else:
            t = None
        if kind == "enum":
            heads = sorted((c for c in comments if c.own), key=lambda c: c.line)
            for (mname, value, ln, col) in split_members(chars):
                e = Entry("constant", mname, header, section, ln)
                e.what = "enum constant"
                e.enum = alias or None
                e.decl = ["%s = %s" % (mname, value) if value is not None else mname]
                beside = [c for c in comments if not c.own and c.line == ln and c.col > col]
                if beside:
                    e.doc = beside[0].text_lines()
                elif ln == recs[-1].no and trailing:
                    e.doc = list(trailing)
                h = [c for c in heads if c.end < ln]
                e.heading = " ".join(h[-1].text_lines()) if h else ""
                entries.append(e)
                if t is not None:
                    t.members.append(e)
            if t is not None:
                t.decl = ["%s %s { %s }" % (kind, m.group(3) or "", ", ".join(x.decl[0] for x in t.members))]
        else:
            if t is None:
                raise ParseError("%s:%d: an anonymous %s at file level" % (path, line, kind))
            for (decl, l0, l1, col) in split_fields(chars):
                beside = [c for c in comments if not c.own and c.line == l1 and c.col > col]
                above = [c for c in comments if c.own and c.end == l0 - 1]
                doc = join_doc(comment_doc(above[-1]) if above else [], comment_doc(beside[0]) if beside else [])
                t.fields.append((decl, " ".join(x.strip() for x in doc if x.strip())))
            t.decl = ["typedef %s %s { ... } %s;" % (kind, m.group(3), alias) if m.group(3) else
                      "typedef %s { ... } %s;" % (kind, alias)]
        return entries
    if code.startswith("typedef "):
        fm = re.search(r"\(\s*\*\s*([A-Za-z_]\w*)\s*\)\s*\(", code)
        e = None
        if fm:
            e = Entry("type", fm.group(1), header, section, line)
            e.what = "function pointer"
        else:
            am = re.match(r"^typedef\s+(.+?)\s*\b([A-Za-z_]\w*)\s*;$", code)
            if am:
                e = Entry("type", am.group(2), header, section, line)
                target = am.group(1)
                e.what = ("opaque struct" if re.match(r"^struct \w+$", target) and "*" not in target else
                          "handle" if target.endswith("*") else "alias")
        if e is None:
            raise ParseError("%s:%d: a typedef I cannot read: %r" % (path, line, code))
        e.decl = [code]
        return [e]
    raise ParseError("%s:%d: a public declaration this script does not know: %r" % (path, line, code[:80]))


def parse_all(root, headers):
    out = []
    for h in headers:
        p = os.path.join(root, h)
        with open(p, encoding="utf-8") as f:
            secs, api = parse_header(p, f.read())
        out.append((h, secs, api))
    return out


def entries_of(parsed):
    for h, secs, _ in parsed:
        for s in secs:
            for e in s.entries:
                yield e


# ---- Markdown ---------------------------------------------------------------------------------

def anchor(text):
    """GitHub's heading anchors: lower case, punctuation but - and _ dropped, spaces to -."""
    t = text.strip().lower().replace("`", "")
    t = re.sub(r"[^\w\- ]", "", t)
    return t.replace(" ", "-")


def md_inline(text):
    """Comment text for a Markdown line: code spans kept, what Markdown would
    read as markup escaped."""
    parts = text.split("`")
    if len(parts) % 2 == 0:
        parts = [text.replace("`", "\\`")]
    out = []
    for i, p in enumerate(parts):
        if i % 2:
            out.append("`" + p + "`")
        else:
            p = p.replace("\\", "\\\\").replace("*", "\\*")
            p = re.sub(r"<(?=[A-Za-z/!?])", "\\\\<", p)   # what could open an HTML tag
            out.append(p)
    s = "".join(out)
    if re.match(r"^([-+#]|\d+\.)", s):
        s = "\\" + s
    return s


def doc_block(lines):
    if not lines:
        return ["*(no doc comment)*", ""]
    if len(lines) == 1:
        return [md_inline(lines[0]), ""]
    return ["```text"] + lines + ["```", ""]


def link(name):
    return "[`%s`](#%s)" % (name, anchor(name))


def render(parsed):
    ents = list(entries_of(parsed))
    counts = {k: sum(1 for e in ents if e.kind == k) for k in ("function", "type", "constant")}
    out = [
        "# mstar_kv API reference",
        "",
        "Generated by `tools/gen_api.py` from the declarations and doc comments of",
        "%s: do not edit it by hand. After changing a" % ", ".join("`%s`" % h for h, _, _ in parsed),
        "header, regenerate it with `%s` (or `make api`); `make test` fails" % REGEN,
        "while this file is stale, or while a public function, type or constant has no doc comment",
        "(`%s --check`)." % REGEN,
        "",
        "One entry per public function (%d), type (%d) and constant (%d), grouped by the"
        % (counts["function"], counts["type"], counts["constant"]),
        "headers' own sections, in header order. An entry's text is its doc comment: the comment",
        "right above the declaration, the one beside it, or for a constant in a run of `#define`s",
        "the comment that heads the run. The Python package documents itself in its docstrings",
        "(`help(mstar_kv)`).",
        "",
        "## Contents",
        "",
    ]
    for h, secs, _ in parsed:
        out.append("- [%s](#%s)" % (h, anchor(h)))
        for s in secs:
            c = [sum(1 for e in s.entries if e.kind == k) for k in ("function", "type", "constant")]
            what = ", ".join("%d %s%s" % (x, w, "" if x == 1 else "s")
                             for x, w in zip(c, ("function", "type", "constant")) if x)
            title = "%s: %s" % (h, s.name)
            out.append("  - [%s](#%s)%s" % (s.name, anchor(title), " (%s)" % what if what else ""))
    out.append("")
    for h, secs, _ in parsed:
        out += ["## %s" % h, ""]
        for s in secs:
            out += ["### %s: %s" % (h, s.name), ""]
            if s.intro:
                out += ["```text"] + s.intro + ["```", ""]
            for k, label in (("function", "Functions"), ("type", "Types"), ("constant", "Constants")):
                names = [e.name for e in s.entries if e.kind == k]
                if names:
                    out += ["%s: %s" % (label, ", ".join(link(x) for x in names)), ""]
            for e in s.entries:
                out += render_entry(e)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


def render_entry(e):
    lvl = "#####" if e.kind == "constant" else "####"
    out = ["%s `%s`" % (lvl, e.name), ""]
    if e.kind == "function":
        out += ["Function.", "", "```c"] + e.decl + ["```", ""] + doc_block(e.doc)
    elif e.kind == "type":
        if e.what == "enum":
            out += ["Enum: %s." % ", ".join(
                "%s%s" % (link(m.name), " = %s" % m.decl[0].split(" = ", 1)[1] if " = " in m.decl[0] else "")
                for m in e.members), ""]
        elif e.what in ("struct", "union"):
            out += ["%s." % e.what.capitalize(), ""]
        else:
            out += ["Type (%s)." % e.what, "", "```c"] + e.decl + ["```", ""]
        out += doc_block(e.doc)
        if e.fields:
            out += ["Fields:", ""]
            for decl, doc in e.fields:
                out.append("- `%s`%s" % (decl, " - " + md_inline(doc) if doc else ""))
            out.append("")
    else:
        if e.enum is not None or e.what == "enum constant":
            where = " in %s" % link(e.enum) if e.enum else " (an anonymous enum)"
            out += ["`%s`%s%s." % (e.decl[0], where, " (%s)" % md_inline(e.heading) if e.heading else ""), ""]
        else:
            out += ["```c"] + e.decl + ["```", ""]
        if e.group_of:
            out += ["Documented with %s, the first of its run of `#define`s:" % link(e.group_of), ""]
        out += doc_block(e.doc)
    return out


# ---- checks -----------------------------------------------------------------------------------

def blocks(text):
    """Markdown split at its headings (not inside fences): [(heading, text)]."""
    out, cur, head, fence = [], [], "(the preamble and contents)", False
    for l in text.split("\n"):
        if l.startswith("```"):
            fence = not fence
        if not fence and l.startswith("#"):
            out.append((head, "\n".join(cur)))
            head, cur = l, []
        cur.append(l)
    out.append((head, "\n".join(cur)))
    return out


def describe_diff(old, new):
    a, b = blocks(old), blocks(new)
    da, db = dict(a), dict(b)
    kinds = {0: "", 1: "the preamble: ", 2: "", 3: "section ", 4: "", 5: ""}

    def label(h):
        return kinds.get(len(h) - len(h.lstrip("#")), "") + h.lstrip("# ")

    lines = []
    for h, t in b:
        if h not in da:
            lines.append("new, not in %s: %s" % (OUTPUT, label(h)))
        elif da[h] != t:
            lines.append("changed: %s" % label(h))
    for h, _ in a:
        if h not in db:
            lines.append("gone from the headers: %s" % label(h))
    if not lines:
        lines.append("the entries are in another order")
    return lines


def undocumented(parsed):
    return [e for e in entries_of(parsed) if not any(l.strip() for l in e.doc)]


class Harness(object):
    def __init__(self):
        self.passed = self.failed = 0

    def run(self, name, fn):
        print("[ RUN  ] %s" % name)
        sys.stdout.flush()
        try:
            problems = fn()
        except (ParseError, OSError) as ex:
            problems = [str(ex)]
        if problems:
            for p in problems:
                print("  " + p)
            print("[ FAIL ] %s" % name)
            self.failed += 1
        else:
            print("[  OK  ] %s" % name)
            self.passed += 1
        sys.stdout.flush()


def check_fresh(root):
    new = render(parse_all(root, HEADERS))
    p = os.path.join(root, OUTPUT)
    if not os.path.exists(p):
        return ["%s does not exist: run %s (or make api)" % (OUTPUT, REGEN)]
    with open(p, encoding="utf-8") as f:
        old = f.read()
    if old == new:
        return []
    d = describe_diff(old, new)
    return (["%s is stale (%d blocks differ from what the headers say now):" % (OUTPUT, len(d))] +
            ["  " + x for x in d[:60]] + (["  ... and %d more" % (len(d) - 60)] if len(d) > 60 else []) +
            ["regenerate it: %s (or make api), and commit it" % REGEN])


def check_documented(root):
    parsed = parse_all(root, HEADERS)
    probs = []
    for h, secs, api in parsed:
        nf = sum(1 for s in secs for e in s.entries if e.kind == "function")
        if nf != api:
            probs.append("%s: %d functions read, but %d lines of its declaration part start with MSKV_API"
                         % (h, nf, api))
    miss = undocumented(parsed)
    if miss:
        probs.append("public entries without a doc comment (write one above or beside each): %d" % len(miss))
        probs += ["  %s:%d %s %s" % (e.header, e.line, e.kind, e.name) for e in miss]
    return probs


def check_fixture(root):
    """The generator on tests/api_fixture.h, whose entries are known."""
    probs = []

    def expect(cond, what):
        if not cond:
            probs.append("fixture: " + what)

    parsed = parse_all(root, [FIXTURE])
    _, secs, api = parsed[0]
    ents = {e.name: e for e in entries_of(parsed)}
    expect([s.name for s in secs] == ["general", "alpha", "beta"], "sections %r" % [s.name for s in secs])
    want = {
        "function": ["mskv_fx_open", "mskv_fx_close", "mskv_fx_count"],
        "type": ["mskv_fx", "mskv_fx_color", "mskv_fx_flag", "mskv_fx_desc", "mskv_fx_fn", "mskv_fx_id"],
        "constant": ["MSKV_FX_VERSION", "MSKV_FX_RED", "MSKV_FX_ORANGE", "MSKV_FX_BLUE", "MSKV_FX_ON",
                     "MSKV_FX_OFF", "MSKV_FX_MODE_A", "MSKV_FX_MODE_B", "MSKV_FX_FIELDS", "MSKV_FX_READ", "MSKV_FX_WRITE",
                     "MSKV_FX_EXEC", "MSKV_FX_LIST", "MSKV_FX_INIT"],
    }
    for k, names in want.items():
        got = [e.name for e in entries_of(parsed) if e.kind == k]
        expect(got == names, "%ss %r, expected %r" % (k, got, names))
    expect(api == 3, "MSKV_API lines %d, expected 3" % api)

    def doc(name):
        return ents[name].doc if name in ents else None

    expect(doc("mskv_fx_open") == ["Opens a thing, on", "two lines."], "mskv_fx_open's doc %r" % doc("mskv_fx_open"))
    e = ents.get("mskv_fx_open")
    expect(e is not None and e.decl == ["int mskv_fx_open(const mskv_fx_desc *desc, mskv_fx **out);"],
           "mskv_fx_open joined %r" % (e and e.decl))
    expect(e is not None and e.section == "alpha", "mskv_fx_open's section")
    expect(doc("mskv_fx_count") == ["how many"], "a trailing comment documents a function: %r" % doc("mskv_fx_count"))
    expect(ents.get("mskv_fx_count") is not None and ents["mskv_fx_count"].section == "beta", "mskv_fx_count's section")
    expect(doc("mskv_fx") == ["Opaque thing."] and ents["mskv_fx"].what == "opaque struct", "mskv_fx")
    expect(doc("mskv_fx_color") == ["Colours."], "mskv_fx_color's doc %r" % doc("mskv_fx_color"))
    expect(doc("MSKV_FX_RED") == ["red, a warm colour"] and ents["MSKV_FX_RED"].heading == "warm",
           "MSKV_FX_RED %r" % doc("MSKV_FX_RED"))
    expect(doc("MSKV_FX_BLUE") == ["blue: a cold colour,", "on two lines"] and ents["MSKV_FX_BLUE"].heading == "cold",
           "MSKV_FX_BLUE %r" % doc("MSKV_FX_BLUE"))
    expect(ents["MSKV_FX_BLUE"].decl == ["MSKV_FX_BLUE = 4"], "MSKV_FX_BLUE's value")
    expect(doc("MSKV_FX_ORANGE") == [], "MSKV_FX_ORANGE has no doc (the heading is not one)")
    expect(doc("mskv_fx_flag") == ["on or off"] and doc("MSKV_FX_ON") == ["on or off"] and doc("MSKV_FX_OFF") == ["on or off"],
           "a one-line enum's comment documents it and its constants")
    expect(doc("MSKV_FX_MODE_A") == ["modes"] and ents["MSKV_FX_MODE_A"].enum is None, "an anonymous enum's constants")
    d = ents.get("mskv_fx_desc")
    expect(d is not None and d.fields == [
        ("int32_t size;", "bytes"),
        ("int (*cb)(void *user, int x);", "The callback."),
        ("int32_t a, b;", "two at once"),
        ("struct { int x; int y; } inner;", "nested"),
        ("const char *name;", ""),
        ("MSKV_FX_FIELDS(MSKV__FX_MEMBER)", "generated fields"),
    ], "mskv_fx_desc's fields %r" % (d and d.fields))
    expect(ents.get("mskv_fx_fn") is not None and ents["mskv_fx_fn"].what == "function pointer"
           and doc("mskv_fx_fn") == ["a callback"], "mskv_fx_fn")
    expect(doc("mskv_fx_id") == ["An id."] and ents["mskv_fx_id"].fields == [("uint32_t id;", "")], "one-line struct")
    expect(doc("MSKV_FX_READ") == ["Flags of mskv_fx_open."], "the first #define of a run")
    expect(doc("MSKV_FX_WRITE") == ["writable"] and ents["MSKV_FX_WRITE"].group_of is None, "a #define's own comment")
    expect(doc("MSKV_FX_EXEC") == ["Flags of mskv_fx_open."] and ents["MSKV_FX_EXEC"].group_of == "MSKV_FX_READ",
           "a #define documented by its run's block")
    expect(doc("MSKV_FX_LIST") == ["A list macro."] and len(ents["MSKV_FX_LIST"].decl) == 3, "a multi-line macro")
    ini = ents.get("MSKV_FX_INIT")
    expect(ini is not None and len(ini.decl) == 2 and ini.doc == ["Zero-initialises."]
           and ini.decl[0].endswith("// #ifdef __cplusplus"), "a macro defined in two branches %r" % (ini and ini.decl))
    expect(doc("MSKV_FX_VERSION") == ["The version."], "a constant before the first banner")
    alpha = secs[1] if len(secs) > 1 else None
    expect(alpha is not None and alpha.intro == ["The alpha section's intro.", "", "A note that documents nothing."],
           "alpha's intro %r" % (alpha and alpha.intro))
    expect([e.name for e in undocumented(parsed)] == ["MSKV_FX_ORANGE", "mskv_fx_close"],
           "undocumented %r" % [e.name for e in undocumented(parsed)])
    md = render(parsed)
    expect(md == render(parse_all(root, [FIXTURE])), "two renderings differ")
    for needle in ("#### `mskv_fx_open`", "```c\nint mskv_fx_open(const mskv_fx_desc *desc, mskv_fx **out);\n```",
                   "  - [alpha](#testsapi_fixtureh-alpha) (2 functions, 6 types, 12 constants)",
                   "- `int32_t size;` - bytes", "##### `MSKV_FX_RED`", "*(no doc comment)*"):
        expect(needle in md, "the rendering lacks %r" % needle)
    for absent in ("mskv_fx_hidden", "MSKV_FX_IMPL_ONLY", "MSKV__FX_INTERNAL", "MSKV_FIXTURE_H", "`MSKV_API`"):
        expect(absent not in md, "the rendering has %r" % absent)
    changed = md.replace("how many", "how many there are")
    diff = describe_diff(changed, md)
    expect(diff == ["changed: `mskv_fx_count`"], "the stale report %r" % diff)
    diff = describe_diff(md.replace("#### `mskv_fx_close`", "#### `mskv_fx_shut`"), md)
    expect("new, not in docs/api.md: `mskv_fx_close`" in diff and "gone from the headers: `mskv_fx_shut`" in diff,
           "the stale report of a renamed entry %r" % diff)
    return probs


def main(argv):
    root = ROOT
    if argv[1:] in (["--check"], ["--selftest"]):
        h = Harness()
        if argv[1] == "--check":
            h.run("api_reference_fresh", lambda: check_fresh(root))
            h.run("api_documented", lambda: check_documented(root))
        h.run("api_generator_fixture", lambda: check_fixture(root))
        print("%d passed, %d failed, 0 skipped" % (h.passed, h.failed))
        return 1 if h.failed else 0
    if argv[1:] not in ([], ["--stdout"]):
        sys.stderr.write(__doc__)
        return 2
    try:
        md = render(parse_all(root, HEADERS))
    except ParseError as ex:
        sys.stderr.write("gen_api.py: %s\n" % ex)
        return 1
    if argv[1:] == ["--stdout"]:
        sys.stdout.write(md)
        return 0
    p = os.path.join(root, OUTPUT)
    old = None
    if os.path.exists(p):
        with open(p, encoding="utf-8") as f:
            old = f.read()
    if old != md:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w", encoding="utf-8", newline="\n") as f:
            f.write(md)
    miss = undocumented(parse_all(root, HEADERS))
    print("%s: %s (%d entries%s)" % (OUTPUT, "written" if old != md else "unchanged",
                                      len(list(entries_of(parse_all(root, HEADERS)))),
                                      ", %d without a doc comment" % len(miss) if miss else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
