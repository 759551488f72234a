# The typing stub (shardplan/__init__.pyi) declares every keyword each function takes, no more.
import ast
import inspect
from pathlib import Path

import pytest

import shardplan

STUB = Path(shardplan.__file__).with_name("__init__.pyi")


def stub_options():
    """{TypedDict name: its keys, inherited ones included}, {function: its TypedDict and keywords}."""
    tree = ast.parse(STUB.read_text())
    dicts, functions = {}, {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Options"):
            keys = set()
            for base in node.bases:
                if isinstance(base, ast.Name) and base.id in dicts:
                    keys |= dicts[base.id]
            keys |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)}
            dicts[node.name] = keys
        if isinstance(node, ast.FunctionDef):
            unpacked = node.args.kwarg.annotation.slice.id
            named = {a.arg for a in node.args.kwonlyargs}
            functions[node.name] = dicts[unpacked] | named
    return functions


def runtime_options(function):
    params = inspect.signature(function).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):  # the emitters: _plan_options's
        params = inspect.signature(shardplan._plan_options).parameters
    return set(params)


def test_stub_lists_every_function_and_option():
    declared = stub_options()
    assert set(declared) == set(shardplan.__all__) - {"InputError"}
    for name, options in declared.items():
        assert options == runtime_options(getattr(shardplan, name)), name


def test_module_stub_is_what_stubgen_writes(tmp_path):
    # python/shardplan/_shardplan.pyi is nanobind's stubgen output for the compiled module:
    # python -m nanobind.stubgen -m shardplan._shardplan -o python/shardplan/_shardplan.pyi
    stubgen = pytest.importorskip("nanobind.stubgen")
    out = tmp_path / "_shardplan.pyi"
    stubgen.main(["-q", "-m", "shardplan._shardplan", "-o", str(out)])
    assert out.read_text() == STUB.with_name("_shardplan.pyi").read_text()
