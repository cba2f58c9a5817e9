"""python tests/kill_at.py MOMENT N TRAIN_FLAGS...: train.py, killed with SIGKILL by itself the
N-th time MOMENT comes in this process (tests/test_faults.py's kill -9 test).

Nothing runs after a SIGKILL: no finally, no atexit handler, no flush. What is on disk is what a
power cut, the kernel's out-of-memory killer or a scheduler's kill -9 would leave. The moments:
  step        a training forward pass (with accumulation: in the middle of an optimizer step)
  eval        a held-out forward pass (the step-0 evaluation, one in the loop, the final one)
  log         just after a record is appended to log.jsonl
  grow        a growth event, as the grown model is made
  checkpoint  halfway through writing checkpoint.pt's temporary file
  final       halfway through writing final/model.pt's temporary file
  summary     halfway through writing summary.json's temporary file
"""
import io
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import checkpoint  # noqa: E402  (after the path: the project's modules)
import files  # noqa: E402
import grow  # noqa: E402
import model  # noqa: E402
import train  # noqa: E402

MOMENT, N = sys.argv[1], int(sys.argv[2])
seen = 0


def at(moment):
    """This moment came: the N-th time MOMENT does, the process dies here."""
    global seen
    if moment == MOMENT:
        seen += 1
        if seen == N:
            os.kill(os.getpid(), signal.SIGKILL)


def forward(self, *args, real=model.Transformer.forward, **kwargs):
    at("step" if self.training else "eval")
    return real(self, *args, **kwargs)


def append_log(path, record, real=checkpoint.append_log):
    real(path, record)
    at("log")


def grow_model(*args, real=grow.grow_model, **kwargs):
    at("grow")
    return real(*args, **kwargs)


def halfway(moment, write_whole, f):
    """Write the first half of what write_whole would write to f, die there if it is the moment,
    else write the rest."""
    whole = io.BytesIO()
    write_whole(whole)
    data = whole.getvalue()
    f.write(data[:len(data) // 2])
    f.flush()
    at(moment)
    f.write(data[len(data) // 2:])


def save(obj, f, *args, real=torch.save, **kwargs):
    """torch.save; into final/'s temporary file (model.save_model's), halfway and die."""
    if not os.path.basename(str(getattr(f, "name", ""))).startswith("save_model."):
        return real(obj, f, *args, **kwargs)
    halfway("final", lambda whole: real(obj, whole, *args, **kwargs), f)


def atomic_write(path, write, real=files.atomic_write):
    """files.atomic_write; of checkpoint.pt or summary.json, halfway and die."""
    moment = {"checkpoint.pt": "checkpoint", "summary.json": "summary"}.get(
        os.path.basename(path))
    if moment is None:
        return real(path, write)
    return real(path, lambda f: halfway(moment, write, f))


model.Transformer.forward = forward
checkpoint.append_log = append_log
grow.grow_model = grow_model
torch.save = save
files.atomic_write = atomic_write
train.main(sys.argv[3:])
