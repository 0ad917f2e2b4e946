"""The packages' indexes stay true: tools/__init__.py lists every tool, each with its job, and no
other; bincode_gpt/__init__.py names only files and modules that exist, and every module if it
lists them."""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's
# from the index bincode_gpt/__init__.py had before issue 51: modules gone or renamed
STALE = """the command line (cli), devices, tokenizers, the text read and the token shards written
(text, shards), the windows training reads (windows), and a run's safety (launch, stopping)."""


def modules(package):
    """The modules of a package folder, by file name, its __init__.py left out."""
    names = os.listdir(os.path.join(ROOT, package))
    return sorted(f for f in names if f.endswith(".py") and f != "__init__.py")


def index(package):
    """The docstring of a package's __init__.py."""
    with open(os.path.join(ROOT, package, "__init__.py"), encoding="utf-8") as f:
        return ast.get_docstring(ast.parse(f.read()))


def rows(text):
    """The files an index lists, one a row: `    name.py    what it does`."""
    return sorted(re.findall(r"^    (\w+\.py)  +\S", text, flags=re.M))


def missing(text):
    """What a package index names that is not there: paths (`x.py`, `tests/x.py`) found neither at
    the root nor in bincode_gpt/, and module names given in parentheses, as "(text, shards)"."""
    folders = ("", "bincode_gpt")
    paths = re.findall(r"\b([\w/]+\.py)\b", text)
    gone = [p for p in paths if not any(os.path.isfile(os.path.join(ROOT, d, p)) for d in folders)]
    for group in re.findall(r"\(([^()]*)\)", text):
        names = [n.strip() for n in group.split(",")]
        if all(re.fullmatch(r"[a-z_]+", n) for n in names):
            gone += [n for n in names if f"{n}.py" not in modules("bincode_gpt")]
    return gone


def test_the_tools_index_lists_every_tool_and_no_other():
    listed = rows(index("tools"))
    assert listed == modules("tools")
    assert len(set(listed)) == len(listed)


def test_the_package_index_names_only_what_exists():
    text = index("bincode_gpt")
    assert rows(text) in ([], modules("bincode_gpt"))  # a list of modules is a complete one
    assert missing(text) == []
    assert "README's table" in text  # where the modules are listed: test_layout keeps it true


def test_a_stale_index_is_caught():
    assert {"cli", "text", "launch"} <= set(missing(STALE))
    assert rows("    bench.py    speed\n    text.py    the text read\n") != modules("tools")
