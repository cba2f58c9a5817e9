"""train_step stands alone: python -m pytest -q tests/test_step.py

The step a reader lifts into their own project is train.train_step's text and nothing else. The
test does what such a reader does: it copies train_step's source, model.py and loader.py into an
empty folder, writes a dozen lines that build a tiny masked LM and batches with loader.mask_mlm
(bytes of the bundled Shakespeare as tokens), and trains it there in a fresh Python process,
where no other file of this project can be imported.
"""
import builtins
import dis
import gzip
import inspect
import json
import math
import os
import shutil
import subprocess
import sys

import torch

import model
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The reader's script, run in the empty folder. Tokens are bytes (0-255) and four specials; one
# long stream of Shakespeare, cut into windows; the last 10% is held out.
SCRIPT = '''
import json, math, sys
import numpy as np
import torch
import loader, model
from step import train_step

text = open("text.txt", "rb").read()
stream = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
special = {"pad": 256, "cls": 257, "sep": 258, "mask": 259}
T, B = 64, 16

def batch(at, start):
    """B windows of T - 2 bytes from stream position start + at, masked as BERT does."""
    positions = start + at + np.arange(B)[:, None] * (T - 2) + np.arange(T - 2)
    ids = loader.mask_mlm(stream[positions], positions, 0.25, 0, special, 256)
    return {k: torch.from_numpy(v) for k, v in ids.items()}

split = int(len(stream) * 0.9)
held_out = [batch(j * B * (T - 2), split) for j in range(4)]
torch.manual_seed(0)
cfg = model.make_config("tiny", vocab_size=260, max_seq_len=T)
net = model.build_model(cfg)
optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)

def held_out_loss():
    net.eval()
    with torch.no_grad():
        loss = sum(net(**b)["loss"].item() for b in held_out) / len(held_out)
    net.train()
    return loss

before, losses = held_out_loss(), []
for step in range(80):
    micro_batches = [batch((2 * step + i) * B * (T - 2), 0) for i in range(2)]
    result = train_step(net, optimizer, micro_batches, clip=0.5)
    losses.append(result["loss"])
print(json.dumps({"before": before, "after": held_out_loss(), "train": losses}))
'''


def copy_into(folder):
    """The reader's folder: train_step's source (below imports of the modules its body may use),
    model.py, loader.py and some text."""
    source = inspect.getsource(train.train_step)
    with open(os.path.join(folder, "step.py"), "w") as f:
        f.write("import contextlib\nimport functools\nimport math\nimport time\n\n")
        f.write("import torch\n\n\n")
        f.write(source)
    for name in ("model.py", "loader.py"):
        shutil.copy(os.path.join(ROOT, name), folder)
    with gzip.open(os.path.join(ROOT, "corpora", "shakespeare.jsonl.gz"), "rt") as f:
        works = [json.loads(line)["text"] for line in f]
    with open(os.path.join(folder, "text.txt"), "w") as f:
        f.write("\n".join(works[:3]))
    with open(os.path.join(folder, "reader.py"), "w") as f:
        f.write(SCRIPT)


def test_train_step_copied_beside_model_and_loader_trains_a_masked_lm(tmp_path):
    copy_into(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["loader.py", "model.py", "reader.py", "step.py",
                                            "text.txt"]
    # One thread: a tiny model is fastest on one, and a second process beside the suite's own
    # threads would slow both by far more than 2x.
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "reader.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert abs(result["before"] - torch.log(torch.tensor(260.0)).item()) < 1.0  # about ln V
    assert result["after"] < result["before"] - 1.0  # more than 1 nat in 80 steps
    assert result["train"][-1] < result["train"][0] - 1.0


def test_the_copied_folder_cannot_import_the_rest_of_the_project(tmp_path):
    """The first test proves something only if the folder really is alone."""
    copy_into(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", "import train"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode != 0 and "No module named 'train'" in done.stderr


def test_train_step_uses_only_its_arguments_builtins_and_torch_math_time_contextlib_functools():
    """Checked on the bytecode too, so a branch the copy above never runs (DDP's gradient_sync,
    FSDP's norm) cannot use a name from train.py either."""
    used = {i.argval for i in dis.get_instructions(train.train_step) if i.opname == "LOAD_GLOBAL"}
    assert used <= set(dir(builtins)) | {"torch", "math", "time", "contextlib", "functools"}
    assert "torch" in used and "math" in used


def test_train_step_defaults_do_nothing_extra_and_equal_a_plain_step():
    """One process, no clipping, no deadline: the same update as forward, backward, AdamW."""
    (a, opt_a), (b, opt_b) = tiny_net(), tiny_net()
    ids = torch.randint(0, 60, (4, 16))
    batches = [{"input_ids": ids, "labels": ids}, {"input_ids": ids.flip(0), "labels": ids}]
    result = train.train_step(a, opt_a, batches)
    losses = []
    for batch in batches:
        loss = b(**batch)["loss"]
        (loss / 2).backward()
        losses.append(loss.item())
    opt_b.step()
    assert result["micro_batches"] == 2 and result["grad_norm"] is None and not result["skipped"]
    assert abs(result["loss"] - sum(losses) / 2) < 1e-6
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert all(p.grad is None for p in a.parameters())  # zeroed for the next step


def tiny_net(seed=0):
    torch.manual_seed(seed)
    net = model.build_model(model.make_config("tiny", vocab_size=64, max_seq_len=16))
    return net, torch.optim.AdamW(net.parameters(), lr=1e-3)


def test_a_non_finite_loss_makes_no_update():
    net, optimizer = tiny_net()
    with torch.no_grad():
        next(net.parameters()).fill_(float("nan"))
    before = [p.detach().clone() for p in net.parameters()]
    ids = torch.randint(0, 60, (4, 16))
    result = train.train_step(net, optimizer, [{"input_ids": ids, "labels": ids}], clip=1.0)
    assert result["skipped"] and not math.isfinite(result["loss"])
    assert not optimizer.state  # AdamW never stepped: no NaN in its moments
    assert all(p.grad is None for p in net.parameters())
    after = net.parameters()
    assert all(torch.equal(p.nan_to_num(), q.nan_to_num()) for p, q in zip(after, before))


def test_a_step_cut_at_the_deadline_is_the_mean_over_the_micro_batches_it_ran():
    """stop_early says yes before the second of four micro-batches: the step ends after two, with
    the same update as a step of those two."""
    ids = torch.randint(0, 60, (4, 16))
    batches = [{"input_ids": ids, "labels": ids}, {"input_ids": ids.flip(0), "labels": ids}]
    cut, cut_optimizer = tiny_net()
    asked = []

    def stop_early(seconds):
        asked.append(seconds)
        return True
    result = train.train_step(cut, cut_optimizer, iter(batches + batches), accumulation=4,
                              stop_early=stop_early)
    two, two_optimizer = tiny_net()
    train.train_step(two, two_optimizer, batches)
    assert result["micro_batches"] == 2 and len(asked) == 1 and asked[0] > 0
    assert all(torch.equal(p, q) for p, q in zip(cut.parameters(), two.parameters()))
