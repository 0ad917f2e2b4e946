"""
bincode_gpt: what the scripts at the root import besides torch, numpy and tiktoken, one job a
module.

The idea and the model are model.py (it needs none of this); train.py, sample.py and
prepare_data.py tell their story and call in here for the rest. README's table of `bincode_gpt/`
lists every module with its job, in the order they import each other (tests/test_layout.py keeps
that table true).
"""
