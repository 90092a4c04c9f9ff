"""Recognises PyTorch's allocator ``TraceEntry`` layout from a torch install's own headers:
what the tracker may attach to on a release oomtrace was not checked against (``__init__``'s
``_abi_unknown``; releases 2.4 to 2.15 were checked, compiled against their headers).

``trace_entry_layout(include_dir)`` reads the declaration of ``TraceEntry`` (and its
``Action`` enum) from the headers under ``include_dir`` (``<site-packages>/torch/include``)
and returns ``(layout_name, reason)`` when the fields up to and including ``size_``, their
types, and the ``Action`` values up to ``OOM`` are exactly one of the known layouts, or
``(None, reason)`` naming what differed. Pure standard library, no torch import; it fails
closed: anything it does not recognise is a rejection.

Known layouts (x86-64, libstdc++), from the wheels of torch 2.4.1 ... 2.15.0:

- ``v1``: ``c10::cuda::CUDACachingAllocator::TraceEntry`` in
  ``c10/cuda/CUDACachingAllocator.h``, ``cudaStream_t stream_`` (torch 2.4 ... 2.10).
- ``v2``: ``c10::CachingDeviceAllocator::TraceEntry`` in
  ``c10/core/CachingDeviceAllocator.h``, ``void* stream_`` (torch 2.11 ... 2.15).

Both place the fields oomtrace reads at the same offsets (action 0, device 4 (1 byte),
addr 8, stream 32, size 40) with the same Action values (ALLOC 0 ... OOM 8); they differ in
the namespace, hence in the mangled name of ``attachAllocatorTraceTracker`` (see
``LAYOUTS[name]["attach_symbol"]``).
"""

import os
import re

_ALLOC_NS_CUDA = "c10::cuda::CUDACachingAllocator"
_ALLOC_NS_CORE = "c10::CachingDeviceAllocator"

_COMMON_FIELDS_HEAD = [
    ("action_", "Action"),
    ("device_", "c10::DeviceIndex"),
    ("addr_", "size_t"),
    ("context_", "std::shared_ptr<GatheredContext>"),
]

ACTIONS = [
    "ALLOC",
    "FREE_REQUESTED",
    "FREE_COMPLETED",
    "SEGMENT_ALLOC",
    "SEGMENT_FREE",
    "SEGMENT_MAP",
    "SEGMENT_UNMAP",
    "SNAPSHOT",
    "OOM",
]

_OFFSETS = {"action": 0, "device": 4, "sizeof_device": 1, "addr": 8, "stream": 32, "size": 40}

LAYOUTS = {
    "v1": {
        "namespace": _ALLOC_NS_CUDA,
        "header": "c10/cuda/CUDACachingAllocator.h",
        "fields": _COMMON_FIELDS_HEAD + [("stream_", "cudaStream_t"), ("size_", "size_t")],
        "actions": {name: i for i, name in enumerate(ACTIONS)},
        "offsets": _OFFSETS,
        "attach_symbol": "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator"
        "27attachAllocatorTraceTrackerESt8functionIFvRKN3c104cuda20CUDACachingAllocator"
        "10TraceEntryEEE",
    },
    "v2": {
        "namespace": _ALLOC_NS_CORE,
        "header": "c10/core/CachingDeviceAllocator.h",
        "fields": _COMMON_FIELDS_HEAD + [("stream_", "void*"), ("size_", "size_t")],
        "actions": {name: i for i, name in enumerate(ACTIONS)},
        "offsets": _OFFSETS,
        "attach_symbol": "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator"
        "27attachAllocatorTraceTrackerESt8functionIFvRKN3c1022CachingDeviceAllocator"
        "10TraceEntryEEE",
    },
}

# Headers that have declared TraceEntry in some release; every one present is read.
_CANDIDATES = ("c10/cuda/CUDACachingAllocator.h", "c10/core/CachingDeviceAllocator.h")
_DEVICE_H = "c10/core/Device.h"

# Comments, string and character literals, preprocessor lines (with continuations).
_NOISE = re.compile(
    r"[/\"'#R]"  # one of these starts every match: keeps the search fast
    r"(?:(?<=/)(?:/[^\n]*|\*.*?\*/)"
    r'|(?<=R)"([^(\s]*)\(.*?\)\1"'
    r'|(?<=")(?:[^"\\\n]|\\.)*"'
    r"|(?<=')(?:[^'\\\n]|\\.)*'"
    r"|(?<=\#)(?:[^\n\\]|\\.|\\\n)*)",
    re.DOTALL,
)
# What the namespace walk looks at in cleaned text.
_SCAN = re.compile(
    r"[{}]"
    r"|(?<!\w)(?=[nscu])(?:"  # (the lookahead keeps the search fast)
    r"namespace\s+([A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*)?\s*\{"
    r"|(struct|class|union)\s+TraceEntry\b\s*(.)"
    r"|using\s+AllocatorTraceTracker\s*=\s*([^;]*);)",
    re.DOTALL,
)
_DEFINES = re.compile(r"\b(?:struct|class|union)\s+TraceEntry\b")
_TOKEN = re.compile(r"(?P<id>[A-Za-z_]\w*)|(?P<num>\.?\d(?:[\w.']|[eEpP][+-])*)|(?P<op>::|->|\[\[|\]\]|[^\s\w])")
_PP = "\x01"  # stands for a preprocessor line in cleaned text


class _Reject(Exception):
    pass


def _clean(text):
    """text without comments and literals; each preprocessor line becomes _PP. Also the
    preprocessor lines themselves."""
    pp = []

    def repl(m):
        t = m.group(0)
        c = t[0]
        if c == "/":
            return " "
        if c == "#":
            line = text.rfind("\n", 0, m.start()) + 1
            if text[line : m.start()].strip():
                raise _Reject("a `#` outside a preprocessor line")
            pp.append(t)
            return _PP
        return 'R""' if c == "R" else '""'

    return _NOISE.sub(repl, text), pp


def _tokens(text):
    """(kind, text) tokens of cleaned text; a preprocessor line is a 'pp' token."""
    out = []
    for m in _TOKEN.finditer(text):
        t = m.group(0)
        out.append(("pp" if t == _PP else m.lastgroup, t))
    return out


def _match(toks, i, open_, close):
    """Index of the token closing the bracket opened at toks[i]."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j][1]
        if t == open_:
            depth += 1
        elif t == close:
            depth -= 1
            if depth == 0:
                return j
    raise _Reject("unbalanced %r" % open_)


def _join(texts):
    """A type's tokens as one string: spaces only between two word tokens."""
    s = ""
    for t in texts:
        if s and (s[-1].isalnum() or s[-1] == "_") and (t[0].isalnum() or t[0] == "_"):
            s += " "
        s += t
    return s


def _norm(text):
    return _join(m.group(0) for m in _TOKEN.finditer(text))


def _scan(clean):
    """Walk the namespaces of cleaned text. Returns the `struct TraceEntry` definitions as
    (namespace, keyword, body text, templated) and the `using AllocatorTraceTracker = ...;`
    declarations as (namespace, normalised type)."""
    defs, aliases = [], []
    stack = []  # namespace name, or None for any other brace
    ns = lambda: "::".join(x if x is not None else "?" for x in stack)
    for m in _SCAN.finditer(clean):
        t = m.group(0)
        if t == "{":
            stack.append(None)
        elif t == "}":
            if not stack:
                raise _Reject("unbalanced `}`")
            stack.pop()
        elif m.group(4) is not None:
            aliases.append((ns(), _norm(m.group(4))))
        elif m.group(2) is not None:
            nxt = m.group(3)
            if nxt == ";":
                continue  # a forward declaration
            if nxt != "{":
                raise _Reject("`%s TraceEntry` is followed by %r, not `{`" % (m.group(2), nxt))
            start = m.end() - 1
            depth, end = 0, None
            for b in re.finditer(r"[{}]", clean[start:]):
                depth += 1 if b.group(0) == "{" else -1
                if depth == 0:
                    end = start + b.start()
                    break
            if end is None:
                raise _Reject("TraceEntry's braces do not close")
            templated = clean[: m.start()].rstrip().endswith(">")
            defs.append((ns(), m.group(2), clean[start + 1 : end], templated))
            # the body's braces are walked as usual
            stack.append(None)
        else:
            name = re.sub(r"\s+", "", m.group(1))
            stack.append(name.strip(":") if name else "(anonymous)")
    return defs, aliases


def _parse_enum(toks, i, j):
    """Enumerators of `enum Action { ... }` whose braces are toks[i], toks[j]."""
    values = []
    nxt = 0
    k = i + 1
    while k < j:
        item = []
        while k < j and toks[k][1] != ",":
            item.append(toks[k])
            k += 1
        k += 1  # the comma
        if not item:
            continue
        if item[0][0] != "id":
            raise _Reject("Action enumerator %r is not a name" % item[0][1])
        name = item[0][1]
        if len(item) == 1:
            value = nxt
        elif len(item) == 3 and item[1][1] == "=" and item[2][0] == "num":
            lit = item[2][1].replace("'", "").rstrip("uUlL")
            try:
                value = int(lit, 0)
            except ValueError:
                raise _Reject("Action::%s = %s is not a plain integer" % (name, item[2][1]))
        else:
            raise _Reject("Action::%s has an initializer oomtrace cannot evaluate" % name)
        if not 0 <= value < 2**31:
            raise _Reject("Action::%s = %d does not keep the enum an int" % (name, value))
        values.append((name, value))
        nxt = value + 1
    return values


def _parse_struct(body):
    """(members, enum values) of a struct's body (cleaned text between its braces)."""
    toks = _tokens(body)
    end = len(toks)
    members, enum = [], None
    i = 0
    stmt = []
    while i < end:
        kind, t = toks[i]
        if kind == "pp":
            raise _Reject("a preprocessor directive inside TraceEntry")
        if t in ("virtual",):
            raise _Reject("TraceEntry has a virtual member")
        if not stmt and t in ("public", "private", "protected") and i + 1 < end and toks[i + 1][1] == ":":
            i += 2
            continue
        is_op = stmt_has(stmt, "operator")
        if t == "(" and not stmt_has(stmt, "=", "{") and (is_op or _angle_depth(stmt) == 0):
            # A parenthesis in a declaration at class scope that is not in an initializer
            # or template arguments: a function (constructor, method, operator). Anything
            # else that puts one there (decltype, alignas, attributes, a declarator in
            # parentheses) is rejected rather than guessed at.
            prev = stmt[-1][1] if stmt else ""
            after = toks[i + 1][1] if i + 1 < end else ""
            if not is_op:
                if not stmt or stmt[-1][0] != "id" or prev in _NOT_A_NAME:
                    raise _Reject("TraceEntry has a declaration oomtrace cannot read: `%s (`" % _join(x[1] for x in stmt))
                if after in ("*", "&", "^"):
                    raise _Reject("TraceEntry has a member declared in parentheses (`%s (%s`)" % (prev, after))
            j = _match(toks, i, "(", ")") + 1
            if j < end and toks[j][1] == ":":
                # constructor initializers: `name(...)` or `name{...}`, separated by commas
                j += 1
                while j < end:
                    while j < end and toks[j][1] not in ("(", "{"):
                        j += 1
                    if j >= end:
                        break
                    j = _match(toks, j, toks[j][1], ")" if toks[j][1] == "(" else "}") + 1
                    if j < end and toks[j][1] == ",":
                        j += 1
                        continue
                    break
            else:
                # qualifiers, `= default`, a trailing return type: up to the body or `;`
                while j < end and toks[j][1] not in ("{", ";"):
                    j = _match(toks, j, "(", ")") + 1 if toks[j][1] == "(" else j + 1
            if j < end and toks[j][1] == "{":
                j = _match(toks, j, "{", "}") + 1
                if j < end and toks[j][1] == ";":
                    j += 1
            elif j < end and toks[j][1] == ";":
                j += 1
            else:
                raise _Reject("TraceEntry has a function oomtrace cannot read")
            stmt = []
            i = j
            continue
        if t == "{" and stmt and stmt[0][1] in ("enum", "struct", "class", "union"):
            close = _match(toks, i, "{", "}")
            if stmt[0][1] != "enum":
                raise _Reject("TraceEntry declares a nested %s" % stmt[0][1])
            head = [x[1] for x in stmt]
            if head != ["enum", "Action"]:
                raise _Reject("TraceEntry declares `%s` (expected a plain `enum Action`)" % " ".join(head))
            if enum is not None:
                raise _Reject("TraceEntry declares Action twice")
            enum = _parse_enum(toks, i, close)
            if close + 1 >= end or toks[close + 1][1] != ";":
                raise _Reject("`enum Action {...}` declares a member")
            stmt = []
            i = close + 2
            continue
        if t == "{":
            close = _match(toks, i, "{", "}")
            stmt.append(("init", "{}"))
            i = close + 1
            continue
        if t == ";":
            if stmt:
                members.append(stmt)
            stmt = []
            i += 1
            continue
        stmt.append(toks[i])
        i += 1
    if stmt:
        raise _Reject("TraceEntry ends inside a declaration")
    return members, enum


def stmt_has(stmt, *texts):
    return any(x[1] in texts for x in stmt)


def _angle_depth(stmt):
    return sum(1 for x in stmt if x[1] == "<") - sum(1 for x in stmt if x[1] == ">")


# Words after which `(` does not open a function's parameters.
_NOT_A_NAME = {
    "decltype", "alignas", "_Alignas", "__attribute__", "__declspec", "typeof", "__typeof__",
    "sizeof", "alignof", "void", "bool", "char", "short", "int", "long", "float", "double",
    "signed", "unsigned", "auto", "const", "volatile", "mutable", "static", "struct",
    "class", "union", "enum", "typename", "noexcept", "requires",
}


def _data_member(stmt):
    """(name, type) of a data member statement, or None for one that takes no room."""
    words = [x[1] for x in stmt]
    if words[0] in ("using", "typedef", "friend", "static", "static_assert"):
        return None
    if words[0] == "template":
        raise _Reject("TraceEntry declares a member template")
    if "=" in words:
        words = words[: words.index("=")]
    if words and words[-1] == "{}":
        words = words[:-1]
    if "{}" in words or "," in words or "[" in words or ":" in words or len(words) < 2:
        raise _Reject("TraceEntry member `%s` is not a plain field" % " ".join(words))
    name = words[-1]
    if not re.match(r"[A-Za-z_]\w*$", name):
        raise _Reject("TraceEntry member `%s` is not a plain field" % " ".join(words))
    return name, _join(words[:-1])


def _device_index_is_int8(include_dir):
    path = os.path.join(include_dir, _DEVICE_H)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return "cannot read %s" % _DEVICE_H
    clean, _ = _clean(text)
    found = [_norm(m.group(1)) for m in re.finditer(r"\busing\s+DeviceIndex\s*=\s*([^;]*);", clean)]
    found += ["typedef " + _norm(m.group(0)) for m in re.finditer(r"\btypedef\b[^;]*\bDeviceIndex\s*;", clean)]
    if found != ["int8_t"]:
        return "c10::DeviceIndex is %s in %s, not int8_t" % (" / ".join(found) or "not declared", _DEVICE_H)
    return None


def trace_entry_layout(include_dir):
    """(layout name, reason) when TraceEntry in include_dir's headers is a known layout,
    else (None, reason)."""
    try:
        return _check(include_dir)
    except _Reject as e:
        return None, str(e)
    except Exception as e:  # fail closed on anything unforeseen
        return None, "unexpected %s while reading the headers: %s" % (type(e).__name__, e)


def _check(include_dir):
    if not os.path.isdir(os.path.join(include_dir, "c10")):
        return None, "no c10 headers under %s" % include_dir
    found = []  # (header, namespace, keyword, body, templated)
    aliases = []
    for rel in _CANDIDATES:
        path = os.path.join(include_dir, rel)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        if "TraceEntry" not in text:
            continue
        clean, pp = _clean(text)
        if not _DEFINES.search(clean):
            continue
        defs, als = _scan(clean)
        pack = [d for d in pp if re.match(r"#\s*pragma\s+pack\b", d)]
        if pack and defs:
            return None, "%s has %s" % (rel, pack[0])
        for ns, kw, body, templated in defs:
            found.append((rel, ns, kw, body, templated))
        aliases.extend((rel, ns, a) for ns, a in als)
    if not found:
        return None, "no definition of struct TraceEntry in %s" % " or ".join(_CANDIDATES)
    if len(found) > 1:
        return None, "TraceEntry is defined %d times (%s)" % (
            len(found),
            ", ".join("%s in %s" % (ns, rel) for rel, ns, *_ in found),
        )
    rel, ns, kw, body, templated = found[0]
    if templated:
        return None, "TraceEntry in %s is a template" % rel
    if kw != "struct":
        return None, "TraceEntry in %s is a %s, not a struct" % (rel, kw)
    cands = [(name, l) for name, l in LAYOUTS.items() if l["namespace"] == ns and l["header"] == rel]
    if not cands:
        return None, "TraceEntry is declared in namespace %s in %s, which no known layout has" % (ns or "(global)", rel)
    members, enum = _parse_struct(body)
    if enum is None:
        return None, "TraceEntry declares no `enum Action`"
    fields = []
    for stmt in members:
        m = _data_member(stmt)
        if m is None:
            continue
        fields.append(m)
        if m[0] == "size_":
            break
    else:
        return None, "TraceEntry has no field size_"
    names = [n for n, _ in enum]
    if "OOM" not in names:
        return None, "Action has no OOM"
    head = enum[: names.index("OOM") + 1]
    tracker = [a for r, n, a in aliases if r == rel and n == ns]
    why_not = []
    for name, layout in cands:
        if fields != layout["fields"]:
            diff = _first_difference(fields, layout["fields"])
            why_not.append("fields up to size_ differ from %s: %s" % (name, diff))
            continue
        want = [(a, layout["actions"][a]) for a in ACTIONS]
        if head != want:
            got = ", ".join("%s=%d" % kv for kv in head)
            why_not.append("Action up to OOM is %s, not %s's ALLOC=0 ... OOM=8" % (got, name))
            continue
        if tracker != ["std::function<void(const TraceEntry&)>"]:
            why_not.append("AllocatorTraceTracker in %s is %s" % (ns, " / ".join(tracker) or "not declared"))
            continue
        bad = _device_index_is_int8(include_dir)
        if bad:
            why_not.append(bad)
            continue
        return name, "TraceEntry in %s (%s) matches layout %s" % (ns, rel, name)
    return None, "; ".join(why_not)


def _first_difference(got, want):
    for k in range(max(len(got), len(want))):
        g = got[k] if k < len(got) else None
        w = want[k] if k < len(want) else None
        if g != w:
            fmt = lambda f: "`%s %s`" % (f[1], f[0]) if f else "nothing"
            return "field %d is %s, expected %s" % (k + 1, fmt(g), fmt(w))
    return "none"


if __name__ == "__main__":
    import sys

    for d in sys.argv[1:] or ["."]:
        print(d, *trace_entry_layout(d))
