"""A small renderer for the subset of Helm's Go templates that helm/rvd
uses, so the chart can be rendered and checked where no helm binary is.

The subset (anything else is an error, never silently passed through):
  text and {{ ACTION }}, with {{- and -}} trimming the whitespace beside them;
  {{/* comments */}};
  {{ define "name" }}...{{ end }} and {{ include "name" ARG }};
  {{ if P }}...{{ else if P }}...{{ else }}...{{ end }};
  {{ with P }}...{{ end }} (dot is P's value inside; skipped when empty);
  {{ range $name := P }}...{{ end }} over a list (dot and $name are the
         element inside; no other assignment, no else);
  pipelines: COMMAND | COMMAND ..., the value piped is the last argument;
  terms: .  .a.b (from dot)  $ and $.a.b (from the template's data: the
         root, or the argument of the include running it)  $name and
         $name.a.b (a range variable; not seen inside an include)  "string"
         integers  true false  ( pipeline );
  functions: toYaml toJson indent nindent quote default trunc trimSuffix
         printf (%s %d only) contains eq ne not and or required fail int
         until add dict
         .Files.Get "path" (a file of the chart, raw: not a template).
Values behave as in Helm: a missing key is nil, and nil, false, 0, "",
empty lists and maps are false. Printing nil is an error here (Helm prints
nothing: a typo in a value name would go unseen). Helm reads values numbers
as float64 and prints one of 1e6 or more in exponent form: printing such a
number directly is an error here (use toYaml, or int). toYaml is PyYAML's
block style with sorted keys and no trailing newline, as Helm's (its
quoting of strings may differ; both are YAML).
"""
import json
import pathlib
import re

import yaml

ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)
TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>-?\d+)|(?P<pipe>\|)|'
                   r'(?P<lp>\()|(?P<rp>\))|(?P<field>(?:\$|\.)?(?:\.?[A-Za-z_][A-Za-z0-9_]*)*|\.)'
                   r'|(?P<ident>[A-Za-z_][A-Za-z0-9_]*))')


class TemplateError(Exception):
    pass


def _tokens(text):
    toks, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise TemplateError(f"cannot read {text[pos:]!r} in {{{{ {text} }}}}")
        kind = m.lastgroup
        val = m.group(kind).strip()
        if kind == "field" and not val.startswith((".", "$")):
            kind = "ident"
        toks.append((kind, val))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return toks


def _lex(src):
    """[(kind, text)]: ('text', s) or ('action', s), trims applied."""
    parts, pos = [], 0
    for m in ACTION.finditer(src):
        text = src[pos:m.start()]
        if m.group(1):
            text = text.rstrip()
        if parts and parts[-1][0] == "trim_next":
            parts.pop()
            text = text.lstrip()
        parts.append(("text", text))
        body = m.group(2)
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise TemplateError(f"bad comment {body!r}")
        else:
            parts.append(("action", body))
        if m.group(3):
            parts.append(("trim_next", ""))
        pos = m.end()
    text = src[pos:]
    if parts and parts[-1][0] == "trim_next":
        parts.pop()
        text = text.lstrip()
    parts.append(("text", text))
    return parts


def _closed(stopper, opener):
    if stopper is None:
        raise TemplateError(f"{{{{ {opener} }}}} has no {{{{ end }}}}")


def _parse(parts, i=0, stop=("end",)):
    """Nodes until one of `stop` keywords; returns (nodes, i, stopper)."""
    nodes = []
    while i < len(parts):
        kind, text = parts[i]
        i += 1
        if kind == "text":
            nodes.append(("text", text))
            continue
        word = text.split(None, 1)[0] if text else ""
        rest = text[len(word):].strip()
        if word in ("end", "else"):
            if word not in stop:
                raise TemplateError(f"unexpected {{{{ {text} }}}}")
            return nodes, i, text
        if word == "if":
            branches = []
            cond = rest
            while True:
                body, i, stopper = _parse(parts, i, ("end", "else"))
                _closed(stopper, text)
                branches.append((cond, body))
                if stopper == "end":
                    break
                if stopper == "else":
                    cond = None
                    body, i, stopper = _parse(parts, i, ("end",))
                    _closed(stopper, text)
                    branches.append((None, body))
                    break
                if stopper.startswith("else if "):
                    cond = stopper[len("else if "):].strip()
                    continue
                raise TemplateError(f"unsupported {{{{ {stopper} }}}}")
            nodes.append(("if", branches))
        elif word == "with":
            body, i, stopper = _parse(parts, i, ("end",))
            _closed(stopper, text)
            nodes.append(("with", rest, body))
        elif word == "range":
            m = re.fullmatch(r"\$([A-Za-z_]\w*)\s*:=\s*(.+)", rest, re.S)
            if not m:
                raise TemplateError(f"outside the supported subset: {{{{ {text} }}}} "
                                    "(only range $name := LIST)")
            body, i, stopper = _parse(parts, i, ("end",))
            _closed(stopper, text)
            nodes.append(("range", m.group(1), m.group(2), body))
        elif word == "define":
            name = json.loads(rest)
            body, i, stopper = _parse(parts, i, ("end",))
            _closed(stopper, text)
            nodes.append(("define", name, body))
        elif (word in ("range", "template", "block", "break", "continue", "else")
              or ":=" in text or re.search(r"\$\w*\s*=", text)):
            raise TemplateError(f"outside the supported subset: {{{{ {text} }}}}")
        else:
            nodes.append(("action", text))
    return nodes, i, None


def _truthy(v):
    return not (v is None or v is False or v == 0 or v == "" or v == [] or v == {})


def to_yaml(v):
    if v is None:
        return "null"
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n")


class Chart:
    def __init__(self, chart_dir):
        self.dir = pathlib.Path(chart_dir)
        self._vars = []  # the range variables in scope, innermost last: (name, value)
        self.meta = yaml.safe_load((self.dir / "Chart.yaml").read_text())
        self.defines = {}
        self.templates = {}
        for p in sorted((self.dir / "templates").iterdir()):
            if p.suffix not in (".yaml", ".tpl", ".txt"):
                raise TemplateError(f"unexpected file in templates/: {p.name}")
            nodes, i, stopper = _parse(_lex(p.read_text()))
            if stopper is not None:
                raise TemplateError(f"{p.name}: {{{{ {stopper} }}}} without a block")
            for n in nodes:
                if n[0] == "define":
                    self.defines[n[1]] = n[2]
            self.templates[p.name] = nodes

    def render(self, values, release="rvd", namespace="default"):
        """{template file: rendered text} for every template not starting
        with _ (Helm's rule), NOTES.txt included."""
        root = {
            "Values": values,
            "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
            "Chart": {"Name": self.meta["name"], "Version": self.meta["version"],
                      "AppVersion": self.meta.get("appVersion", "")},
        }
        out = {}
        for name, nodes in self.templates.items():
            if name.startswith("_"):
                continue
            out[name] = self._exec(nodes, root, root)
        return out

    # -- evaluation ----------------------------------------------------------
    def _exec(self, nodes, dot, root):
        out = []
        for n in nodes:
            kind = n[0]
            if kind == "text":
                out.append(n[1])
            elif kind == "define":
                continue
            elif kind == "action":
                out.append(self._print(self._pipeline(n[1], dot, root)))
            elif kind == "if":
                for cond, body in n[1]:
                    if cond is None or _truthy(self._pipeline(cond, dot, root)):
                        out.append(self._exec(body, dot, root))
                        break
            elif kind == "with":
                v = self._pipeline(n[1], dot, root)
                if _truthy(v):
                    out.append(self._exec(n[2], v, root))
            elif kind == "range":
                seq = self._pipeline(n[2], dot, root)
                if not isinstance(seq, list):
                    raise TemplateError(f"range over {seq!r}: only a list is supported")
                for x in seq:
                    self._vars.append((n[1], x))
                    try:
                        out.append(self._exec(n[3], x, root))
                    finally:
                        self._vars.pop()
        return "".join(out)

    @staticmethod
    def _print(v):
        if v is None:
            raise TemplateError("printing a missing value (nil)")
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            if abs(v) >= 1e6:
                raise TemplateError(f"Helm would print {v} in exponent form: use toYaml or int")
            return str(int(v)) if float(v).is_integer() else repr(float(v))
        if isinstance(v, (dict, list)):
            raise TemplateError(f"printing a map or list directly: {v!r} (use toYaml)")
        return str(v)

    def _pipeline(self, text, dot, root):
        toks = _tokens(text)
        v, pos = self._parse_pipeline(toks, 0, dot, root)
        if pos != len(toks):
            raise TemplateError(f"trailing tokens in {{{{ {text} }}}}")
        return v

    def _parse_pipeline(self, toks, pos, dot, root):
        value, pos, has = self._command(toks, pos, dot, root, None, False)
        while pos < len(toks) and toks[pos][0] == "pipe":
            value, pos, _ = self._command(toks, pos + 1, dot, root, value, True)
        return value, pos

    def _term(self, toks, pos, dot, root):
        kind, val = toks[pos]
        if kind == "str":
            return json.loads(val), pos + 1
        if kind == "num":
            return int(val), pos + 1
        if kind == "lp":
            v, pos = self._parse_pipeline(toks, pos + 1, dot, root)
            if pos >= len(toks) or toks[pos][0] != "rp":
                raise TemplateError("unclosed (")
            return v, pos + 1
        if kind == "field":
            return self._field(val, dot, root), pos + 1
        if kind == "ident" and val in ("true", "false"):
            return val == "true", pos + 1
        raise TemplateError(f"unexpected {val!r}")

    def _field(self, path, dot, root):
        if path == ".":
            return dot
        if path == "$":
            return root
        var = re.fullmatch(r"\$([A-Za-z_]\w*)((?:\.\w+)*)", path)
        if var:
            found = [v for name, v in reversed(self._vars) if name == var.group(1)]
            if not found:
                raise TemplateError(f"undefined variable ${var.group(1)}")
            base, path = found[0], var.group(2) or "."
            if path == ".":
                return base
        else:
            base = root if path.startswith("$") else dot
        for part in path.lstrip("$").strip(".").split("."):
            if isinstance(base, dict):
                base = base.get(part)
            elif base is None:
                return None
            else:
                raise TemplateError(f"{path}: {part} of a non-map")
        return base

    def _command(self, toks, pos, dot, root, piped, is_piped):
        if pos >= len(toks):
            raise TemplateError("empty command")
        kind, val = toks[pos]
        if kind == "field" and val == ".Files.Get":
            args, pos = self._args(toks, pos + 1, dot, root)
            args += [piped] if is_piped else []
            return (self.dir / args[0]).read_text(), pos, True
        if kind != "ident" or val in ("true", "false"):
            if is_piped:
                raise TemplateError(f"cannot pipe into {val!r}")
            v, pos = self._term(toks, pos, dot, root)
            return v, pos, True
        args, pos = self._args(toks, pos + 1, dot, root)
        if is_piped:
            args.append(piped)
        return self._call(val, args, dot, root), pos, True

    def _args(self, toks, pos, dot, root):
        args = []
        while pos < len(toks) and toks[pos][0] not in ("pipe", "rp"):
            v, pos = self._term(toks, pos, dot, root)
            args.append(v)
        return args, pos

    def _call(self, name, a, dot, root):
        def n(k):
            if len(a) != k:
                raise TemplateError(f"{name} takes {k} arguments, got {len(a)}")
        if name == "include":
            n(2)
            if a[0] not in self.defines:
                raise TemplateError(f"include of undefined template {a[0]!r}")
            # As in Go templates: the included template's $ is its argument,
            # and the caller's variables are not in scope there.
            saved, self._vars = self._vars, []
            try:
                return self._exec(self.defines[a[0]], a[1], a[1])
            finally:
                self._vars = saved
        if name == "toYaml":
            n(1)
            return to_yaml(a[0])
        if name == "toJson":
            n(1)
            return json.dumps(a[0], sort_keys=True, separators=(",", ":"))
        if name in ("indent", "nindent"):
            n(2)
            pad = " " * int(a[0])
            text = "\n".join(pad + line for line in str(a[1]).split("\n"))
            return "\n" + text if name == "nindent" else text
        if name == "quote":
            n(1)
            return json.dumps(self._print(a[0]) if a[0] is not None else "")
        if name == "default":
            n(2)
            return a[1] if _truthy(a[1]) else a[0]
        if name == "trunc":
            n(2)
            return str(a[1])[:int(a[0])]
        if name == "trimSuffix":
            n(2)
            s = str(a[1])
            return s[:-len(a[0])] if a[0] and s.endswith(a[0]) else s
        if name == "printf":
            fmt, rest = a[0], list(a[1:])
            if re.search(r"%[^sd%]", fmt):
                raise TemplateError(f"printf verb outside %s %d: {fmt!r}")
            return fmt.replace("%d", "%s") % tuple(self._print(x) for x in rest)
        if name == "contains":
            n(2)
            return str(a[0]) in str(a[1])
        if name == "int":
            n(1)
            return int(a[0])
        if name == "until":  # Sprig: [0, n)
            n(1)
            return list(range(int(a[0])))
        if name == "add":  # Sprig: the int64 sum
            if not a:
                raise TemplateError("add takes at least one argument")
            return sum(int(x) for x in a)
        if name == "dict":
            if len(a) % 2:
                raise TemplateError("dict takes key-value pairs")
            if not all(isinstance(k, str) for k in a[::2]):
                raise TemplateError("dict keys must be strings")
            return dict(zip(a[::2], a[1::2]))
        if name == "eq":
            n(2)
            return a[0] == a[1]
        if name == "ne":
            n(2)
            return a[0] != a[1]
        if name == "not":
            n(1)
            return not _truthy(a[0])
        if name == "and":
            for x in a:
                if not _truthy(x):
                    return x
            return a[-1]
        if name == "or":
            for x in a:
                if _truthy(x):
                    return x
            return a[-1]
        if name == "required":
            n(2)
            if not _truthy(a[1]):
                raise TemplateError(f"required: {a[0]}")
            return a[1]
        if name == "fail":
            n(1)
            raise TemplateError(f"fail: {a[0]}")
        raise TemplateError(f"function {name!r} is outside the supported subset")
