"""The layout README promises (issues 26, 33): README lists the three files a learner reads (model, train, sample),
then the plumbing they import, then tools/, each table in the order its files depend on each other, so no file is
used before it is read; no root file imports a tool; sampling pulls in no training code and training no int8 code;
README stays a front door (<= 160 lines), and the reading path stays short (tools/lines.py); train.py imports at
most 6 package modules (issue 51), no module reads another's objects by attribute name through an untyped
parameter, and each package module has its test file."""

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
    """The root is the reading list (model, train, sample, prepare_data); everything they import besides torch,
    numpy and tiktoken is one package, bincode_gpt/, listed as one table; the tools last. In each table no file
    imports one listed after it; the package and the tools never import a script, the root never a tool."""
    reading, package, tools = reading_tables()
    assert reading == ["model", "train", "sample", "prepare_data"]
    root = sorted(f[:-3] for f in os.listdir(ROOT) if f.endswith(".py") and f not in ("conftest.py", "test_model.py"))
    assert sorted(reading) == root  # a new file at the root takes its place in the reading list
    modules = sorted(f"bincode_gpt.{f[:-3]}" for f in os.listdir(os.path.join(ROOT, "bincode_gpt"))
                     if f.endswith(".py") and f != "__init__.py")
    assert sorted(package) == modules  # each module of the package is in its table
    assert sorted(tools) == sorted(
        f"tools.{f[:-3]}" for f in os.listdir(os.path.join(ROOT, "tools")) if f.endswith(".py") and f != "__init__.py")
    for table in (reading, package, tools):
        for i, name in enumerate(table):
            used = imports(os.path.join(ROOT, name.replace(".", os.sep) + ".py")) & set(table)
            used |= {f"tools.{m}" for m in tools_imported(name) if f"tools.{m}" in table}
            assert used <= set(table[:i]), f"{name}.py imports {sorted(used - set(table[:i]))}, listed after it"
    scripts = {"train", "sample", "prepare_data"}
    for name in root:
        assert "tools" not in imports(os.path.join(ROOT, f"{name}.py")), name
    for name in package:  # the package serves the scripts: it never imports one, nor a tool
        used = imports(os.path.join(ROOT, name.replace(".", os.sep) + ".py"))
        assert not used & (scripts | {"tools"}), name


def test_model_py_stands_alone(tmp_path):
    """model.py imports torch and the standard library only: copied alone into an empty folder, it imports, and
    `python model.py --preset paper` prints the paper's parameter table."""
    import shutil

    shutil.copy(os.path.join(ROOT, "model.py"), tmp_path / "model.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", "import sys, model; print(sorted({m.split('.')[0] for m in sys.modules} "
                        "& {'bincode_gpt', 'tiktoken', 'tools'}))"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "[]\n", "")
    r = subprocess.run([sys.executable, "model.py", "--preset", "paper"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.splitlines()[3] == "| binary | 469,828,608 | 0 | 1,048,576 |"


def tools_imported(name):
    """The tools a tool imports as `from tools import x` or `import tools.x`."""
    found = set()
    if not name.startswith("tools."):
        return found
    path = os.path.join(ROOT, name.replace(".", os.sep) + ".py")
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and node.module == "tools":
            found.update(a.name for a in node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found.update(n.split(".")[1] for n in names if n.startswith("tools."))
    return found


def test_layout_md_names_the_tools_each_tool_imports():
    """docs/layout.md's table of the tools that import tools is the code's: a row for every tool that imports one,
    naming exactly the tools it imports (anywhere in it: tools_imported); the root and the package import none."""
    lines = open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8").read().split("\n")
    start = lines.index("| tool | imports the tools | for |") + 2
    table = lines[start : next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))]
    documented = {}
    for row in table:
        tool, used, _ = row.strip("|").split(" | ")
        documented[tool.strip(" `")] = set(re.findall(r"`(\w+)`", used))
    tools = [f[:-3] for f in os.listdir(os.path.join(ROOT, "tools")) if f.endswith(".py") and f != "__init__.py"]
    found = {t: tools_imported(f"tools.{t}") for t in tools}
    assert documented == {t: used for t, used in found.items() if used}


def test_readme_is_a_front_door():
    """README <= 160 lines (findings go to docs/), and it lists the reading list before any other file."""
    lines = readme().split("\n")
    assert len(readme().splitlines()) <= 160
    first = next(i for i, line in enumerate(lines) if re.match(r"^\| `[\w/]+\.py` \|", line))
    assert lines[first].startswith("| `model.py` |")


def test_the_reading_path_is_short():
    """model.py, train.py and sample.py at most 400, 450 and 200 lines, none over 100 characters, one statement a
    line (no semicolons between statements); model.py and train.py to its backward at most 680 lines, the training
    loop at most 70 (issue 60), as tools/lines.py counts them."""
    from tools import lines

    n = lines.counts()
    assert lines.TARGETS == {"model.py": 400, "train.py": 450, "sample.py": 200,
                             "lines over 100 chars in model, train, sample": 0,
                             "model.py + train.py to backward": 680, "train.loop lines": 70}
    for what, most in lines.TARGETS.items():
        assert n[what] <= most, what
    assert n["GPT.forward at model.py line"] < n["model.py"] and n["backward at train.py line"] < n["train.py"]
    for name in lines.READING:  # statements without a body of their own: two on one line is packing
        tree = ast.parse(open(os.path.join(ROOT, name), encoding="utf-8").read())
        starts = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.stmt) and not hasattr(node, "body")]
        assert len(starts) == len(set(starts)), f"{name}: two statements on one line"


def package_modules(path):
    """The bincode_gpt modules a file imports, in the order it first names them."""
    found = []
    for node in ast.walk(ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module == "bincode_gpt":
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bincode_gpt."):
            names = [node.module.split(".")[1]]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith("bincode_gpt.")]
        found += [n for n in names if n not in found]
    return found


def test_train_py_imports_at_most_6_package_modules_exits_first():
    """exits first: its import makes a Ctrl-C while torch loads one line and exit 130 (exits.quiet_interrupt)."""
    found = package_modules("train.py")
    assert found == ["exits", "devices", "ranks", "run_dir", "divergence", "settings"]
    for script in ("train.py", "sample.py", "prepare_data.py"):
        tree = ast.parse(open(os.path.join(ROOT, script), encoding="utf-8").read())
        first = next(node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)))
        assert isinstance(first, ast.ImportFrom) and first.module == "bincode_gpt.exits", script


def project_attributes(path):
    """The attribute names a file's classes define (fields, self.x = ..., methods)."""
    names = set()
    for cls in ast.walk(ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read())):
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in ast.walk(cls):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
                names.add(node.name)
    return names


def test_no_module_reads_anothers_objects_through_an_untyped_parameter():
    """A function that reads `p.x`, x an attribute of another file's class, names that class in p's annotation, so
    the coupling shows. Left out: a tensor's attributes (dtype, device, ...), and model.py's `cache`: model.py
    stands alone, and update/advance are its own interface, which decode.KVCache implements."""
    import torch

    files = [f"bincode_gpt/{f}" for f in os.listdir(os.path.join(ROOT, "bincode_gpt")) if f.endswith(".py")]
    files += ["model.py", "train.py", "sample.py", "prepare_data.py"]
    owned = {f: project_attributes(f) for f in files}
    tensor = set(dir(torch.Tensor))
    found = []
    for f in files:
        for fn in ast.walk(ast.parse(open(os.path.join(ROOT, f), encoding="utf-8").read())):
            if not isinstance(fn, ast.FunctionDef):
                continue
            params = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
            untyped = {a.arg for a in params if a.annotation is None} - {"self", "cls"}
            if f == "model.py":
                untyped -= {"cache"}
            for node in ast.walk(fn):
                if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                    continue
                x = node.attr
                if node.value.id in untyped and x not in owned[f] and x not in tensor:
                    found += [f"{f}:{fn.name}: {node.value.id}.{x} ({g})" for g in files if x in owned[g]]
    assert found == []


def test_each_package_module_has_its_test_file():
    """Where a newcomer looks for a module's tests (issue 51): bincode_gpt/X.py's are in tests/test_X.py."""
    modules = sorted(f for f in os.listdir(os.path.join(ROOT, "bincode_gpt"))
                     if f.endswith(".py") and f != "__init__.py")
    assert [m for m in modules if not os.path.isfile(os.path.join(ROOT, "tests", f"test_{m}"))] == []


def test_sampling_pulls_in_no_training_or_tool_code():
    code = ("import sys, sample; print(' '.join(sorted(m for m in sys.modules "
            "if m.split('.')[0] in {'train', 'prepare_data', 'tools'})))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "\n", "")


def test_training_pulls_in_no_int8_code():
    """quantize.py (madvise, /proc/self/maps, a packing thread) loads only when int8 is used: not for training, not
    for reading a float checkpoint, not for sampling one."""
    code = ("import sys, train, sample, bincode_gpt.checkpoint; "
            "print(' '.join(m for m in sys.modules if m == 'bincode_gpt.quantize'))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "\n", "")


def test_the_presets_have_the_default_vocabularies():
    """The default cuts have their home in model.py, beside the presets that use them: MINI_VOCAB (512), the mini
    preset's (train.py's default), which prepare_data.py writes as its default for shakespeare (it does not import
    torch, so not model.py); SMALL_VOCAB (8,192), the small preset's and the studies' default."""
    from model import MINI_VOCAB, PRESETS, SMALL_VOCAB
    from prepare_data import DEFAULT_VOCAB
    from tools.compare import DataSettings
    from train import TrainConfig

    assert PRESETS[TrainConfig().preset]["vocab_size"] == DEFAULT_VOCAB["shakespeare"] == MINI_VOCAB == 512
    assert PRESETS["small"]["vocab_size"] == DataSettings().vocab_size == SMALL_VOCAB == 8192
