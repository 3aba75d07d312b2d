"""Record an engine's API snapshot from its package read as files, never imported.

    python -m engines.snapshots.record sglang /path/to/sglang-0.5.23-...whl
    python -m engines.snapshots.record trtllm --git-dir MIRROR.git --commit SHA [--version 1.2.1]
    python -m engines.snapshots.record trtllm --source-dir CHECKOUT --commit SHA --version 1.2.1
    python -m engines.snapshots.record trtllm --source-dir TREE --sources SOURCES.json [--tag TAG]
    python -m engines.snapshots.record trtllm --list-files      # the paths the recorder reads

``--sources`` is for a tree assembled file by file (e.g. from a code index that holds
each file at its own commit): a JSON object ``{"repository": "NVIDIA/TensorRT-LLM",
"files": {path: commit}}`` naming the commit every file in the tree was read at. Each
snapshot records, in ``source.files``, the commit of every file the recorder read, so a
snapshot built from mixed commits says so file by file (``source.commit`` is then null
and ``source.commits`` lists them).

Everything is parsed with ``ast`` (and, for TensorRT-LLM's C++ JSON field lists, a
regular expression over ``NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE``), so no GPU, no CUDA
wheel and none of the engine's dependencies are needed. The output is
``engines/snapshots/<package>-<version>.json``::

    {"package", "version", "source": {..., "files": {path: commit}}, "recorded_by",
     "classes": {Name: {"file", "fields": [...], "attributes": [...],
                        "methods": {m: {"params": [...], "var_keyword": bool}}}},
     "keys": {name: [...]},            # result-dict keys (meta_info, iteration stats)
     "models": {"source", "architectures": [...]}}
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterable

OUT_DIR = Path(__file__).resolve().parent
Reader = Callable[[str], str]   # package-relative path -> file text (KeyError when absent)


# --- generic ast extraction ------------------------------------------------------------------

def parse(reader: Reader, path: str) -> ast.Module:
    return ast.parse(reader(path), filename=path)


def find_class(module: ast.Module, name: str) -> ast.ClassDef:
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise KeyError(f"class {name} not found")


def _base_names(cls: ast.ClassDef) -> list[str]:
    names = []
    for base in cls.bases:
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
    return names


def _lineage(module: ast.Module, name: str) -> list[ast.ClassDef]:
    """``name`` and its bases defined in the same module, most derived first."""
    seen, order, todo = set(), [], [name]
    while todo:
        current = todo.pop(0)
        if current in seen:
            continue
        seen.add(current)
        try:
            cls = find_class(module, current)
        except KeyError:
            continue
        order.append(cls)
        todo.extend(_base_names(cls))
    return order


def _is_classvar(annotation: ast.expr) -> bool:
    text = ast.unparse(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def class_fields(module: ast.Module, name: str, private: bool = False) -> list[str]:
    """Annotated class-body names of ``name`` and its same-module bases (pydantic/msgspec/dataclass fields).

    ``ClassVar`` and ``PrivateAttr`` names are left out, and so are names with a leading
    underscore unless ``private`` (pydantic keeps them out of ``model_fields``; msgspec
    keeps them as fields).
    """
    fields: list[str] = []
    for cls in reversed(_lineage(module, name)):
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            field = node.target.id
            if (field.startswith("_") and not private) or field == "model_config" or _is_classvar(node.annotation):
                continue
            if isinstance(node.value, ast.Call) and ast.unparse(node.value.func).endswith("PrivateAttr"):
                continue
            if field not in fields:
                fields.append(field)
    return fields


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any]:
    args = fn.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return {"params": names, "var_keyword": args.kwarg is not None}


def class_methods(module: ast.Module, name: str) -> dict[str, dict[str, Any]]:
    """Public methods (and ``__init__``) of ``name`` and its same-module bases; the most derived wins."""
    methods: dict[str, dict[str, Any]] = {}
    for cls in _lineage(module, name):
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in methods:
                if node.name.startswith("_") and node.name != "__init__":
                    continue
                if any(ast.unparse(d) == "property" or ast.unparse(d).endswith(".setter")
                       for d in node.decorator_list):
                    continue
                methods[node.name] = _signature(node)
    return methods


def class_attributes(module: ast.Module, name: str) -> list[str]:
    """Properties and ``self.X = ...`` attributes of ``name`` and its same-module bases."""
    names: list[str] = []
    for cls in _lineage(module, name):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    ast.unparse(d) in ("property", "cached_property", "functools.cached_property")
                    for d in node.decorator_list):
                names.append(node.name)
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else [])
            for target in targets:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == "self" and not target.attr.startswith("_")):
                    names.append(target.attr)
    return sorted(set(names))


def dict_keys_of(module: ast.Module, variable: str) -> list[str]:
    """String keys written into ``variable``: ``v = {...}``, ``v["k"] = ...``, ``v.update({...})``/``update(k=...)``."""
    keys: set[str] = set()

    def literal_keys(node: ast.AST) -> None:
        if isinstance(node, ast.Dict):
            keys.update(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))

    for node in ast.walk(module):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == variable:
                    literal_keys(node.value)
                if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                        and target.value.id == variable and isinstance(target.slice, ast.Constant)):
                    keys.add(str(target.slice.value))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == variable):
            for arg in node.args:
                literal_keys(arg)
            keys.update(k.arg for k in node.keywords if k.arg)
    return sorted(keys)


def all_literal_dict_keys(module: ast.Module) -> list[str]:
    """Every string key of every dict literal in ``module``."""
    keys: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Dict):
            keys.update(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return sorted(keys)


def _subscript_keys(node: ast.AST) -> list[tuple[str, ast.expr]]:
    """``(key, value)`` of every ``name["key"] = value`` under ``node``."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assign):
            for target in sub.targets:
                if (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)
                        and isinstance(target.slice.value, str)):
                    found.append((target.slice.value, sub.value))
    return found


def _literal_items(node: ast.AST) -> list[tuple[str, ast.expr]]:
    """``(key, value)`` of every string key of every dict literal under ``node``."""
    return [(k.value, v) for sub in ast.walk(node) if isinstance(sub, ast.Dict)
            for k, v in zip(sub.keys, sub.values) if isinstance(k, ast.Constant) and isinstance(k.value, str)]


def _annotation_kind(text: str) -> str | None:
    head = text.replace("typing.", "").split("[")[0].strip()
    if head in ("float", "int"):
        return "number"
    if head in ("dict", "Dict", "Mapping", "MutableMapping"):
        return "mapping"
    if head == "str":
        return "text"
    return None


def value_kinds(reader: Reader, path: str) -> dict[str, str]:
    """The kind (``number``, ``mapping``, ``text``) of each dict key written in module ``path``, where the
    source shows it: a numeric constant or arithmetic, a dict literal, a parameter or a called function
    (in the module or imported into it) annotated ``float``/``dict[...]``. A key seen with two kinds is left out."""
    module = parse(reader, path)
    imported = {alias.asname or alias.name: node.module for node in module.body
                if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}

    def returns(name: str) -> str | None:
        sources = [module]
        if name in imported:
            try:
                sources.append(parse(reader, imported[name].replace(".", "/") + ".py"))
            except KeyError:
                pass
        for source in sources:
            for node in source.body:
                if isinstance(node, ast.FunctionDef) and node.name == name and node.returns is not None:
                    return _annotation_kind(ast.unparse(node.returns))
        return None

    kinds: dict[str, set[str]] = {}
    for fn in (n for n in ast.walk(module) if isinstance(n, ast.FunctionDef)):
        params = {a.arg: ast.unparse(a.annotation) for a in fn.args.args + fn.args.kwonlyargs if a.annotation}
        for key, value in _literal_items(fn) + _subscript_keys(fn):
            kind = None
            if isinstance(value, ast.Constant) and isinstance(value.value, (int, float)) \
                    and not isinstance(value.value, bool):
                kind = "number"
            elif isinstance(value, ast.BinOp) or (isinstance(value, ast.Call) and ast.unparse(value.func) in
                                                  ("float", "int", "max", "min")):
                kind = "number"
            elif isinstance(value, ast.Dict):
                kind = "mapping"
            elif isinstance(value, ast.Name) and value.id in params:
                kind = _annotation_kind(params[value.id])
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                kind = returns(value.func.id)
            if kind:
                kinds.setdefault(key, set()).add(kind)
    return {key: found.pop() for key, found in sorted(kinds.items()) if len(found) == 1}


def method_dict_keys(module: ast.Module, cls: str, method: str, variable: str | None = None) -> list[str]:
    """String keys of the dict literals in ``cls.method`` (``variable``: only those assigned to it, and
    ``variable["k"] = ...``)."""
    fn = next(n for n in find_class(module, cls).body
              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == method)
    if variable is None:
        return sorted({k for k, _ in _literal_items(fn)})
    keys = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == variable for t in node.targets):
            keys.update(k for k, _ in _literal_items(node.value))
    keys.update(k for k, _ in _subscript_keys(fn))
    return sorted(keys)


def sglang_server_info_keys(reader: Reader, server_args: list[str]) -> list[str]:
    """Keys of ``Engine.get_server_info()``: ``ServerArgs.resolved_dict()`` (its fields), the literal keys of
    ``get_server_info`` itself, and the first scheduler's info (``Scheduler.get_init_info`` or, with data
    parallelism, ``DataParallelController.get_init_info``)."""
    engine = parse(reader, "sglang/srt/entrypoints/engine.py")
    keys = set(server_args) | set(method_dict_keys(engine, "Engine", "get_server_info"))
    keys |= set(method_dict_keys(parse(reader, "sglang/srt/managers/scheduler.py"), "Scheduler", "get_init_info",
                                 "result_dict"))
    keys |= set(method_dict_keys(parse(reader, "sglang/srt/managers/data_parallel_controller.py"),
                                 "DataParallelController", "get_init_info", "init_info"))
    return sorted(keys)


def module_string(module: ast.Module, variable: str) -> str:
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == variable for t in node.targets):
            if isinstance(node.value, ast.Constant):
                return str(node.value.value)
    raise KeyError(f"{variable} not found")


def entry(module: ast.Module, cls: str, file: str, *, fields: bool = False, methods: bool = False,
          attributes: bool = False) -> dict[str, Any]:
    """One ``classes`` entry of the snapshot."""
    out: dict[str, Any] = {"file": file}
    if fields:
        out["fields"] = class_fields(module, cls)
    if attributes:
        out["attributes"] = class_attributes(module, cls)
    if methods:
        out["methods"] = class_methods(module, cls)
    return out


# --- SGLang ------------------------------------------------------------------------------------

def wheel_reader(wheel: Path) -> Reader:
    archive = zipfile.ZipFile(wheel)
    return lambda path: archive.read(path).decode()


def sglang_server_args_fields(reader: Reader) -> list[str]:
    """``ServerArgs``: its own annotations plus those of every namespace struct in ``_INPUT_NAMESPACES``."""
    path = "sglang/srt/server_args.py"
    module = parse(reader, path)
    imports = {alias.asname or alias.name: node.module for node in module.body
               if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}
    namespaces: list[str] = []
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES"
                                                for t in node.targets):
            namespaces = [e.id for e in node.value.elts if isinstance(e, ast.Name)]  # type: ignore[attr-defined]
    if not namespaces:
        raise KeyError(f"_INPUT_NAMESPACES not found in {path}")
    fields: list[str] = []
    for name in namespaces:
        source = imports[name].replace(".", "/") + ".py"
        fields.extend(class_fields(parse(reader, source), name, private=True))
    fields.extend(f for f in class_fields(module, "ServerArgs", private=True) if f not in fields)
    return fields


def registry_from_entry_classes(reader: Reader, files: Iterable[str]) -> list[str]:
    """Class names bound to ``EntryClass`` (a name or a list of names) in each model module."""
    names: set[str] = set()
    for path in files:
        for node in parse(reader, path).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass"
                                                    for t in node.targets):
                values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                names.update(v.id if isinstance(v, ast.Name) else v.attr for v in values
                             if isinstance(v, (ast.Name, ast.Attribute)))
    return sorted(names)


def record_sglang(wheel: Path) -> dict[str, Any]:
    reader = wheel_reader(wheel)
    version = module_string(parse(reader, "sglang/_version.py"), "__version__")
    engine_py, io_py = "sglang/srt/entrypoints/engine.py", "sglang/srt/managers/io_struct.py"
    sampling_py = "sglang/srt/sampling/sampling_params.py"
    models = sorted(n for n in zipfile.ZipFile(wheel).namelist()
                    if re.fullmatch(r"sglang/srt/models/[^/]+\.py", n))
    server_args = sglang_server_args_fields(reader)
    startup_py = "sglang/srt/observability/startup_time.py"
    fpm_py = "sglang/srt/observability/forward_pass_metrics.py"   # per-iteration metrics: the step trace
    startup_keys = sorted(set(all_literal_dict_keys(parse(reader, startup_py)))
                          | {k for k, _ in _subscript_keys(parse(reader, startup_py))})
    return {
        "package": "sglang", "version": version,
        "source": {"kind": "wheel", "file": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()},
        "recorded_by": "engines/snapshots/record.py sglang",
        "classes": {
            "ServerArgs": {"file": "sglang/srt/server_args.py (+ srt/arg_groups/fields/*.py)",
                           "fields": server_args},
            "Engine": entry(parse(reader, engine_py), "Engine", engine_py, methods=True),
            "SamplingParams": entry(parse(reader, sampling_py), "SamplingParams", sampling_py, fields=True),
            "FlushCacheReqOutput": entry(parse(reader, io_py), "FlushCacheReqOutput", io_py, fields=True),
            **{cls: entry(parse(reader, fpm_py), cls, fpm_py, fields=True)
               for cls in ("ForwardPassMetrics", "ScheduledRequestMetrics", "QueuedRequestMetrics")},
        },
        "keys": {
            "generate_output": ["text", "output_ids", "meta_info"],
            "meta_info": dict_keys_of(parse(reader, "sglang/srt/managers/tokenizer_manager.py"), "meta_info"),
            "startup_time": startup_keys,
            "server_info": sglang_server_info_keys(reader, server_args),
        },
        # the kinds of values where the source shows them (stand-ins built from the snapshot are held to them)
        "types": {"startup_time": {k: v for k, v in value_kinds(reader, startup_py).items() if k in startup_keys}},
        "models": {"source": "EntryClass of sglang/srt/models/*.py",
                   "architectures": registry_from_entry_classes(reader, models)},
    }


# --- TensorRT-LLM ----------------------------------------------------------------------------

def git_reader(git_dir: Path, commit: str) -> Reader:
    def read(path: str) -> str:
        done = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"],
                              capture_output=True, text=True)
        if done.returncode:
            raise KeyError(path)
        return done.stdout
    return read


def git_list(git_dir: Path, commit: str, folder: str) -> list[str]:
    done = subprocess.run(["git", "--git-dir", str(git_dir), "ls-tree", "--name-only", f"{commit}:{folder}"],
                          capture_output=True, text=True, check=True)
    return [f"{folder}/{name}" for name in done.stdout.split()]


def dir_reader(root: Path) -> Reader:
    def read(path: str) -> str:
        try:
            return (root / path).read_text()
        except FileNotFoundError:
            raise KeyError(path) from None
    return read


class RecordingReader:
    """A ``Reader`` that remembers every path it was asked for and found (for ``source.files``)."""

    def __init__(self, reader: Reader):
        self.reader, self.read = reader, []

    def __call__(self, path: str) -> str:
        text = self.reader(path)
        if path not in self.read:
            self.read.append(path)
        return text


TRTLLM_MODELS_DIR = "tensorrt_llm/_torch/models"
TRTLLM_ARGS_PY = "tensorrt_llm/llmapi/llm_args.py"
TRTLLM_TRT_ARGS_PY = "tensorrt_llm/_tensorrt_engine/llm_args.py"   # where TrtLlmArgs moved after 1.2
TRTLLM_FILES = (
    "tensorrt_llm/version.py", TRTLLM_ARGS_PY, "tensorrt_llm/llmapi/llm.py", "tensorrt_llm/sampling_params.py",
    "tensorrt_llm/executor/result.py", "cpp/tensorrt_llm/executor/jsonSerialization.cpp",
)


def trtllm_file_list() -> list[str]:
    """What ``record_trtllm`` reads: these files, ``TrtLlmArgs``'s other home if llm_args.py lacks it,
    and every ``tensorrt_llm/_torch/models/*.py`` (the ``@register_auto_model`` registry)."""
    return [*TRTLLM_FILES, f"{TRTLLM_TRT_ARGS_PY} (only if {TRTLLM_ARGS_PY} has no TrtLlmArgs)",
            f"{TRTLLM_MODELS_DIR}/*.py (modeling_*.py with @register_auto_model, __init__.py, ...)"]


def file_sources(read: Iterable[str], commit: str | None, manifest: dict[str, Any] | None) -> dict[str, Any]:
    """``source`` fields naming the commit of every file read: one commit, or per file from ``manifest``."""
    files: dict[str, Any] = {}
    for path in sorted(read):
        if manifest is not None:
            if path not in manifest["files"]:
                raise KeyError(f"{path} was read but --sources names no commit for it")
            files[path] = manifest["files"][path]
        else:
            files[path] = commit
    commits = sorted({c for c in files.values() if c})
    out: dict[str, Any] = {"commit": commits[0] if len(commits) == 1 else None}
    if len(commits) > 1:
        out["commits"] = commits
    out["files"] = files
    return out


def registry_from_decorators(reader: Reader, files: Iterable[str], decorator: str) -> list[str]:
    """String arguments of ``@decorator("Arch")`` on classes (TensorRT-LLM's ``register_auto_model``)."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(parse(reader, path)):
            if isinstance(node, ast.ClassDef):
                for d in node.decorator_list:
                    if isinstance(d, ast.Call) and ast.unparse(d.func).endswith(decorator):
                        names.update(a.value for a in d.args if isinstance(a, ast.Constant))
    return sorted(names)


def cpp_json_fields(text: str) -> dict[str, list[str]]:
    """``NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Type, a, b, ...)`` -> ``{Type: [a, b, ...]}`` (the JSON keys)."""
    out = {}
    for match in re.finditer(r"NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE\(\s*(\w+)\s*,([^)]*)\)", text):
        out[match.group(1)] = [f.strip() for f in match.group(2).split(",") if f.strip()]
    return out


def _module_with_class(reader: Reader, paths: Iterable[str], name: str) -> tuple[str, ast.Module]:
    """The first of ``paths`` whose module defines class ``name``."""
    for path in paths:
        try:
            module = parse(reader, path)
        except KeyError:
            continue
        if any(isinstance(n, ast.ClassDef) and n.name == name for n in module.body):
            return path, module
    raise KeyError(f"class {name} is in none of {list(paths)}")


def record_trtllm(reader: Reader, model_files: list[str], version: str, source: dict[str, Any]) -> dict[str, Any]:
    args_py = TRTLLM_ARGS_PY
    args = parse(reader, args_py)
    trt_py, trt_args = _module_with_class(reader, [args_py, TRTLLM_TRT_ARGS_PY], "TrtLlmArgs")
    llm_py = "tensorrt_llm/llmapi/llm.py"
    llm = parse(reader, llm_py)
    result_py, sampling_py = "tensorrt_llm/executor/result.py", "tensorrt_llm/sampling_params.py"
    result, sampling = parse(reader, result_py), parse(reader, sampling_py)
    stats = cpp_json_fields(reader("cpp/tensorrt_llm/executor/jsonSerialization.cpp"))
    classes = {name: entry(args, name, args_py, fields=True)
               for name in ("BaseLlmArgs", "TorchLlmArgs", "KvCacheConfig", "SchedulerConfig", "CudaGraphConfig")}
    classes["TrtLlmArgs"] = entry(trt_args, "TrtLlmArgs", trt_py, fields=True)
    classes.update({
        "LLM": entry(llm, "LLM", llm_py, methods=True, attributes=True),
        "SamplingParams": entry(sampling, "SamplingParams", sampling_py, fields=True),
        "RequestOutput": entry(result, "RequestOutput", result_py, attributes=True, fields=True),
        "CompletionOutput": entry(result, "CompletionOutput", result_py, attributes=True, fields=True),
    })
    return {
        "package": "tensorrt_llm", "version": version, "source": source,
        "recorded_by": "engines/snapshots/record.py trtllm",
        "classes": classes,
        "keys": {name: stats[name] for name in ("IterationStats", "KvCacheStats", "InflightBatchingStats")
                 if name in stats},
        "models": {"source": "@register_auto_model of tensorrt_llm/_torch/models/*.py",
                   "architectures": registry_from_decorators(reader, model_files, "register_auto_model")},
    }


def _registry_files(files: Iterable[str]) -> list[str]:
    """The model modules of ``files``: ``tensorrt_llm/_torch/models/*.py`` (not its subfolders)."""
    return sorted(f for f in files if re.fullmatch(re.escape(TRTLLM_MODELS_DIR) + r"/[^/]+\.py", f))


# --- CLI ---------------------------------------------------------------------------------------

def write(snapshot: dict[str, Any], out_dir: Path = OUT_DIR) -> Path:
    path = out_dir / f"{snapshot['package']}-{snapshot['version']}.json"
    path.write_text(json.dumps(snapshot, indent=1, sort_keys=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="engine", required=True)
    sg = sub.add_parser("sglang", help="from a downloaded sglang wheel")
    sg.add_argument("wheel", type=Path)
    tr = sub.add_parser("trtllm", help="from TensorRT-LLM source at a named commit")
    where = tr.add_mutually_exclusive_group(required=True)
    where.add_argument("--git-dir", type=Path, help="a clone or mirror's git directory")
    where.add_argument("--source-dir", type=Path, help="a checkout of exactly --commit, or a tree named by --sources")
    where.add_argument("--list-files", action="store_true", help="print the paths the recorder reads, and stop")
    tr.add_argument("--commit", default=None, help="the commit the whole tree is at")
    tr.add_argument("--sources", type=Path, default=None,
                    help='JSON {"repository": ..., "files": {path: commit}}: the commit of each file of --source-dir')
    tr.add_argument("--tag", default=None, help="the tag the commit carries, for the record")
    tr.add_argument("--version", default=None, help="default: tensorrt_llm/version.py at the commit")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    if args.engine == "sglang":
        snapshot = record_sglang(args.wheel)
    elif args.list_files:
        print("\n".join(trtllm_file_list()))
        return 0
    else:
        manifest = json.loads(args.sources.read_text()) if args.sources else None
        if manifest is None and not args.commit:
            parser.error("trtllm needs --commit (or --sources naming each file's commit)")
        if manifest is not None and args.git_dir:
            parser.error("--sources goes with --source-dir")
        if args.git_dir:
            reader = RecordingReader(git_reader(args.git_dir, args.commit))
            files = git_list(args.git_dir, args.commit, TRTLLM_MODELS_DIR)
        else:
            reader = RecordingReader(dir_reader(args.source_dir))
            models = args.source_dir / TRTLLM_MODELS_DIR
            files = sorted(str(p.relative_to(args.source_dir)) for p in models.glob("*.py"))
        version = args.version or module_string(parse(reader, "tensorrt_llm/version.py"), "__version__")
        repository = (manifest or {}).get("repository", "NVIDIA/TensorRT-LLM")
        source = {"kind": "git", "repository": repository, "commit": args.commit, "tag": args.tag}
        snapshot = record_trtllm(reader, _registry_files(files), version, source)
        snapshot["source"].update(file_sources(reader.read, args.commit, manifest))
        if args.commit and snapshot["source"]["commit"] not in (None, args.commit):
            parser.error(f"--commit {args.commit} but --sources names {snapshot['source']['commit']}")
    print(write(snapshot, args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
