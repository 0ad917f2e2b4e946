"""
The reading path's line counts: where GPT.forward starts in model.py, where train.py calls .backward(), the
lines of train.py's training loop, the lines of each root file and the lines wider than 100 characters in
model.py, train.py and sample.py; with the targets the project keeps (tests/test_layout.py holds them).

    python -m tools.lines
"""

import ast
import os
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READING = ("model.py", "train.py", "sample.py")
# issue 51's and 60's limits; nanoGPT for scale: 330 + 305 = 635 lines to its backward
TARGETS = {"model.py": 400, "train.py": 450, "sample.py": 200,
           "lines over 100 chars in model, train, sample": 0,
           "model.py + train.py to backward": 680, "train.loop lines": 70}


def line_count(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return sum(1 for _ in f)


def wide_lines(width):
    """Lines longer than `width` characters in the three files a learner reads."""
    return sum(len(line.rstrip("\n")) > width for name in READING
               for line in open(os.path.join(ROOT, name), encoding="utf-8"))


def forward_line():
    """The line of `def forward` in model.py's class GPT."""
    tree = ast.parse(open(os.path.join(ROOT, "model.py"), encoding="utf-8").read())
    gpt = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GPT")
    return next(n.lineno for n in gpt.body if isinstance(n, ast.FunctionDef) and n.name == "forward")


def backward_line():
    """The line of train.py's one `.backward()` call."""
    lines = open(os.path.join(ROOT, "train.py"), encoding="utf-8").read().split("\n")
    return next(i for i, line in enumerate(lines, 1) if ".backward()" in line)


def loop_lines():
    """The lines of train.py's training loop, `def loop` to its last line."""
    tree = ast.parse(open(os.path.join(ROOT, "train.py"), encoding="utf-8").read())
    loop = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "loop")
    return loop.end_lineno - loop.lineno + 1


def counts():
    """-> {what: lines}: GPT.forward's line, train.py's backward line, the two learner totals, each root file."""
    files = sorted(f for f in os.listdir(ROOT) if f.endswith(".py"))
    out = {"GPT.forward at model.py line": forward_line(), "backward at train.py line": backward_line()}
    out["model.py + train.py to backward"] = line_count("model.py") + out["backward at train.py line"]
    out["train.loop lines"] = loop_lines()
    out["lines over 100 chars in model, train, sample"] = wide_lines(100)
    return {**out, **{f: line_count(f) for f in files}}


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    from bincode_gpt.settings import config_parser, parse_settings
    from bincode_gpt.exits import run_main

    @dataclass
    class LinesConfig:
        pass

    def main(argv=None):
        parse_settings(config_parser(LinesConfig, __doc__.strip().split("\n\n")[0]), argv)
        for what, n in counts().items():
            target = f"  (target <= {TARGETS[what]})" if what in TARGETS else ""
            print(f"{what:46s} {n:5d}{target}")

    raise SystemExit(run_main(main))
