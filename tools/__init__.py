"""
Research and conversion tools around the reading path: they import the root's files, and no root
file imports them. Run them from the repository root as modules, e.g. `python -m tools.compare
--help`: `-m` puts the root on the import path, as `python train.py` does for the root's own
scripts (`python tools/compare.py` works too: each tool then puts the root there itself). This
file makes `tools` a regular package, so an installed package of the same name cannot shadow it.

    convert.py           the paper's Hugging Face checkpoints -> native; native -> stock
                         GPTNeoXForCausalLM; native -> int8 for sampling
    compare.py           the paper's controlled comparison (learned vs binary vs affine, seeds)
    scaling.py           the learned-vs-binary gap against model size and tokens (compare's runs)
    share.py             the gap against the table's share of parameters (V cut) and tokens per
                         parameter
    paper_point.py       the gap at the paper's point (table share 12.5%, 36 tokens per
                         parameter): each size's lr searched, and the controls
    quickstart.py        the quick start measured (time, loss per byte, real words) beside
                         nanoGPT's CPU recipe, and the search for its defaults
    quantize_quality.py  what int8 weights (quantize.py) cost a trained model
    bench.py             measured speed of training, sampling, checkpoint loading, data preparation
    gpu_check.py         the GPU path end to end, offline, in one command (paper-size memory,
                         train, sample, stop and resume, torchrun): one table, row by row
    code_figure.py       README's figure of the code table and its two lifts
                         (assets/code_lifts.png)
    lines.py             the reading path's line counts, against the targets of test_layout.py
"""
