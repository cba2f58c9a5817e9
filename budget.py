"""budget.py: the wall-clock budget of cramming. Progress against every budget given, the hard
deadline, and stop signals.

    clock = budget.Budget(args)                          # hours, minutes, max_steps, max_tokens
    p = clock.progress(step, tokens, clock.elapsed())    # in [0, 1]: every schedule reads it
    last = budget.ends_past_deadline(clock, state, device, world, seconds_of_last_micro_batch)
    handlers = budget.catch_stop_signals(clock)          # SIGTERM, SIGINT: clock.signals

A run ends when the first budget given is spent: wall clock (--hours, --minutes), optimizer steps
or training tokens. Progress p is the largest fraction used, so the schedules (learning rate, batch
ramp, growth) are functions of p alone and a slow step or a resume never shifts them
(Geiping & Goldstein 2022, Sec. 3).

The deadline is hard: the micro-batch that would end past it is a step's last, and that step is the
run's last. Signals only set a flag, so the step in flight finishes and the run saves before it
stops. Everything here is a function of the clock and the counters; the ranks of a distributed run
agree on both through parallel.agree_on_clock.
"""
import signal
import time

import parallel


def budget_seconds(args):
    """The wall-clock budget in seconds (--hours plus --minutes), or None when only steps or tokens
    bound the run."""
    return ((args.hours or 0) * 3600 + (args.minutes or 0) * 60) or None


class Budget:
    """Progress p in [0, 1]: the largest of elapsed/wall-clock budget, steps/max-steps and
    tokens/max-tokens. A signal (SIGTERM, SIGINT) only lands in `signals`: the loop decides."""

    def __init__(self, args, elapsed=0.0):
        self.seconds = budget_seconds(args)
        self.max_steps, self.max_tokens = args.max_steps, args.max_tokens
        self.signals = []      # the stop signals received (SIGTERM, SIGINT)
        self.reached = False   # a step was cut at the deadline: it was the run's last
        self.start_clock(elapsed)

    def start_clock(self, elapsed=0.0):
        self.start = time.time() - elapsed  # a resumed run continues the same clock

    def elapsed(self):
        # wall-clock time on purpose (as cramming's check_deadline): the budget is the user's
        # hours, so waiting on data, evaluations and checkpoints all count
        return time.time() - self.start

    def parts(self, step, tokens, elapsed):
        """(fraction used, what is left in its own unit) of every budget that was given."""
        parts = []  # each budget given; the one furthest along decides progress
        if self.seconds:
            left = max(0.0, self.seconds - elapsed) / 60
            parts.append((elapsed / self.seconds, f"{left:.1f} min"))
        if self.max_steps:
            parts.append((step / self.max_steps, f"{max(0, self.max_steps - step):,} steps"))
        if self.max_tokens:
            left = max(0, int(self.max_tokens - tokens))
            parts.append((tokens / self.max_tokens, f"{left:,} tokens"))
        return parts

    def left(self, step, tokens, elapsed):
        """What is left of the budget that ends first: '1.5 min', '3,072 tokens' or '12 steps'."""
        return max(self.parts(step, tokens, elapsed))[1]

    def progress(self, step, tokens, elapsed):
        # the largest fraction: the run ends at the first budget spent, and a schedule that reads
        # p reaches its end exactly then (the triangle's lr is 0 at p = 1). Called before every
        # micro-batch, so no text is formatted here (parts() makes the text for the bar)
        if self.reached:
            return 1.0
        used = [elapsed / self.seconds if self.seconds else 0.0,
                step / self.max_steps if self.max_steps else 0.0,
                tokens / self.max_tokens if self.max_tokens else 0.0]
        return min(1.0, max(used))


def ends_past_deadline(clock, state, device, world, micro_seconds):
    """Would one more micro-batch, as long as the last one, end past the deadline (or has a stop
    signal come)? Then it is the step's last, and at the deadline that step is the run's last
    too, even if its final micro-batch ran faster and the clock stops just short: no extra steps
    of one micro-batch."""
    # the slowest rank's clock and any rank's signal: every rank cuts the same micro-batch, or the
    # gradient all-reduce would wait for a rank that already stopped
    elapsed, stopped = parallel.agree_on_clock(clock.elapsed() + micro_seconds, clock.signals,
                                               device, world)
    clock.reached = clock.progress(state.step, state.tokens, elapsed) >= 1.0
    return clock.reached or stopped


def catch_stop_signals(clock):
    """SIGTERM (preemption) and SIGINT (Ctrl-C) only record the signal: the step in flight
    finishes, then the run saves a checkpoint. Returns the handlers they replaced."""
    return {sig: signal.signal(sig, lambda s, f: clock.signals.append(s))
            for sig in (signal.SIGTERM, signal.SIGINT)}


def restore_signal_handlers(handlers):
    # train() may run several times in one process (the tests, the benches): leave no handler
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
