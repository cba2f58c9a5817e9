"""ema.py: an exponential moving average of the weights, the model a run evaluates and saves.

    average = ema.start(net, decay)           # None when decay is 0: no averaging
    ema.update(average, net, rate)            # after every optimizer step; rate = lr / peak lr
    with ema.swapped_in(net, average):        # evaluate or save the averaged weights, then the
        ...                                   # trained ones are back for the next step
    ema.state_dict(average), ema.load_state_dict(average, saved)     # checkpoints
    ema.copy_over(net, saved["weights"])      # for good: a saved run's model as it scored

Training goes on with the optimizer's weights; every held-out loss, final/ and the export are the
average's. While the learning rate is high the weights jump around the valley's floor from step to
step, and their average sits closer to it: averaging recent checkpoints gives most of what decaying
the rate would, without stopping (Polyak & Juditsky 1992; Kaddour 2022, "Stop Wasting My Time!",
RoBERTa on WikiText-103; Sanyal et al. 2023, arXiv 2306.03241, LLMs at high learning rates), and
it adds to a decay rather than replacing it (Ajroldi, Orvieto & Geiping 2025, arXiv 2502.06761).
Measured in this project's speedrun (docs/records.md, record 10).

How far back it reaches follows the learning rate. At the peak rate the average spans about
1 / (1 - decay) steps (0.99: the last 100); at a fraction `rate` of the peak it spans that many
times `rate` (the noise it removes shrinks with the step), so as a schedule anneals to zero the
average closes in on the trained weights and, once it spans a step or less, is them: at the end of
a run that decays to zero the average neither helps nor costs. A fresh average also warms up, as
TensorFlow's ExponentialMovingAverage does with num_updates (after n updates the decay is at most
(1 + n) / (10 + n)), so that it follows the weights closely while they change fastest. Growth
(grow.py) changes the shapes: train.py starts a new average from the grown weights. Under FSDP each
rank averages its own shard of every weight, and the average is saved in the sharded checkpoint
beside the weights (checkpoint.save_shards).
"""
import contextlib

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

RECIPE_DECAY = 0.99  # train.py's default (--ema), the speedrun's record 10


def start(net, decay):
    """A new average of net's parameters, equal to them; None when decay is 0 (off)."""
    if not decay:
        return None
    with torch.no_grad():
        weights = [p.clone() for p in parameters(net)]
    return {"decay": decay, "updates": 0, "weights": weights}


def current_decay(average, rate=1.0):
    """The decay of the next update at `rate` times the peak learning rate: a span of
    rate / (1 - decay) steps, none below one step, warmed up over the first updates."""
    span = rate / (1.0 - average["decay"])            # steps the average reaches back
    n = average["updates"]
    return min(max(0.0, 1.0 - 1.0 / span) if span > 0 else 0.0, (1 + n) / (10 + n))


@torch.no_grad()
def update(average, net, rate=1.0):
    """average <- d * average + (1 - d) * weights, one fused call over every tensor, with d the
    current decay at `rate` (the learning rate as a fraction of its peak)."""
    if average is None:
        return
    # after the step's backward FSDP holds only the shards: no reshard (parameters()) needed here,
    # which saves a walk over every module on every step
    weights = own_shards(p.detach() for p in net.parameters())
    torch._foreach_lerp_(own_shards(average["weights"]), weights,
                         1.0 - current_decay(average, rate))
    average["updates"] += 1


@contextlib.contextmanager
def swapped_in(net, average):
    """Inside, net holds the averaged weights; after, its own again, bit for bit. In place, so a
    compiled or DDP-wrapped net sees the same tensors (nothing recompiles). A None average: net as
    it is."""
    if average is None:
        yield net
        return
    params = own_shards(parameters(net))
    with torch.no_grad():
        trained = [p.clone() for p in params]
        torch._foreach_copy_(params, own_shards(average["weights"]))
    try:
        yield net
    finally:
        reshard(net)  # under FSDP: the next forward gathers the trained weights, not these
        with torch.no_grad():
            torch._foreach_copy_(params, trained)


def state_dict(average):
    """What a checkpoint keeps of the average (None when off)."""
    if average is None:
        return None
    return {"decay": average["decay"], "updates": average["updates"],
            "weights": average["weights"]}


def load_state_dict(average, saved):
    """A checkpoint's average into `average` (made by start() for the same model), in place."""
    with torch.no_grad():
        torch._foreach_copy_(average["weights"], [w.to(average["weights"][0].device)
                                                 for w in saved["weights"]])
    average["updates"] = saved["updates"]


def copy_over(net, weights):
    """Copy weights (one tensor per parameter, in net.parameters() order: an average's) over net's
    own, for good: a saved run's model as the run scored it."""
    with torch.no_grad():
        torch._foreach_copy_(own_shards(parameters(net)), own_shards(weights))


def parameters(net):
    """net's parameters, detached, as its optimizer holds them: under FSDP, this rank's shards."""
    reshard(net)
    return [p.detach() for p in net.parameters()]


def reshard(net):
    """Under FSDP: let go of the weights FSDP keeps gathered after a forward with no backward (an
    evaluation gathers the root module's and keeps them), so that the next forward gathers the
    shards as they are then. Nothing to do for an unsharded net."""
    for module in net.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def own_shards(tensors):
    """The tensors, each as the data this rank holds: under FSDP a parameter is a DTensor, and
    every rank updates its own shard of it (DTensor has no rule for _foreach_copy_)."""
    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
