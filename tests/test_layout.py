"""The layout README promises (issue 26): the root is the reading path, listed in README in the order its files
depend on each other, so no file is used before it is read; tools sit in tools/ and no root file imports
them; sampling pulls in no training code."""

import ast
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's


def reading_order():
    """The root files README's reading table lists, in its order (rows `| \\`name.py\\` | ... |`)."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return re.findall(r"^\| `(\w+)\.py` \|", readme, re.M)


def imports(path):
    """The modules a file imports anywhere in it (top level, inside functions, under __main__)."""
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_readme_lists_every_root_file_in_dependency_order():
    order = reading_order()
    root = sorted(f[:-3] for f in os.listdir(ROOT) if f.endswith(".py") and f not in ("conftest.py", "test_model.py"))
    assert sorted(order) == root  # a new file at the root takes its place in the reading order
    for i, name in enumerate(order):
        used = imports(os.path.join(ROOT, f"{name}.py")) & (set(root) | {"tools"})
        assert used <= set(order[:i]), f"{name}.py imports {sorted(used - set(order[:i]))}, listed after it (or a tool)"


def test_sampling_pulls_in_no_training_or_tool_code():
    code = "import sys, sample; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {'train', 'prepare_data', 'tools'})))"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "\n", "")


def test_the_small_preset_has_the_default_vocabulary():
    """8,192 has one home, tokenizer.SMALL_VOCAB; model.py keeps a copy (it imports torch alone), held equal here."""
    from model import PRESETS
    from prepare_data import DEFAULT_VOCAB
    from tokenizer import SMALL_VOCAB
    from tools.compare import DataSettings

    assert PRESETS["small"]["vocab_size"] == DEFAULT_VOCAB["shakespeare"] == DataSettings().vocab_size == SMALL_VOCAB
