"""
Research and conversion tools around the reading path: they import the root's files, and no root file
imports them. Run them from the repository root as modules, e.g. `python -m tools.compare --help`: `-m`
puts the root on the import path, as `python train.py` does for the root's own scripts (`python
tools/compare.py` works too: each tool then puts the root there itself). This file makes `tools` a
regular package, so an installed package of the same name cannot shadow it.

    convert.py           the paper's Hugging Face checkpoints -> native; native -> stock GPTNeoXForCausalLM
    compare.py           the paper's controlled comparison (learned vs binary vs affine, several seeds)
    scaling.py           the learned-vs-binary gap against model size and tokens (compare.py's runs)
    quantize_quality.py  what int8 weights (quantize.py) cost a trained model
    bench.py             measured speed of training, sampling, checkpoint loading and data preparation
    gpu_check.py         the GPU path end to end, offline, in one command (paper-size memory, train, sample,
                         stop and resume, torchrun): one table, written row by row
    code_figure.py       README's figure of the code table and its two lifts (assets/code_lifts.png)
    lines.py             the reading path's line counts, against the targets tests/test_layout.py keeps
"""
