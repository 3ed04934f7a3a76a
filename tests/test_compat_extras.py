"""Importing an adapter without its framework names the extra to install.

Each case runs in a fresh interpreter where the framework cannot be
imported (its top-level package is `None` in `sys.modules`, as if it were
not installed, or a stand-in module lacks a name, as an old version
would): no database is involved, so these run once, not per engine.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CASES = [  # adapter module, the extra it needs, a package the extra brings
    ("memorm.compat.langgraph", "langgraph", "langgraph"),
    ("memorm.compat.langgraph", "langgraph", "langchain_core"),
    ("memorm.compat.langgraph_store", "langgraph", "langgraph"),
    ("memorm.compat.langchain", "langchain", "langchain_core"),
    ("memorm.compat.langchain.vectorstore", "langchain", "langchain_core"),
    ("memorm.compat.openai_agents", "openai-agents", "agents"),
    ("memorm.compat.adk", "adk", "google"),  # ADK is `google.adk`: its top-level package is `google`
    ("memorm.compat.adk_events", "adk", "google"),
    ("memorm.mcp.server", "mcp", "mcp"),  # `memorm mcp`: tests/test_mcp.py checks the command's one line
]


def _import_error(setup: str, module: str) -> tuple[str, str, str | None]:
    """The type, message and `name` of the error importing `module` raises after `setup`."""
    script = textwrap.dedent(
        f"""
        import importlib, sys, types
        {setup}
        try:
            importlib.import_module({module!r})
        except ImportError as error:
            print(type(error).__name__, error.name, sep="\\n")
            print(error)
        else:
            print("imported")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    kind, name, message = done.stdout.split("\n", 2)
    return kind, message.strip(), name


@pytest.mark.parametrize(("module", "extra", "package"), CASES)
def test_an_adapter_without_its_framework_names_the_extra(module: str, extra: str, package: str) -> None:
    kind, message, name = _import_error(f"sys.modules[{package!r}] = None", module)
    assert kind == "ModuleNotFoundError"  # still what `except ImportError` catches
    assert message.startswith(f"{module.rsplit('.vectorstore', 1)[0]} needs memorm's `{extra}` extra")
    assert f"pip install 'memorm[{extra}]'" in message
    assert package in message  # the original error, for the curious
    assert name is not None
    assert name.split(".")[0] == package  # the module not found: the package, or one of its modules


def test_an_adapter_with_a_framework_too_old_says_to_upgrade_it() -> None:
    # The package imports, but lacks what memorm uses: as an older release would.
    old = "sys.modules['agents.memory.session_settings'] = types.ModuleType('agents.memory.session_settings')"
    kind, message, _ = _import_error(old, "memorm.compat.openai_agents")
    assert kind == "ImportError"
    assert message.startswith(
        "memorm.compat.openai_agents needs memorm's `openai-agents` extra at the versions"
    )
    assert "pip install -U 'memorm[openai-agents]'" in message
    assert "cannot import name" in message
