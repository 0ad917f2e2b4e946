"""
bincode_gpt: what the scripts at the root import besides torch, numpy and tiktoken, one job a module.

The idea and the model are model.py (it needs none of this); train.py, sample.py and prepare_data.py tell their
story and call in here for the rest: files that are never half written (files), the command line (cli), devices,
tokenizers, the text read and the token shards written (text, shards), the windows training reads (windows),
decoding, memory arithmetic, int8 weights, checkpoints, and a run's safety (launch, stopping, run_dir, preflight).
README's table lists the modules in the order they import each other.
"""
