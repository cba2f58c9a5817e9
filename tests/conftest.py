"""Shared pytest setup: make the top-level scripts importable and keep torch on few threads.

Run the whole suite with `python -m pytest -q tests`.

Shared by several test files (import the helpers with `from conftest import tiny, seeded_model`):
    ROOT                       the repository folder
    POSITIONS                  model.py's position schemes
    SENTENCE                   the memorized sentence
    tiny(**overrides)          a 2-layer, 32-wide tiny-preset config (vocab 100, 32 positions)
    seeded_model(cfg, seed=0)  a freshly initialized model in eval mode, the same for the same seed
    save_checkpoint(net, enc, folder)  a model and its tokenizer saved as a training run saves them
    random_checkpoint(folder, texts)   a 1-layer random model and a 320-token BPE on texts, saved
    read_log(out)              a run's log.jsonl as a list of records
Fixtures (session scope: built once for the whole suite):
    enc                        a 320-token BPE trained on four short sentences, SENTENCE among them
    sample_cache               the bundled sample, prepared as train.py does with a 512-token BPE
"""
import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
torch.set_num_threads(2)

import data  # noqa: E402  (importable only after the path insert above)
import model  # noqa: E402
import tokenizer  # noqa: E402
from same_losses import CRAMMING_ADAMW  # noqa: E402, F401  (tests pin train.py's old recipe)

POSITIONS = ["learned", "sinusoidal", "rotary", "alibi", "none"]
SENTENCE = "the cat sat on the mat."


def tiny(**overrides):
    base = {"vocab_size": 100, "n_layers": 2, "d_model": 32, "n_heads": 4, "ffn_dim": 48,
            "max_seq_len": 32}
    return model.make_config("tiny", **{**base, **overrides})


def seeded_model(cfg, seed=0):
    torch.manual_seed(seed)
    return model.build_model(cfg).eval()


def save_checkpoint(net, enc, folder):
    """folder/model.pt, config.json and tokenizer.json, as train.py leaves them in out/final."""
    model.save_model(net, str(folder))
    tokenizer.save_tokenizer(enc, os.path.join(folder, "tokenizer.json"))
    return str(folder)


def random_checkpoint(folder, texts):
    """An untrained 1-layer model and a 320-token BPE trained on texts.

    Both saved as a training run would save them."""
    enc = tokenizer.train_tokenizer(texts, 320)
    cfg = model.make_config("tiny", vocab_size=enc.n_vocab, n_layers=1, d_model=32, n_heads=2,
                            ffn_dim=64)
    return save_checkpoint(model.build_model(cfg), enc, folder)


def read_log(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="session")
def enc():
    texts = [SENTENCE, "the dog ran in the park.", "a bird sang on the tree.",
             "we sat in the sun."] * 10
    return tokenizer.train_tokenizer(texts, vocab_size=320)


@pytest.fixture(scope="session")
def sample_cache(tmp_path_factory):
    """The sample corpus with a 512-token BPE, prepared once: the entry that
    `train.py --data sample --vocab-size 512` finds in this cache folder (prepare_data keys its
    cache by settings), so no run prepares it again."""
    folder = str(tmp_path_factory.mktemp("cache"))
    data.prepare_data("sample", folder, {"vocab_size": 512}, progress=False)
    return folder
