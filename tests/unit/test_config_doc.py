"""docs/configuration.md is what anydraft/cli/config_doc.py generates from the code, every setting has a doc,
and every environment variable the package reads is listed."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from anydraft.cli import config_doc
from anydraft.config import EngineConfig, SamplingParams, SpeculativeConfig

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"


def test_configuration_md_is_up_to_date():
    assert DOC.read_text() == config_doc.render(), (
        "docs/configuration.md differs from the code; regenerate it: "
        "python -m anydraft.cli.config_doc > docs/configuration.md")


def test_every_config_field_has_a_doc():
    for cls in (SamplingParams, SpeculativeConfig, EngineConfig):
        docs = config_doc.field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{cls.__name__} fields without a doc string under them in config.py: {missing}"


def test_every_llm_argument_has_a_doc():
    import inspect

    from anydraft.llm import LLM

    names = [n for n in inspect.signature(LLM.__init__).parameters if n != "self"]
    missing = [n for n in names if n not in config_doc.llm_arg_docs()]
    assert not missing, f"LLM arguments missing from the Args section of its docstring: {missing}"


def test_every_environment_variable_read_is_listed():
    # A variable is a whole string literal in Python (environ.get("X"), a constant, the vLLM plug-in's table) or a
    # getenv("X") in the C++ sources; ANYDRAFT_AMX_INT8 (a macro) and the vLLM worker's line tags are neither.
    read = set()
    for path in (REPO / "anydraft").rglob("*"):
        if path.suffix == ".py":
            read |= set(re.findall(r"[\"'](ANYDRAFT_[A-Z0-9_]+)[\"']", path.read_text()))
        elif path.suffix in (".h", ".cpp"):
            read |= set(re.findall(r"getenv\(\"(ANYDRAFT_[A-Z0-9_]+)\"\)", path.read_text()))
    listed = set(re.findall(r"`(ANYDRAFT_[A-Z0-9_]+)`", config_doc.ENVIRONMENT))
    assert read, "found no ANYDRAFT_ variable in the package: the scan is broken"
    assert not read - listed, f"variables the package reads but config_doc.ENVIRONMENT does not list: {read - listed}"
    assert not listed - read, f"variables config_doc.ENVIRONMENT lists but nothing reads: {listed - read}"


def test_field_docs_reads_the_string_under_each_field():
    @dataclasses.dataclass
    class Example:
        a: int = 1
        """first"""
        b: int = 2
        c: int = 3
        """third,
        on two lines"""

    assert config_doc.field_docs(Example) == {"a": "first", "c": "third, on two lines"}
