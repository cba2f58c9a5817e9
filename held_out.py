"""held_out.py: the held-out loss train.py reports, and a sample of what the model predicts.

    held_out = HeldOut(args, hw, meta, clock, out)   # train.py's flags, hardware, corpus, clock
    losses = held_out.evaluate(net)                  # {"val_loss": 3.41}
    out.say(f"held-out loss {val_text(losses)}; {samples(net, enc, args, rank)}")

HeldOut's docstring says which batches it reads and what it does on out of memory; val_text,
log_eval and samples are the printed line, the log record and the sample that go with it.
"""
import time

import torch

import model
import parallel
from loader import make_loader


class HeldOut:
    """The held-out loss, on the same --eval-batches batches every time (read in order with a
    fixed seed: the same masks in every run, so curves compare), at the model's sequence length,
    averaged over ranks. A corpus mixture evaluates each source's own val split. Out of memory in
    an evaluation halves its own micro-batch: the same sequences, in more forward passes."""

    def __init__(self, args, hw, meta, clock, out):
        self.args, self.hw, self.meta, self.clock, self.out = args, hw, meta, clock, out
        self.batches = {}     # {sequence length: {source: [batch]}}, read on first use
        self.seconds = None   # seconds per held-out batch, the last measured
        self.micro_batch = args.micro_batch  # sequences per forward pass, halved on out of memory

    def read(self, source, T):
        """--eval-batches batches of source's val split (source None: the one corpus)."""
        args, hw = self.args, self.hw
        settings = {"objective": args.objective, "seed": 1234, "rank": hw.rank,
                    "world_size": hw.world, "mask_rate": eval_mask_rate(args)}
        loader = make_loader(self.meta, "val", settings, device=hw.device, prefetch=False,
                             source=source)
        return [loader.next_batch(args.micro_batch, T) for _ in range(args.eval_batches)]

    def evaluate(self, net, within_budget=False):
        """{"val_loss": the mean held-out loss}; for a mixture, val_loss is the mean weighted by
        the mixture and "val_loss_by_source" has each. within_budget: stop before a batch that
        would end past the wall-clock deadline ("eval_batches" then says how many ran; None if
        not one fits)."""
        while True:
            try:
                return self.evaluate_once(net, within_budget)
            except RuntimeError as error:  # out of memory: halve the micro-batch, start again
                self.back_off(error, model.unwrap(net).config)

    @torch.no_grad()
    def evaluate_once(self, net, within_budget):
        plain, args, hw = model.unwrap(net), self.args, self.hw
        T = plain.config["max_seq_len"]
        names = [s["name"] for s in self.meta.get("sources", [])] or [None]  # None: one corpus
        if T not in self.batches:
            self.batches[T] = {name: self.read(name, T) for name in names}
        was_training = plain.training
        plain.eval()  # no dropout; eager and outside DDP (under FSDP: the sharded module itself)
        total = torch.zeros(len(names), device=hw.device)
        amp, started, n = parallel.autocast(hw.device, hw.dtype), time.time(), args.eval_batches
        try:
            for j in range(args.eval_batches):  # batch j of every source: a cut keeps them even
                if within_budget and not self.batch_fits((time.time() - started) / max(j, 1)):
                    n = j
                    break
                for i, name in enumerate(names):
                    with amp():
                        total[i] += self.batch_loss(plain, self.batches[T][name][j])
        finally:
            plain.train(was_training)
        self.seconds = (time.time() - started) / max(n, 1)  # per batch: the next cut's estimate
        if n == 0:
            return None
        # each rank evaluated its own slice of the held-out batches: the mean over all of them
        total = parallel.sum_over_ranks(total, hw.world)
        losses = [t / (n * hw.world) for t in total.tolist()]
        cut = {"eval_batches": n} if n < args.eval_batches else {}
        if names == [None]:
            return {"val_loss": losses[0], **cut}
        weighted = sum(s["weight"] * loss for s, loss in zip(self.meta["sources"], losses))
        return {"val_loss": weighted, "val_loss_by_source": dict(zip(names, losses)), **cut}

    def batch_loss(self, plain, batch):
        """The mean loss over one held-out batch's predicted tokens, in forward passes of
        self.micro_batch sequences: each piece's mean weighted by its share of the predicted
        tokens, so the result is the whole batch's mean however it is cut."""
        B = batch["input_ids"].shape[0]
        if self.micro_batch >= B:
            return plain(**batch)["loss"].float()
        counted = (batch["labels"] != -100).sum()  # labels (B, T) or MLM's (B, k); -100: none
        loss = 0.0
        for start in range(0, B, self.micro_batch):
            piece = {k: v[start:start + self.micro_batch] for k, v in batch.items()}
            share = (piece["labels"] != -100).sum() / counted
            loss = loss + plain(**piece)["loss"].float() * share
        return loss

    def back_off(self, error, cfg):
        """Out of memory in an evaluation: free what it held and halve its micro-batch (the
        training step's is not touched: a step that fits keeps its size). Any other error is
        raised again; one sequence that does not fit, or several ranks (their collectives would
        have to agree on the retry), end the run with one line."""
        if not parallel.is_out_of_memory(error):
            raise error
        if self.micro_batch == 1 or self.hw.world > 1:
            raise parallel.out_of_memory_exit(f"evaluating at micro-batch {self.micro_batch}",
                                              cfg, device=self.hw.device, world=self.hw.world,
                                              args=self.args) from None
        parallel.free_memory(self.hw.device)
        before, self.micro_batch = self.micro_batch, self.micro_batch // 2
        self.out.log({"kind": "back_off", "evaluation": True, "micro_batch": self.micro_batch,
                      "error": str(error).splitlines()[0][:200]})
        self.out.say(f"out of memory in an evaluation: micro-batch {before} -> "
                     f"{self.micro_batch} sequences; evaluating again")

    def batch_fits(self, seconds):
        """Would one more held-out batch (seconds: as long as this evaluation's so far, or the
        last evaluation's) end before the wall-clock deadline, on the slowest rank's clock? An
        evaluation counts against the budget like everything after the start, so a slow one on a
        busy machine is cut to the batches that fit rather than end the run late."""
        if not self.clock.seconds:  # a step or token budget: evaluations cost none of it
            return True
        seconds = max(seconds, self.seconds or 0.0)
        elapsed, _ = parallel.agree_on_clock(self.clock.elapsed() + seconds, [], self.hw.device,
                                             self.hw.world)
        return elapsed <= self.clock.seconds


def eval_mask_rate(args):
    """The masking rate of the held-out batches: --eval-mask-rate (0.25 by default), or the training
    rate for a run saved before that flag existed (None in its args.json)."""
    return args.mask_rate if args.eval_mask_rate is None else args.eval_mask_rate


def val_text(losses):
    """'3.410', or for a mixture '3.410 (plays 3.302, sonnets 3.671)': the progress line's loss."""
    by_source = losses.get("val_loss_by_source", {})
    each = ", ".join(f"{name} {loss:.3f}" for name, loss in by_source.items())
    return f"{losses['val_loss']:.3f} ({each})" if each else f"{losses['val_loss']:.3f}"


def log_eval(out, state, p, losses, elapsed, **extra):
    """An 'eval' record in log.jsonl. elapsed: the clock's seconds (0 for the step-0 evaluation,
    which runs before the clock starts)."""
    out.log({"kind": "eval", "step": state.step, "tokens": state.tokens, "flops": state.flops,
             "elapsed": round(elapsed, 3), "progress": round(p, 5), **losses, **extra})


SAMPLE_TEXT = {"mlm": "To be, or not to [MASK], that is the question. I [MASK] you, my lord.",
               "clm": "To be, or not to be, that is"}


def samples(net, enc, args, rank):
    """model.sample_line for --sample-text on rank 0, '' on the others, run eager. Under FSDP
    every rank runs the forward passes, with the root's tensors all-gathered for the whole call."""
    plain = model.unwrap(net)
    text = args.sample_text or SAMPLE_TEXT[args.objective]
    text = text.lower() if args.lowercase else text  # as the corpus was cleaned
    # Eager even under --compile: one short sequence outside autocast would compile every block
    # and the head again (3 graphs, ~6 s cold on 2 CPU cores, at the first evaluation on the clock)
    with torch.compiler.set_stance("force_eager"):
        if args.shard != "fsdp":
            return model.sample_line(plain, enc, text, args.objective) if rank == 0 else ""
        plain.unshard()
        try:
            line = model.sample_line(plain, enc, text, args.objective)
        finally:
            plain.reshard()
    return line if rank == 0 else ""
