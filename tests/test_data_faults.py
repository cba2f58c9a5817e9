"""Spec for data.py's cache under real faults: two processes preparing one entry at once, a failed
preparation beside another's finished entry, SIGKILL in the middle, and a really full disk. Real
processes, real signals and the operating system's own ENOSPC (/dev/full); hermetic (tmp_path).

    python -m pytest -q tests/test_data_faults.py
"""
import errno
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import data
from conftest import ROOT
from loader import read_shard

# The bundled sample with small settings, so a preparation takes seconds: a short tokenizer sample
# keeps the BPE training quick, and small shards make five train shards.
SAMPLE = {"vocab_size": 512, "tokenizer_chars": 200_000, "shard_tokens": 1 << 19, "workers": 1}
# A tiny corpus (small_corpus) for the faults that need no real process
SMALL = {"vocab_size": 320, "workers": 1}

# prepare_data in a child process, printing the returned dict as JSON. argv: the cache folder, the
# settings and, optionally, a gate: then the child says GATE.<pid>.ready once its imports are done
# (torch's take a second or two) and starts when the file GATE appears.
PREPARE = """
import json, os, sys, time
import data, loader
cache, settings, gate = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
if gate:
    open(f"{gate[0]}.{os.getpid()}.ready", "w").close()
    while not os.path.exists(gate[0]):
        time.sleep(0.005)
print(json.dumps(data.prepare_data("sample", cache, settings, progress=False)))
"""


def start_preparing(cache, gate=None):
    """A real preparation of the sample in a child process (workers 1: no pool to orphan)."""
    argv = [sys.executable, "-c", PREPARE, str(cache), json.dumps(SAMPLE)]
    return subprocess.Popen(argv + ([str(gate)] if gate else []), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path, run, timeout_s=60):
    """Poll every 10 ms until path exists, while run is still running."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert run.poll() is None, f"the child ended before {path} appeared: {run.stderr.read()}"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.01)


def folder_bytes(folder):
    """{file name: its bytes} of a folder: two entries are the same only if every file is."""
    return {path.name: path.read_bytes() for path in sorted(pathlib.Path(folder).iterdir())}


def assert_a_correct_entry(meta, reference):
    """meta's folder holds exactly the reference's files (meta.json, tokenizer.json, every shard,
    byte for byte), and every shard reads back with its header checked."""
    assert folder_bytes(meta["dir"]) == folder_bytes(reference["dir"])
    for shard in meta["train"] + meta["val"]:
        assert len(read_shard(shard)) > 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The sample prepared once, undisturbed, in this process: what every fault must still give."""
    cache = tmp_path_factory.mktemp("reference")
    return data.prepare_data("sample", str(cache), SAMPLE, progress=False)


def small_corpus(folder):
    """40 short JSONL documents: preparing them with a 320-token BPE takes well under a second."""
    path = folder / "small.jsonl"
    lines = (json.dumps({"text": f"document {i} tells of item {i % 7} and of item {i % 5}."})
             for i in range(40))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# --- two runs, one cache ---------------------------------------------------------------------

def test_two_processes_preparing_the_same_entry_at_once_both_end_with_the_correct_entry(
        reference, tmp_path):
    """Released together by a file once both have imported, both build the entry (neither finds
    it finished: "reused" is False for both, so they really overlapped). One publishes it by
    rename; the other finds the finished entry in its place, uses it and removes its own temporary
    folder."""
    cache, gate = tmp_path / "cache", tmp_path / "go"
    runs = [start_preparing(cache, gate) for _ in range(2)]
    for run in runs:
        wait_for(f"{gate}.{run.pid}.ready", run)
    gate.touch()
    outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outputs]
    metas = [json.loads(out) for out, _ in outputs]
    assert [meta["reused"] for meta in metas] == [False, False]
    assert metas[0] == metas[1]
    assert_a_correct_entry(metas[0], reference)
    assert os.listdir(cache) == [os.path.basename(metas[0]["dir"])]  # no .tmp folder left


# --- a failed preparation removes only what it created ---------------------------------------

def test_a_failed_preparation_keeps_the_entry_another_run_finished_in_the_folder_it_created(
        tmp_path, monkeypatch):
    """This run creates the cache folder and trains its tokenizer; meanwhile another run finishes
    its own entry there (called from inside save_tokenizer, so the moment is exact); then this run
    fails. Its temporary folder goes, the cache folder and the finished entry stay, and the finished
    entry is reused."""
    corpus, cache = small_corpus(tmp_path), tmp_path / "cache"
    finished = []

    def another_run_finishes_then_this_one_fails(enc, path):
        monkeypatch.undo()  # the other run saves its own tokenizer for real
        finished.append(data.prepare_data(corpus, str(cache), SMALL, progress=False))
        raise ValueError("this run failed after the other one finished")
    monkeypatch.setattr(data, "save_tokenizer", another_run_finishes_then_this_one_fails)
    with pytest.raises(ValueError, match="this run failed"):
        data.prepare_data(corpus, str(cache), {**SMALL, "val_fraction": 0.2}, progress=False)
    assert os.listdir(cache) == [os.path.basename(finished[0]["dir"])]  # no .tmp folder
    again = data.prepare_data(corpus, str(cache), SMALL, progress=False)
    assert again["reused"] and again["dir"] == finished[0]["dir"]


def test_a_failed_preparation_alone_in_a_fresh_folder_leaves_nothing(tmp_path, monkeypatch):
    """The same failure with no other run: the cache folder this call created goes too (it is
    empty once the temporary folder is gone)."""
    def fails(enc, path):
        raise ValueError("this run failed")
    monkeypatch.setattr(data, "save_tokenizer", fails)
    with pytest.raises(ValueError, match="this run failed"):
        data.prepare_data(small_corpus(tmp_path), str(tmp_path / "cache"), SMALL, progress=False)
    assert not (tmp_path / "cache").exists()


# --- kill -9 during data preparation ---------------------------------------------------------

def kill_when(path, run):
    """SIGKILL run as soon as path exists: a crash at that moment. The child is reaped: a zombie
    would still count as a live process holding its temporary folder."""
    wait_for(path, run)
    run.send_signal(signal.SIGKILL)
    run.communicate()


@pytest.mark.parametrize("moment", ["", "tokenizer.json", "train_00001.bin"],
                         ids=["temporary folder made", "tokenizer saved", "first shard done"])
def test_a_preparation_killed_at_any_moment_is_prepared_again_whole_by_a_plain_rerun(
        reference, tmp_path, moment):
    """SIGKILL leaves the dead process's OUT.<pid>.tmp behind (nothing can clean up after it); a
    plain re-run removes it (the process is gone), prepares the entry afresh and gets the
    undisturbed run's files byte for byte."""
    entry = tmp_path / os.path.basename(reference["dir"])
    run = start_preparing(tmp_path)
    temporary = f"{entry}.{run.pid}.tmp"
    kill_when(os.path.join(temporary, moment), run)
    assert run.returncode == -signal.SIGKILL and os.path.isdir(temporary)
    assert not entry.exists()  # killed before it could publish anything
    meta = data.prepare_data("sample", str(tmp_path), SAMPLE, progress=False)
    assert not meta["reused"] and meta["dir"] == str(entry)
    assert_a_correct_entry(meta, reference)
    assert os.listdir(tmp_path) == [entry.name]  # the dead process's .tmp folder is gone


# --- a really full disk ----------------------------------------------------------------------

def make_the_disk_full_for(name, monkeypatch):
    """The preparation's write of name goes to /dev/full, where every write fails with the
    operating system's own ENOSPC: a symbolic link to it, planted in the temporary folder as the
    tokenizer is saved. meta.json's temporary file has a name from mkstemp that cannot be planted
    in advance, so there atomic_write itself writes to /dev/full."""
    if name == "meta.json":
        def write_to_dev_full(path, write):
            with open("/dev/full", "wb") as f:
                write(f)
        monkeypatch.setattr(data, "atomic_write", write_to_dev_full)
        return
    save = data.save_tokenizer

    def save_with_a_full_disk(enc, path):
        if name == "tokenizer.json":  # tokenizer.py writes tokenizer.json.<pid>.tmp, then renames
            os.symlink("/dev/full", f"{path}.{os.getpid()}.tmp")
            return save(enc, path)
        save(enc, path)
        os.symlink("/dev/full", os.path.join(os.path.dirname(path), name))  # a shard, opened next
    monkeypatch.setattr(data, "save_tokenizer", save_with_a_full_disk)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("name", ["tokenizer.json", "val_00000.bin", "train_00000.bin",
                                  "meta.json"])
def test_a_full_disk_is_one_line_naming_the_file_and_leaves_no_partial_entry(name, tmp_path,
                                                                              monkeypatch):
    cache = tmp_path / "cache"
    make_the_disk_full_for(name, monkeypatch)
    with pytest.raises(OSError) as e:
        data.prepare_data(small_corpus(tmp_path), str(cache), SMALL, progress=False)
    message = str(e.value)
    assert e.value.errno == errno.ENOSPC and "\n" not in message
    assert "No space left on device writing " in message
    assert f".{os.getpid()}.tmp{os.sep}{name}" in message  # the file, in the entry being built
    assert "the cache keeps only finished entries, so nothing of this one was kept" in message
    assert not cache.exists()  # no entry, no temporary folder, not even the empty cache folder


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_full_disk_ends_data_py_with_one_error_line(tmp_path, monkeypatch):
    """The command line (train.py's prepare does the same) prints `error: ` and that line."""
    make_the_disk_full_for("train_00000.bin", monkeypatch)
    argv = ["--data", small_corpus(tmp_path), "--out", str(tmp_path / "cache"),
            "--vocab-size", "320", "--workers", "1"]
    with pytest.raises(SystemExit) as stop:
        data.main(argv)
    line = str(stop.value.code)
    assert line.startswith("error: [Errno 28] No space left on device writing ")
    assert "train_00000.bin" in line and "\n" not in line
