"""checkpoint.py: save a run so that it resumes bitwise where it stopped, and load it back.

    checkpoint.save(path, net, optimizer, loader, state, rank, average)  # every rank calls it
    ckpt = checkpoint.load(path)                          # always onto the CPU first
    checkpoint.load_weights(net, ckpt)                    # before wrapping: DDP broadcasts
    state = checkpoint.restore(ckpt, net, optimizer, loader, average)  # moments, data, RNG
    checkpoint.save_final(folder, net, rank, extra)       # model.py's folder, to share

A checkpoint holds everything a bitwise-exact resume needs: weights, AdamW moments, the weights'
moving average (ema.py), the loop's state, the loader's position and the RNG (the masks and the
batch order are functions of the seed and the position). Two formats, chosen by the path:
OUT/checkpoint.pt, one file written by rank 0 (one process and DDP, where every rank holds the same
weights), and OUT/checkpoint.dcp/, a folder of shards that every rank writes with PyTorch's
Distributed Checkpoint (FSDP, where each rank holds a slice), resumable on any number of ranks.
Both are written beside the old one and renamed over it, so OUT always holds one whole checkpoint.
"""
import contextlib
import errno
import functools
import json
import os
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

import ema
import files
import model
import parallel
import tokenizer

# A run's files in OUT. Never replaced silently: a new run refuses, --force removes them
KEPT_FILES = ("checkpoint.pt", "checkpoint.dcp", "log.jsonl", "summary.json", "final")
RUN_FILES = (*KEPT_FILES, "loss.png", "args.json", "checkpoint.dcp.tmp", "checkpoint.dcp.old")
# ... and in OUT/final (save_model: model.save_model's temporary file, save_model.<pid>.tmp)
FINAL_FILES = ("model.pt", "config.json", "tokenizer.json", "meta.json", "args.json",
               "save_model")


def path_in(out, shard):
    """OUT/checkpoint.pt, or the folder OUT/checkpoint.dcp/ under --shard fsdp."""
    return os.path.join(out, "checkpoint.dcp" if shard == "fsdp" else "checkpoint.pt")


def exists(path):
    """Is there a checkpoint to resume at path (a .dcp folder killed between its two renames
    counts: load reads its .old)?"""
    return os.path.isfile(path) or os.path.isdir(path) or os.path.isdir(path + ".old")


def save(path, net, optimizer, loader, state, rank, average=None):
    """Save weights, AdamW moments, the loader's position, state (a dict), the RNG and the
    weights' moving average (ema.state_dict; None: off) to path."""
    if path.endswith(".dcp"):
        save_shards(path, net, optimizer, run_state(net, loader, state), rank, average)
    elif rank == 0:  # DDP: every rank holds the same weights, one file from rank 0 is all of them
        # the plain model's state dict: no "_orig_mod." (compile) or "module." (DDP) prefixes
        ckpt = {"model": model.unwrap(net).state_dict(), "optimizer": optimizer.state_dict(),
                "average": average, **run_state(net, loader, state)}
        files.atomic_write(path, lambda f: torch.save(ckpt, f))


def run_state(net, loader, state):
    """What a checkpoint holds besides weights and moments: the config, the loader's position,
    the loop's state and rank 0's RNG (every rank restores it)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"config": model.unwrap(net).config, "loader": loader.state_dict(), "state": state,
            "rng": {"torch": torch.get_rng_state(), "cuda": cuda}}


def save_shards(folder, net, optimizer, extra, rank, average=None):
    """FSDP: every rank writes its shards of the weights, moments and weights' average (if any)
    with Distributed Checkpoint (torch.distributed.checkpoint.save, one file per rank), and rank 0
    writes run.pt (extra, and the average's decay and count) beside them. Collective: every rank
    calls it."""
    tmp, old = folder + ".tmp", folder + ".old"
    shards = sharded_state(net, optimizer, average)
    # Barriers order the steps across ranks: nobody writes into tmp before rank 0 cleared it, and
    # nobody renames before every rank's file is complete
    if rank == 0 and os.path.exists(tmp):
        shutil.rmtree(tmp)                  # a save cut short by a kill
    dist.barrier()
    try:
        dcp.save(shards, checkpoint_id=tmp)
    except dcp.api.CheckpointException as e:  # DCP hands every rank all ranks' failures
        full = [error for error, _ in e.failures.values()
                if isinstance(error, OSError) and error.errno == errno.ENOSPC]
        if not full:
            raise
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # every rank has stopped writing
        raise full[0] from None
    written = [True]
    if rank == 0:
        try:  # atomic_write's unbuffered file: a full disk is an OSError, not "unexpected pos"
            numbers = average and {"decay": average["decay"], "updates": average["updates"]}
            run = {**extra, "average": numbers}
            files.atomic_write(os.path.join(tmp, "run.pt"), lambda f: torch.save(run, f))
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            written = [False]
    dist.broadcast_object_list(written, src=0)  # after it, every rank's shards are on disk
    if not written[0]:  # all ranks raise together, so all go on training together
        raise OSError(errno.ENOSPC, "No space left on device", os.path.join(tmp, "run.pt"))
    if rank == 0:
        if os.path.exists(folder):
            os.replace(folder, old)         # a folder cannot be renamed over a full one
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()                          # no rank reads or writes checkpoints before the rename


def sharded_state(net, optimizer, average):
    """What Distributed Checkpoint saves and loads under FSDP, all DTensors (this rank's shards):
    the weights, the moments, and the weights' average by parameter name, as the weights are, so
    that it reshards like them onto any number of ranks."""
    weights, moments = get_state_dict(model.unwrap(net), optimizer)
    state = {"model": weights, "optimizer": moments}
    if average is not None:
        names = [name for name, _ in model.unwrap(net).named_parameters()]
        state["average"] = dict(zip(names, average["weights"], strict=True))
    return state


# -----------------------------------------------------------------------------
# Loading: onto the CPU, then into the model, optimizer and loader

def load(path):
    """The checkpoint at path, on the CPU. For a .dcp folder: its run.pt, and "folder", where the
    shards are (they are read straight into the sharded model by restore)."""
    if not path.endswith(".dcp"):
        return load_file(path)
    if not os.path.isdir(path) and os.path.isdir(path + ".old"):  # killed between two renames
        path += ".old"
    if not os.path.isdir(path):
        raise SystemExit(f"error: {path}: no checkpoint to resume from")
    return {**load_file(os.path.join(path, "run.pt")), "folder": path}


def load_file(path):
    # map_location="cpu": resuming never needs more GPU memory than the run had; the tensors move to
    # the device as they are copied into the model and optimizer. weights_only=False: the file holds
    # the RNG state and the loader's position too, all written by this code
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path}: no checkpoint to resume from")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or foreign file
        why = f"{type(e).__name__}: {e}"
        raise SystemExit(f"error: {path}: not a readable checkpoint ({why})") from None


def load_weights(net, ckpt):
    """The plain model's weights from a .pt checkpoint: call it before wrapping, so DDP broadcasts
    the loaded weights. A sharded checkpoint's weights come in restore(), after fully_shard."""
    if "model" in ckpt:
        net.load_state_dict(ckpt["model"])
    return net


def restore(ckpt, net, optimizer, loader, average=None):
    """Moments (and a sharded checkpoint's weights), the weights' average (ema.start's, filled in
    place), the loader's position and the RNG; returns the saved loop state (a dict)."""
    if "folder" in ckpt:
        load_shards(ckpt["folder"], net, optimizer, average)
        if average is not None:  # its weights came with the shards, its count is in run.pt
            average["updates"] = ckpt["average"]["updates"]
    else:
        optimizer.load_state_dict(ckpt["optimizer"])
        if average is not None:
            ema.load_state_dict(average, ckpt["average"])
    loader.load_state_dict(ckpt["loader"])
    # the RNG last: building the model and optimizer above must not consume it after the restore
    torch.set_rng_state(ckpt["rng"]["torch"])
    if ckpt["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
    return ckpt["state"]


def load_shards(folder, net, optimizer, average=None):
    """FSDP: weights and moments from a checkpoint folder into the sharded model and its optimizer,
    and the weights' average, if given (ema.start's), into it. Collective: every rank calls it."""
    # Distributed Checkpoint reads the part of every tensor this rank holds now, whatever the number
    # of ranks that wrote it: that is the resharding (torch.distributed.checkpoint.load)
    wanted = sharded_state(net, optimizer, average)  # the shapes and slices to fill, in place
    dcp.load(wanted, checkpoint_id=folder)
    set_state_dict(model.unwrap(net), optimizer, model_state_dict=wanted["model"],
                   optim_state_dict=wanted["optimizer"])


def restored_model(ckpt, net, optimizer):
    """The checkpoint's model as its run scored it, to be written by save_final: a fresh plain
    model, or under FSDP the sharded one with its shards loaded back and the weights' average, if
    the run kept one, copied over them (save_final gathers them)."""
    if "folder" not in ckpt:
        return scored_model(ckpt)
    saved = ckpt.get("average")  # None: the run kept no average (or was saved before it could)
    average = saved and ema.start(model.unwrap(net), saved["decay"])
    load_shards(ckpt["folder"], net, optimizer, average)
    if average:
        ema.copy_over(model.unwrap(net), average["weights"])
    return net


def scored_model(ckpt):
    """A .pt checkpoint's plain model as its run scored it and saves it in final/: the trained
    weights, with the moving average (ema.py) copied over them where the run kept one."""
    net = load_weights(model.build_model(ckpt["config"]), ckpt)
    if ckpt.get("average"):
        ema.copy_over(net, ckpt["average"]["weights"])
    return net


# -----------------------------------------------------------------------------
# Starting a new run from old weights (--init-from): continued pretraining, a longer budget

def load_init(path):
    """{"config", "weights", "tokenizer"} of the weights at path, on the CPU: a run's final/ folder
    (model.py's config.json and model.pt), a resumable checkpoint.pt, or a folder export.py wrote
    (config.json and model.safetensors). "tokenizer" is the growcram tokenizer.json the weights
    were trained with, or None when it is not beside them."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    if os.path.isfile(path):  # a resumable checkpoint: its final/ folder, if any, has the tokenizer
        ckpt = load_file(path)
        if "model" not in ckpt:
            raise SystemExit(f"error: --init-from {path}: not a checkpoint.pt with weights")
        weights, config = scored_model(ckpt).state_dict(), ckpt["config"]
        folder = os.path.join(folder, "final")
    else:
        weight_files = ("model.pt", "model.safetensors")
        if not any(os.path.isfile(os.path.join(path, name)) for name in weight_files):
            raise SystemExit(f"error: --init-from {path}: no model.pt, model.safetensors or "
                             "checkpoint.pt there (a Distributed Checkpoint folder: use a finished "
                             "run's final/)")
        try:
            net = load_folder(path)
        except ValueError as e:
            raise SystemExit(f"error: --init-from {e}") from None
        weights, config = net.state_dict(), net.config
    if config["num_labels"]:  # a fine-tuned classifier: continued pretraining leaves its head out
        weights = {k: t for k, t in weights.items() if not k.startswith(("pooler.", "classifier."))}
        config = {**config, "num_labels": 0}
    # export.py writes a Hugging Face tokenizer.json and keeps ours as growcram_tokenizer.json;
    # a folder transformers saved after fine-tuning has the Hugging Face one only, which reads back
    found = [os.path.join(folder, name) for name in ("growcram_tokenizer.json", "tokenizer.json")]
    ours = next((f for f in found if os.path.isfile(f) and is_our_tokenizer(f)), None)
    return {"config": config, "weights": weights, "tokenizer": ours}


def load_folder(path):
    """The plain model, on the CPU, in model.py's folder (model.pt) or in one that export.py or
    transformers' save_pretrained wrote (model.safetensors); a one-line ValueError naming the file
    otherwise (load_init, evaluate_glue.py --checkpoint)."""
    exported = os.path.isfile(os.path.join(path, "model.safetensors"))
    if exported and not os.path.isfile(os.path.join(path, "model.pt")):
        import export  # only here: export.py needs safetensors, which training does not
        return export.load_exported(path)
    return model.load_model(path)


def is_our_tokenizer(path):
    """A growcram tokenizer.json, or the Hugging Face one export.py wrote from it: a file that
    tokenizer.load_tokenizer reads (another model's Hugging Face tokenizer is not)."""
    try:
        tokenizer.load_tokenizer(path)
        return True
    except ValueError:
        return False


@functools.lru_cache(maxsize=4)
def init_config(path):
    """The model config of the weights at path (load_init's "config"), read once per path."""
    config_json = os.path.join(path, "config.json")
    if os.path.isfile(config_json):  # model.py's folder, or export.py's with ours under "growcram"
        with open(config_json) as f:
            found = json.load(f)
        if os.path.isfile(os.path.join(path, "model.pt")) or "growcram" in found:
            # as load_init: continued pretraining leaves a classifier's head out
            return model.validate_config({**found.get("growcram", found), "num_labels": 0})
    return load_init(path)["config"]  # a checkpoint.pt, or a stock GPT-2 export: read the weights


# -----------------------------------------------------------------------------
# The final model, and the run folder's rules

def save_final(folder, net, rank, extra=None):
    """folder: model.py's checkpoint folder (config.json, model.pt) plus extra files ({name: source
    path}: the tokenizer, the data's meta.json), written by rank 0. Under FSDP every rank calls
    it (the gather)."""
    # FSDP: the full weights are all-gathered into a plain model on rank 0's CPU
    if parallel.is_sharded(net):
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(model.unwrap(net), options=options)
        if rank == 0:
            net = model.build_model(model.unwrap(net).config)
            net.load_state_dict(full)
    if rank != 0:
        return folder
    model.save_model(net, folder)
    for name, src in (extra or {}).items():
        with open(src, "rb") as f:
            blob = f.read()
        files.atomic_write(os.path.join(folder, name), lambda f: f.write(blob))
    return folder


def remove_stale_temporaries(out):
    """Delete the temporary files a killed run left in out and out/final (files.atomic_write's
    NAME.*.tmp, model.save_model's save_model.<pid>.tmp): one run writes a folder at a time, so
    none of them is still being written."""
    for folder in (out, os.path.join(out, "final")):
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            path = os.path.join(folder, name)
            ours = name.startswith(tuple(f"{kept}." for kept in (*RUN_FILES, *FINAL_FILES)))
            if ours and name.endswith(".tmp") and os.path.isfile(path):
                os.remove(path)


def check_out_is_free(out, force, remove=True):
    """A finished or interrupted run in out is never replaced silently: refuse, or with --force
    remove it (remove=False: only check; every rank checks, rank 0 removes)."""
    found = [name for name in KEPT_FILES if os.path.exists(os.path.join(out, name))]
    if found and not force:
        what = "pass --resume to continue it" if found[0].startswith("checkpoint") else \
            "it is from an earlier run"
        raise SystemExit(f"error: {os.path.join(out, found[0])} exists: {what}, --force to replace "
                         "it, or choose another --out")
    # --force removes exactly the files a run writes, nothing else the user keeps in the folder
    for name in RUN_FILES if force and remove else ():
        path = os.path.join(out, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)


def truncate_log(path, log_bytes):
    """Resume appends to log.jsonl from the checkpoint on: cut what was logged after it
    was saved (steps that will run again, at log_bytes, the log's size then), so that no
    step appears twice."""
    if os.path.exists(path) and log_bytes is not None:
        with open(path, "r+b") as f:
            f.truncate(min(log_bytes, os.path.getsize(path)))


def append_log(path, record):
    """One JSON line: log.jsonl grows by whole records, and truncate_log can cut it at
    a record's end. A write that fails (a full disk) is cut off again, so no half line stays."""
    line = memoryview((json.dumps(record) + "\n").encode())
    with open(path, "ab", buffering=0) as f:
        end = f.tell()  # opened to append: the file's size
        try:
            while line:  # an unbuffered write may take only part of it
                line = line[f.write(line):]
        except OSError:
            with contextlib.suppress(OSError):  # a device such as /dev/full has no size to cut
                f.truncate(end)
            raise
