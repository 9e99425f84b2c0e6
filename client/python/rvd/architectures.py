"""Where a model keeps its V projections: config/architectures.yaml, the file
rvctl compiles in, read here too so that both clients agree.

MODEL_V_PROJ_PATHS maps an architecture (config.json's model_type) to the
module path of its V projection, "{layer}" standing for the layer number
(seed 000's registry). It starts as the table's entries; a user adds or
replaces entries:

    rvd.MODEL_V_PROJ_PATHS["my_model"] = "transformer.blocks.{layer}.attn.v_proj"
    RVMonitor(model, arch="my_model")

An entry of the table keeps its layout (fused QKV or not) and geometry keys;
a new name is read as a separate v_proj ([K*d, D]) with default_geometry.

Detection (resolve): arch= if given; else model.config.model_type (aliases
included); else the class name (the longest architecture name it contains,
ignoring case and underscores: GPTNeoXForCausalLM -> gpt_neox); else a search
of the parameters for per-layer weights of modules named *v_proj* or *value*
(not fused *qkv* / *query_key_value* ones, which hold Q and K too).
A path matches a parameter name exactly, else under a wrapper's prefix
("module.", "base_model.model."), else with the path's leading parts
dropped (a base model without its "model." / "gpt_neox." attribute).
"""
import os
import pathlib
import re
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

try:
    import yaml
except ImportError as e:  # the plain client (rvd.Client) needs no YAML
    raise ImportError("rvd's architecture table (config/architectures.yaml) "
                      "needs PyYAML (Debian: python3-yaml)") from e

from .client import layout_value

_HERE = pathlib.Path(__file__).resolve().parent
_CHECKOUT = _HERE.parents[2]  # client/python/rvd -> the repository root
_SOURCE_TABLE = _CHECKOUT / "config" / "architectures.yaml"
_PACKAGE_TABLE = _HERE / "architectures.yaml"

GEOMETRY_FIELDS = ("num_heads", "num_kv_heads", "head_dim", "hidden_size",
                   "num_layers")


def architectures_path():
    """$RVD_ARCHITECTURES, else the checkout's config/architectures.yaml
    (an editable install or PYTHONPATH), else the copy the build put into
    the package (an installed one)."""
    env = os.environ.get("RVD_ARCHITECTURES")
    if env:
        return pathlib.Path(env)
    if _SOURCE_TABLE.is_file() and (_CHECKOUT / "proto" / "rvd" / "v1" /
                                    "rvd.proto").is_file():
        return _SOURCE_TABLE
    if _PACKAGE_TABLE.is_file():
        return _PACKAGE_TABLE
    raise FileNotFoundError(
        "architectures.yaml not found: neither the checkout's "
        f"{_SOURCE_TABLE} nor the package's {_PACKAGE_TABLE} (written by "
        "`make build`); set RVD_ARCHITECTURES")


def forced_kv_heads(layout, num_heads):
    """The kv head count a layout fixes (kernels/v_layout.h ForcedKvHeads,
    which rvd checks), or None."""
    if layout in ("gpt_neox_qkv", "falcon_classic", "gpt2_conv1d"):
        return num_heads
    if layout == "falcon_multi_query":
        return 1
    return None


def scalar_text(value):
    """A config or YAML scalar as text, the way rvctl compares them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return None


@dataclass(frozen=True)
class Architecture:
    model_type: str
    aliases: Tuple[str, ...]
    tensors: Tuple[str, ...]        # parameter name patterns with {layer}
    layout: Optional[str]           # None: chosen by `variants`
    variants: Tuple[Tuple[Dict[str, str], str], ...]
    config_defaults: Dict[str, str]
    geometry: Dict[str, Tuple[str, ...]]  # default_geometry merged in

    def pick_layout(self, config):
        if self.layout is not None:
            return self.layout
        for when, layout in self.variants:
            if all(_config_text(config, k, self.config_defaults) == v
                   for k, v in when.items()):
                return layout
        raise ValueError(f"architecture {self.model_type}: no layout variant "
                         "matches the model's config; add one without 'when'")


def _config_get(config, key):
    if config is None:
        return None
    if isinstance(config, dict):
        return config.get(key)
    try:
        return getattr(config, key, None)
    except Exception:  # a config object whose attribute lookup fails
        return None


def _config_text(config, key, defaults):
    value = _config_get(config, key)
    if value is None:
        return defaults.get(key)
    return scalar_text(value)


@dataclass
class ArchitectureTable:
    default_geometry: Dict[str, Tuple[str, ...]]
    by_type: Dict[str, Architecture]
    alias_to_type: Dict[str, str] = field(default_factory=dict)
    path: str = ""

    def find(self, model_type):
        if model_type in self.by_type:
            return self.by_type[model_type]
        if model_type in self.alias_to_type:
            return self.by_type[self.alias_to_type[model_type]]
        return None


def _keys(node, where):
    if node is None:
        return ()
    if not isinstance(node, list) or not all(isinstance(k, str) for k in node):
        raise ValueError(f"{where}: expected a list of config keys")
    return tuple(node)


def load_table(path=None):
    """Parses architectures.yaml (see its header for the format)."""
    path = pathlib.Path(path) if path else architectures_path()
    root = yaml.safe_load(path.read_text())
    if not isinstance(root, dict) or "architectures" not in root:
        raise ValueError(f"{path}: no 'architectures' map")
    dg = root.get("default_geometry") or {}
    default_geometry = {f: _keys(dg.get(f), f"{path}: default_geometry.{f}")
                        for f in GEOMETRY_FIELDS}
    table = ArchitectureTable(default_geometry, {}, {}, str(path))
    for model_type, node in root["architectures"].items():
        where = f"{path}: architectures.{model_type}"
        geometry = dict(default_geometry)
        for f, keys in (node.get("geometry") or {}).items():
            if f not in GEOMETRY_FIELDS:
                raise ValueError(f"{where}.geometry: unknown field {f!r}")
            geometry[f] = _keys(keys, f"{where}.geometry.{f}")
        variants = []
        for v in node.get("variants") or ():
            when = {k: scalar_text(x) for k, x in (v.get("when") or {}).items()}
            layout_value(v["layout"])
            variants.append((when, v["layout"]))
        layout = node.get("layout")
        if (layout is None) == (not variants):
            raise ValueError(f"{where}: give exactly one of layout, variants")
        if layout is not None:
            layout_value(layout)
        tensors = node.get("tensors") or ()
        if not tensors or any("{layer}" not in t for t in tensors):
            raise ValueError(f"{where}: tensors must name {{layer}}")
        arch = Architecture(
            model_type=model_type, aliases=tuple(node.get("aliases") or ()),
            tensors=tuple(tensors), layout=layout, variants=tuple(variants),
            config_defaults={k: scalar_text(x) for k, x in
                             (node.get("config_defaults") or {}).items()},
            geometry=geometry)
        table.by_type[model_type] = arch
        for a in arch.aliases:
            table.alias_to_type[a] = model_type
    return table


_TABLE = None


def table():
    """The architecture table, loaded once."""
    global _TABLE
    if _TABLE is None:
        _TABLE = load_table()
    return _TABLE


def _module_path(pattern):
    return pattern[:-len(".weight")] if pattern.endswith(".weight") else pattern


def _default_paths():
    paths = {}
    for model_type, arch in table().by_type.items():
        p = [_module_path(t) for t in arch.tensors]
        paths[model_type] = p[0] if len(p) == 1 else p
    return paths


class _Registry(dict):
    """MODEL_V_PROJ_PATHS: filled from the table on first use."""

    def __init__(self):
        super().__init__()
        self._loaded = False

    def _load(self):
        if not self._loaded:
            self._loaded = True
            for k, v in _default_paths().items():
                super().setdefault(k, v)

    def __getitem__(self, k):
        self._load()
        return super().__getitem__(k)

    def __setitem__(self, k, v):
        self._load()
        super().__setitem__(k, v)

    def __delitem__(self, k):
        self._load()
        super().__delitem__(k)

    def __contains__(self, k):
        self._load()
        return super().__contains__(k)

    def __iter__(self):
        self._load()
        return super().__iter__()

    def __len__(self):
        self._load()
        return super().__len__()

    def __repr__(self):
        self._load()
        return super().__repr__()

    def get(self, k, default=None):
        self._load()
        return super().get(k, default)

    def keys(self):
        self._load()
        return super().keys()

    def items(self):
        self._load()
        return super().items()

    def values(self):
        self._load()
        return super().values()


MODEL_V_PROJ_PATHS = _Registry()


# ---- resolving a torch model ----------------------------------------------

@dataclass
class VTensor:
    layer: int
    name: str         # parameter name, e.g. model.layers.0.self_attn.v_proj.weight
    module_path: str  # the module holding it as .weight


@dataclass
class ResolvedV:
    arch: Optional[str]     # None: found by the parameter search
    detected_by: str        # "arch", "config.model_type", "class name", "search"
    layout: str
    geometry: Optional[Tuple[int, int, int]]  # (H, K, d); None: no config
    geometry_source: str
    tensors: Dict[int, VTensor]
    pattern: str


def _pattern_regex(pattern):
    prefix, _, suffix = pattern.partition("{layer}")
    return re.compile(re.escape(prefix) + r"(\d{1,9})" + re.escape(suffix) + "$")


def _exact(pattern, names):
    rx = _pattern_regex(pattern)
    found = {}
    for n in names:
        m = rx.match(n)
        if m:
            found[int(m.group(1))] = n
    return found


def _wrapped(pattern, names):
    rx = _pattern_regex(pattern)
    by_prefix = {}
    for n in names:
        for m in re.finditer(r"\.", n):
            hit = rx.match(n, m.end())
            if hit:
                by_prefix.setdefault(n[:m.end()], {})[int(hit.group(1))] = n
                break
    if len(by_prefix) > 1:
        raise ValueError(f"V pattern {pattern} matches under several prefixes: "
                         f"{', '.join(sorted(by_prefix))}")
    return next(iter(by_prefix.values())) if by_prefix else {}


def _tails(pattern, names):
    parts = pattern.split(".")
    for k in range(1, len(parts)):
        tail = ".".join(parts[k:])
        if "{layer}" not in tail:
            break
        found = _exact(tail, names)
        if found:
            return found
    return {}


def _match(patterns, names):
    """(pattern, {layer: name}) for the first way, in the module doc's order,
    that one of `patterns` (in order) matches; (None, {}) when none does."""
    for how in (_exact, _wrapped, _tails):
        for p in patterns:
            found = how(p, names)
            if found:
                return p, found
    return None, {}


_FUSED_NAMES = ("qkv", "query_key_value")


def _search(names):
    """{pattern: {layer: name}} for weights of modules named like a V
    projection, with a layer number as a path component."""
    found = {}
    for n in names:
        parts = n.split(".")
        if len(parts) < 2 or parts[-1] != "weight":
            continue
        leaf = parts[-2].lower()
        if ("v_proj" not in leaf and "value" not in leaf) or any(
                f in leaf for f in _FUSED_NAMES):
            continue
        for i, p in enumerate(parts[:-2]):
            if p.isdigit():
                pattern = ".".join(parts[:i] + ["{layer}"] + parts[i + 1:])
                found.setdefault(pattern, {})[int(p)] = n
                break
    return found


def _normalized(name):
    return re.sub(r"[^a-z0-9]", "", name.lower())


def detect_arch(model):
    """(architecture name, how) or (None, "search")."""
    paths = MODEL_V_PROJ_PATHS
    tab = table()
    model_type = _config_get(getattr(model, "config", None), "model_type")
    if isinstance(model_type, str) and model_type:
        if model_type in paths:
            return model_type, "config.model_type"
        arch = tab.find(model_type)
        if arch is not None:
            return arch.model_type, "config.model_type"
    cls = _normalized(type(model).__name__)
    names = list(paths.keys()) + list(tab.alias_to_type)
    best = None
    for n in names:
        key = _normalized(n)
        if key and key in cls and (best is None or len(key) > len(_normalized(best))):
            best = n
    if best is not None:
        return tab.alias_to_type.get(best, best), "class name"
    return None, "search"


def _config_int(config, keys, what):
    for key in keys:
        v = _config_get(config, key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"model config {key!r} is {v!r}, expected a "
                             f"positive integer ({what})")
        return v, key
    return None


def derive_geometry(config, keys, layout, tensor_hidden):
    """(H, K, d) and how each was found (architectures.yaml's rules), or
    (None, reason) when the config names no head count."""
    how = []
    h = _config_int(config, keys["num_heads"], "num_heads")
    if h is None:
        return None, ("no head count in the model's config (keys: "
                      f"{', '.join(keys['num_heads'])})")
    h, key = h
    how.append(f"num_heads={h} ({key})")
    k = forced_kv_heads(layout, h)
    if k is not None:
        how.append(f"num_kv_heads={k} (layout {layout})")
    else:
        kv = _config_int(config, keys["num_kv_heads"], "num_kv_heads")
        if kv is not None:
            k = kv[0]
            how.append(f"num_kv_heads={k} ({kv[1]})")
        else:
            k = h
            how.append(f"num_kv_heads={k} (= num_heads)")
    d = _config_int(config, keys["head_dim"], "head_dim")
    if d is not None:
        how.append(f"head_dim={d[0]} ({d[1]})")
        d = d[0]
    else:
        hidden = _config_int(config, keys["hidden_size"], "hidden_size")
        d_model, src = hidden if hidden else (tensor_hidden, "the tensor's input size")
        if d_model % h:
            raise ValueError(f"hidden size {d_model} ({src}) is not a multiple "
                             f"of num_heads {h}")
        d = d_model // h
        how.append(f"head_dim={d} ({src} {d_model} / {h})")
    return (h, k, d), ", ".join(how)


def resolve(model, arch=None, stage=False):
    """Finds the V tensor of every layer of a torch model (see the module
    doc) and its layout and head geometry."""
    names = [n for n, _ in model.named_parameters()]
    tab = table()
    if arch is not None:
        if arch not in MODEL_V_PROJ_PATHS and tab.find(arch) is None:
            raise ValueError(f"unknown architecture {arch!r}; known: "
                             f"{', '.join(sorted(MODEL_V_PROJ_PATHS.keys()))} "
                             "(add it to rvd.MODEL_V_PROJ_PATHS)")
        name, detected_by = arch, "arch"
    else:
        name, detected_by = detect_arch(model)
    entry = tab.find(name) if name is not None else None
    if name is not None:
        canonical = entry.model_type if entry is not None else name
        paths = MODEL_V_PROJ_PATHS.get(name, MODEL_V_PROJ_PATHS.get(canonical))
        if paths is None:
            paths = [_module_path(t) for t in entry.tensors]
        if isinstance(paths, str):
            paths = [paths]
        used, by_layer = _match(
            [p if p.endswith(".weight") else p + ".weight" for p in paths], names)
        used = _module_path(used) if used else ""
        if not by_layer:
            if detected_by == "arch":
                raise ValueError(
                    f"architecture {name}: no parameter matches "
                    f"{', '.join(paths)} (+ .weight); e.g. {', '.join(names[:5])}")
            name, entry, detected_by = None, None, "search"
    if name is None:
        found = _search(names)
        if not found:
            raise ValueError(
                "no V projection found: model.config.model_type and the class "
                f"name {type(model).__name__} name no known architecture, and no "
                "per-layer parameter of a module named *v_proj* or *value*; "
                "give arch= with rvd.MODEL_V_PROJ_PATHS[arch] = "
                "'path.{layer}.to.v_proj'")
        if len(found) > 1:
            raise ValueError("the V projection is ambiguous; candidates: "
                             f"{', '.join(sorted(found))}; give arch= with "
                             "rvd.MODEL_V_PROJ_PATHS")
        used, by_layer = next(iter(found.items()))
        used = _module_path(used)
    layout = entry.pick_layout(getattr(model, "config", None)) if entry else "separate"
    keys = entry.geometry if entry else tab.default_geometry
    params = dict(model.named_parameters())
    first = params[by_layer[min(by_layer)]]
    if first.dim() != 2:
        raise ValueError(f"V parameter {by_layer[min(by_layer)]} has shape "
                         f"{tuple(first.shape)}, expected 2-D")
    tensor_hidden = first.shape[0] if layout == "gpt2_conv1d" else first.shape[1]
    config = getattr(model, "config", None)
    geometry, source = derive_geometry(config, keys, layout, tensor_hidden)
    declared = _config_int(config, keys["num_layers"], "num_layers")
    # stage: a pipeline stage holds some of the config's layers
    if declared is not None and (declared[0] < max(by_layer) + 1 if stage
                                 else declared[0] != max(by_layer) + 1):
        raise ValueError(f"the model's config says {declared[1]}={declared[0]} "
                         f"but V parameters ({used}) were found for "
                         f"{max(by_layer) + 1} layers")
    tensors = {l: VTensor(l, n, _module_path(n)) for l, n in sorted(by_layer.items())}
    return ResolvedV(entry.model_type if entry else name, detected_by, layout,
                     geometry, source, tensors, used)
