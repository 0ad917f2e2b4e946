"""The layout README promises (issues 26, 33): README lists the three files a learner reads (model, train, sample),
then the plumbing they import, then tools/, each table in the order its files depend on each other, so no file is
used before it is read; no root file imports a tool; sampling pulls in no training code and training no int8 code;
README stays a front door (<= 160 lines), and the reading path stays short (tools/lines.py)."""

import ast
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's


def readme():
    return open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def reading_tables():
    """The files of each table README lists (rows `| `name.py` | ... |`), table by table, in its order."""
    tables, rows = [], []
    for line in readme().split("\n") + [""]:
        found = re.match(r"^\| `([\w/]+)\.py` \|", line)
        if found:
            rows.append(found.group(1).replace("/", "."))
        elif rows and not line.startswith("|"):
            tables, rows = tables + [rows], []
    return tables


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
    learner, plumbing, tools = reading_tables()
    assert learner == ["model", "train", "sample"]  # the three files a learner reads, first
    root = sorted(f[:-3] for f in os.listdir(ROOT) if f.endswith(".py") and f not in ("conftest.py", "test_model.py"))
    assert sorted(learner + plumbing) == root  # a new file at the root takes its place in a table
    assert tools == sorted(tools, key=tools.index) and sorted(tools) == sorted(
        f"tools.{f[:-3]}" for f in os.listdir(os.path.join(ROOT, "tools")) if f.endswith(".py") and f != "__init__.py")
    for table in (learner, plumbing, tools):
        for i, name in enumerate(table):
            used = imports(os.path.join(ROOT, name.replace(".", os.sep) + ".py")) & set(table)
            used |= {f"tools.{m}" for m in tools_imported(name) if f"tools.{m}" in table}
            assert used <= set(table[:i]), f"{name}.py imports {sorted(used - set(table[:i]))}, listed after it"
    for name in root:  # the root never imports a tool, and the plumbing never the training or sampling script
        used = imports(os.path.join(ROOT, f"{name}.py"))
        assert "tools" not in used and (name in learner or not used & {"train", "sample"}), name


def tools_imported(name):
    """The tools a tool imports as `from tools import x` or `import tools.x`."""
    found = set()
    if not name.startswith("tools."):
        return found
    for node in ast.walk(ast.parse(open(os.path.join(ROOT, name.replace(".", os.sep) + ".py"), encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and node.module == "tools":
            found.update(a.name for a in node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found.update(n.split(".")[1] for n in names if n.startswith("tools."))
    return found


def test_readme_is_a_front_door():
    """README <= 160 lines (findings go to docs/), and it lists the learner's three files before any other."""
    lines = readme().split("\n")
    assert len(readme().splitlines()) <= 160
    first = next(i for i, line in enumerate(lines) if re.match(r"^\| `[\w/]+\.py` \|", line))
    assert lines[first].startswith("| `model.py` |")


def test_the_reading_path_is_short():
    """model.py whole and train.py to its backward in at most 600 lines (nanoGPT: 635), train.py at most 450,
    as tools/lines.py counts them."""
    from tools import lines

    n = lines.counts()
    assert n["model.py + train.py to backward"] <= lines.TARGETS["model.py + train.py to backward"] == 600
    assert n["train.py"] <= lines.TARGETS["train.py"] == 450
    assert n["GPT.forward at model.py line"] < n["model.py"] and n["backward at train.py line"] < n["train.py"]


def test_sampling_pulls_in_no_training_or_tool_code():
    code = "import sys, sample; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {'train', 'prepare_data', 'tools'})))"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "\n", "")


def test_training_pulls_in_no_int8_code():
    """quantize.py (madvise, /proc/self/maps, a packing thread) loads only when int8 is used: not for training, not
    for reading a float checkpoint, not for sampling one."""
    code = ("import sys, train, sample, checkpoint; print(' '.join(m for m in sys.modules if m == 'quantize'))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "\n", "")


def test_the_presets_have_the_default_vocabularies():
    """The default cuts have one home each in tokenizer.py: MINI_VOCAB (512), read by the mini preset (train.py's
    default) and prepare_data.py's default for shakespeare; SMALL_VOCAB (8,192), by the small preset and the studies'
    default (no other file writes the numbers as code)."""
    from model import PRESETS
    from prepare_data import DEFAULT_VOCAB
    from tokenizer import MINI_VOCAB, SMALL_VOCAB
    from tools.compare import DataSettings
    from train import TrainConfig

    assert PRESETS[TrainConfig().preset]["vocab_size"] == DEFAULT_VOCAB["shakespeare"] == MINI_VOCAB == 512
    assert PRESETS["small"]["vocab_size"] == DataSettings().vocab_size == SMALL_VOCAB == 8192
