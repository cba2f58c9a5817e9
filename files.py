"""files.py: writing a file whole: a temporary file beside it, then a rename.

    atomic_write("out/summary.json", lambda f: f.write(json.dumps(summary).encode()))
    atomic_write("out/ckpt.pt", lambda f: torch.save(state, f))

A rename within one folder is atomic, so a crash never leaves half a file, and a reader sees the
old file or the new one. The project writes its files through atomic_write: data.py, download.py,
checkpoint.py, train.py, the evaluation scripts, scaling.py and the benches. model.py, loader.py
and tokenizer.py do the same in a few lines of their own, because each imports nothing of the
project and can be copied out alone. Standard library only: data preparation imports this file
without torch.
"""
import os
import tempfile


def atomic_write(path, write):
    """Call write(f) on a binary file beside path, then rename it into place: a crash never leaves
    half a file, and a reader sees the old file or the new one, never a mix."""
    # Same folder, so os.replace is a rename within one file system, which is atomic.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".",
                               prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        # Unbuffered: torch.save reports a write that fails (a full disk) as the OSError it is only
        # when the file hands the error straight back; through a buffer it says "unexpected pos".
        with os.fdopen(fd, "wb", buffering=0) as f:
            write(f)
        os.replace(tmp, path)
    finally:
        # write raised (a full disk, an interrupt): the half-written temporary file goes too
        if os.path.exists(tmp):
            os.remove(tmp)
