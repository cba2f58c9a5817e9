"""loader.py: token shards on disk -> endless, deterministic training batches (masked or causal LM).

    loader = make_loader(meta, "train", {"objective": "mlm", "seed": 0, "mask_rate": 0.25})
    batch = loader.next_batch(batch_size=32, seq_len=128)  # dict of int64 tensors
    state = loader.state_dict()                             # loader.load_state_dict(state) resumes
    batch = mask_mlm(window, positions, 0.25, seed, special, n_ordinary)  # BERT masking, alone

meta is what data.py's prepare_data returns (or its folder, or its meta.json). The pieces:
1. make_loader: the one call train.py needs, from a prepared folder to a Loader.
2. mask_mlm: BERT's masking (Devlin et al. 2019, sec. 3.1: 80% [MASK], 10% random token, 10%
   unchanged) at cramming's 25% rate (Geiping & Goldstein 2023, arXiv 2212.14034), with exactly
   k = round(mask_rate * T) masked positions per sequence (static shapes).
3. Loader: the shards of a split form one token stream that repeats forever, cut into blocks of
   8192 tokens that are shuffled per epoch. Batch i is a pure function of (seed, stream position,
   rank), via a counter-based hash (hash64), so the loader's state is just the position and
   resuming reproduces the uninterrupted stream bit for bit.
4. MixtureLoader gives block k of the stream to a source by a fixed, evenly spread pattern
   (mixture_pattern), so everything above still holds for a mixture of corpora.
5. The shard format: a 32-byte header, then little-endian uint16/uint32 tokens (write_shard,
   read_shard).
This file imports nothing else of the project: it can be copied out with the shards it reads.
"""
import concurrent.futures
import json
import os
import struct

import numpy as np
import torch

SHARD_MAGIC, SHARD_VERSION = b"GCTOKENS", 1
SHARD_HEADER = struct.Struct("<8sIIQ8x")  # magic, version, bytes per token (2, 4), count, pad: 32 B
BLOCK_TOKENS = 8192  # shuffle granularity of the training stream
MIX_PERIOD = 10_000  # a mixture's block pattern repeats every this many blocks: weights to 1/10,000

# A loader's settings: make_loader and Loader take a dict of some of these keys, the rest as here.
DEFAULTS = {
    "objective": "mlm",            # "mlm": masked LM (BERT), "clm": causal LM (next token)
    "seed": 0,                     # every shuffle and mask is a hash of (seed, stream position)
    "rank": 0,                     # this process's share of each global batch (make_loader: None)
    "world_size": 1,               # processes sharing the stream (make_loader: None)
    "mask_rate": 0.25,             # MLM: share of each sequence's positions masked (cramming's 25%)
    "shuffle": True,               # shuffle the blocks per epoch (make_loader: None)
    "block_tokens": BLOCK_TOKENS,  # the blocks that are shuffled, in tokens
}
# make_loader's None for rank and world_size reads torch.distributed's (0 and 1 when it is not
# initialized); its None for shuffle shuffles the train split only.


# -------------------------------------------------------------------------------------------------
# make_loader: the one call train.py needs

def make_loader(meta, split="train", settings=None, device="cpu", prefetch=None, source=None):
    """Loader over prepare_data's output (the dict, its folder or meta.json).

    settings: a dict of DEFAULTS' keys; rank/world_size None (the default here) are
    torch.distributed's when it is initialized, else 0/1; shuffle None (the default here) is True
    for train only; prefetch (a background thread building the next batch) defaults to True on CUDA
    only. A mixture gives a MixtureLoader over its sources' splits, or with source=NAME a Loader
    over that source's split alone."""
    settings = {"rank": None, "world_size": None, "shuffle": None, **(settings or {})}
    meta = load_meta(meta) if isinstance(meta, str) else meta
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    sources = meta.get("sources")
    if source is not None:  # one source of a mixture, alone (the held-out loss per language)
        match = [s for s in sources or [] if s["name"] == source]
        if not match:
            names = ", ".join(s["name"] for s in sources or []) or "none, one corpus"
            raise ValueError(f"{meta['dir']}: no source named {source!r} (sources: {names})")
        meta, sources = {**meta, split: match[0][split]}, None
    if not meta[split]:
        raise ValueError(f"{meta['dir']}: split '{split}' is empty (val_fraction 0?)")
    dist = torch.distributed.is_available() and torch.distributed.is_initialized()
    if settings["rank"] is None:
        settings["rank"] = torch.distributed.get_rank() if dist else 0
    if settings["world_size"] is None:
        settings["world_size"] = torch.distributed.get_world_size() if dist else 1
    if settings["shuffle"] is None:  # the val split is read in order: the same held-out text always
        settings["shuffle"] = split == "train"
    tokenizer = (meta["n_ordinary"], meta["special_ids"])
    if sources:
        parts = [{"name": s["name"], "weight": s["weight"], "files": s[split]} for s in sources]
        return MixtureLoader(parts, *tokenizer, settings, device, prefetch)
    return Loader(meta[split], *tokenizer, settings, device, prefetch)


def load_meta(path):
    """A prepared folder (or its meta.json) -> prepare_data's dict, with absolute paths."""
    folder = os.path.dirname(path) if path.endswith(".json") else path
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        where = os.path.join(folder, "meta.json")
        raise ValueError(f"{where}: cannot read prepared data ({e})") from None
    # meta.json holds paths relative to its folder: a prepared folder can be moved or copied whole
    join = lambda p: os.path.join(os.path.abspath(folder), p)  # noqa: E731
    splits = lambda d: {split: [join(p) for p in d[split]] for split in ("train", "val")}  # noqa: E731
    if "sources" in meta:  # a mixture: every source's shards too
        meta["sources"] = [{**s, **splits(s)} for s in meta["sources"]]
    return {**meta, "dir": os.path.abspath(folder), "tokenizer": join(meta["tokenizer"]),
            **splits(meta)}


# -------------------------------------------------------------------------------------------------
# BERT's masking, as a pure function of the window and its stream positions

def mask_mlm(window, positions, mask_rate, seed, special, n_ordinary):
    """BERT's masked-LM input (Devlin et al. 2019, sec. 3.1, "Task #1: Masked LM"), with cramming's
    rate and fixed count (Geiping & Goldstein 2023, arXiv 2212.14034: mlm_probability 0.25, exactly
    round(0.25 * T) masks per sequence, so shapes stay static for torch.compile).

    window:     (B, T-2) int64 token ids, a sequence without its [CLS] and [SEP]
    positions:  (B, T-2) int64 stream positions of those tokens. All randomness is
                hash64(seed, ., position): a mask depends on where a token sits in the stream,
                never on the batch it lands in
    special:    {"cls", "sep", "mask", ...} -> token id (tokenizer.special_ids)
    n_ordinary: ids at or above it are special: never masked, never drawn as the random token
    Returns a dict of numpy int64 arrays, with k = round(mask_rate * T):
      input_ids       (B, T)  [CLS] window [SEP], each picked position replaced by [MASK] (80%),
                              a random ordinary token (10%) or left as it was (10%)
      labels          (B, k)  the original ids at the picked positions; -100 where a sequence
                              has fewer than k maskable tokens (the loss ignores them)
      label_positions (B, k)  the picked positions into T, ascending"""
    T = window.shape[1] + 2  # the window plus [CLS] and [SEP]
    k = round(mask_rate * T)
    if not 1 <= k <= T - 2:
        raise ValueError(f"mask_rate {mask_rate} at seq_len {T} gives {k} masked positions (need "
                         f"1..{T - 2})")
    # The k lowest hash scores of a row are its masked positions: a uniform choice without
    # replacement. pick holds them as (B, k) columns of the window.
    score = hash64(seed, 1, positions)
    score[window >= n_ordinary] = np.iinfo(np.uint64).max  # specials are picked last, never masked
    pick = np.sort(np.argpartition(score, k - 1, axis=1)[:, :k], axis=1)
    orig, ppos = np.take_along_axis(window, pick, 1), np.take_along_axis(positions, pick, 1)
    maskable = orig < n_ordinary
    # BERT's 80/10/10 (sec. 3.1): the model cannot tell which unmasked tokens it will be asked about
    h = hash64(seed, 2, ppos)  # low 32 bits pick the action, high 32 bits the random token
    action = ((h & np.uint64(0xFFFFFFFF)) % np.uint64(10)).astype(np.int64)
    rand = ((h >> np.uint64(32)) % np.uint64(n_ordinary)).astype(np.int64)
    new = np.where(action < 8, special["mask"], np.where(action == 8, rand, orig))
    ids = np.empty((window.shape[0], T), dtype=np.int64)  # (B, T) = [CLS] window [SEP]
    ids[:, 0], ids[:, 1:-1], ids[:, -1] = special["cls"], window, special["sep"]
    np.put_along_axis(ids, pick + 1, np.where(maskable, new, orig), 1)  # + 1: past the [CLS]
    return {"input_ids": ids, "labels": np.where(maskable, orig, -100), "label_positions": pick + 1}


# -------------------------------------------------------------------------------------------------
# A counter-based hash makes every random choice a pure function of (seed, purpose, stream position)

_U64 = (1 << 64) - 1


def _mix_int(x):  # splitmix64 finalizer on a Python int (Steele et al. 2014)
    x = (x + 0x9E3779B97F4A7C15) & _U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def hash64(seed, salt, positions):
    """uint64 pseudo-random numbers, one per int64 position: splitmix64 of (key(seed, salt) +
    position * gamma). No generator state, so any batch can be recomputed from its stream position
    alone."""
    key = np.uint64(_mix_int(_mix_int(seed) ^ salt))  # salt: one independent stream per purpose
    x = positions.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + key
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


# -------------------------------------------------------------------------------------------------
# Loader: one corpus's split

class Loader:
    """Endless, deterministic, rank-sharded batches from one split's shards.

    The split's tokens (documents followed by [SEP]) form a stream of n_tokens per epoch; epoch e
    reads them in blocks of block_tokens permuted by hash64(seed, e) (the val split is read in
    order). `position` counts stream tokens consumed by all ranks. A call next_batch(B, T) builds
    world_size * B windows back to back from `position`; rank r takes windows r*B .. r*B+B-1, and
    position advances past all of them. Hence ranks never overlap, and their batches concatenated
    in rank order equal the batch one rank would draw with batch size world_size * B, masks
    included. B and T may change from call to call.
      MLM: window = T-2 stream tokens, input_ids = [CLS] window [SEP] (B, T), masked by
        mask_mlm: label_positions (B, k), labels (B, k).
      CLM: window = T+1 stream tokens (windows overlap by one), input_ids = window[:-1],
        labels = window[1:].
    The state holds the global position and seed; a run resumed with another world_size
    continues the same global stream. The stream is cut at block and epoch boundaries without a
    [SEP]; with 8192-token blocks that touches about T/8192 of the windows.
    shards: the split's shard files. n_ordinary, special: the tokenizer's (tokenizer.n_ordinary,
    tokenizer.special_ids). settings: a dict of some of DEFAULTS' keys."""

    def __init__(self, shards, n_ordinary, special, settings=None, device="cpu", prefetch=None):
        unknown = sorted(set(settings or {}) - set(DEFAULTS))
        if unknown:  # a misspelled key would otherwise be ignored in silence
            raise ValueError(f"unknown loader setting {unknown[0]!r}; valid: {', '.join(DEFAULTS)}")
        s = {**DEFAULTS, **(settings or {})}
        if s["objective"] not in ("mlm", "clm"):
            raise ValueError(f"objective must be 'mlm' or 'clm', got {s['objective']!r}")
        if not 0 < s["mask_rate"] < 1 or not 0 <= s["rank"] < s["world_size"]:
            raise ValueError(f"need 0 < mask_rate < 1 and 0 <= rank < world_size "
                             f"(got {s['mask_rate']}, {s['rank']}, {s['world_size']})")
        self.shards = [np.asarray(read_shard(p)) for p in shards]  # plain views: memmaps cost more
        self.starts = np.cumsum([0] + [len(x) for x in self.shards])  # shard i from starts[i] on
        self.n_tokens = int(self.starts[-1])
        if self.n_tokens == 0:
            raise ValueError(f"no tokens in shards {shards}")
        self.n_ordinary, self.special = n_ordinary, special
        self.objective, self.seed = s["objective"], s["seed"]
        self.rank, self.world_size, self.mask_rate = s["rank"], s["world_size"], s["mask_rate"]
        self.device = torch.device(device)
        self.shuffle, self.block = s["shuffle"], s["block_tokens"]
        # Prefetch pays off on CUDA, where the main thread waits for the GPU; on a CPU the thread
        # only competes for the GIL and the cores (bench/bench_data.py measures both).
        self.prefetch = self.device.type == "cuda" if prefetch is None else prefetch
        self.position, self.batches, self._perms, self._ahead, self._pool = 0, 0, {}, None, None

    def state_dict(self):
        return {"position": self.position, "epoch": self.position // self.n_tokens,
                "batches": self.batches, "seed": self.seed, "n_tokens": self.n_tokens}

    def load_state_dict(self, state):
        if "sources" in state:
            raise ValueError("loader state is for a corpus mixture, this loader reads one corpus")
        if state["n_tokens"] != self.n_tokens:
            raise ValueError(f"loader state is for a split of {state['n_tokens']} tokens, "
                             f"this one has {self.n_tokens}")
        self.position, self.batches = int(state["position"]), int(state["batches"])
        self.seed = int(state["seed"])
        # a prefetched batch and cached orders belong to the old state
        self._ahead, self._perms = None, {}

    def next_batch(self, batch_size, seq_len=128, mask_rate=None):
        """The next batch of this rank as a dict of int64 tensors on the loader's device (see the
        class doc); mask_rate overrides the settings' for this batch (a falling rate, Ankner et
        al. 2023). With prefetch, a background thread builds the batch after it (same sizes and
        rate) during the training step; since a batch is a pure function of its position and rate,
        prefetching never changes what is returned."""
        rate = self.mask_rate if mask_rate is None else mask_rate
        key = (self.position, batch_size, seq_len, rate)
        ahead, self._ahead = self._ahead, None
        batch = ahead[1].result() if ahead is not None and ahead[0] == key else self._make(*key)
        stride = seq_len - 2 if self.objective == "mlm" else seq_len  # stream tokens per window
        self.position += self.world_size * batch_size * stride
        self.batches += 1
        if self.prefetch:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="growcram-loader")
            nxt = (self.position, batch_size, seq_len, rate)
            self._ahead = (nxt, self._pool.submit(self._make, *nxt))
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _make(self, position, B, T, mask_rate):
        """The batch of this rank starting at stream `position`, as tensors (pinned on CUDA)."""
        mlm = self.objective == "mlm"
        stride = T - 2 if mlm else T  # MLM leaves room for [CLS] and [SEP]; CLM windows share one
        if B < 1 or stride < 1:
            raise ValueError(f"need batch_size >= 1 and seq_len >= {3 if mlm else 1} "
                             f"(got {B}, {T})")
        starts = position + stride * (self.rank * B + np.arange(B))  # this rank's windows
        pos = starts[:, None] + np.arange(stride if mlm else T + 1)  # (B, L) stream positions
        window = self._read(pos)
        if mlm:
            batch = mask_mlm(window, pos, mask_rate, self.seed, self.special, self.n_ordinary)
        else:
            batch = {"input_ids": window[:, :-1], "labels": window[:, 1:]}
        batch = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
        if self.device.type == "cuda":  # page-locked memory: the copy to the GPU is asynchronous
            batch = {k: v.pin_memory() for k, v in batch.items()}
        return batch

    def _perm(self, epoch):
        """Block order of one epoch: full blocks shuffled by hash, the last partial block at the
        end."""
        perm = self._perms.get(epoch)
        if perm is None:
            if len(self._perms) > 4:  # a batch spans at most a few epochs; keep the cache small
                self._perms = {}
            n_full = self.n_tokens // self.block
            # sorting hash values is a uniform random permutation, computed from (seed, epoch) alone
            order = np.argsort(hash64(self.seed, 1000 + epoch, np.arange(n_full)), kind="stable")
            perm = np.append(order, n_full) if self.shuffle else np.arange(n_full + 1)
            self._perms[epoch] = perm
        return perm

    def _read(self, pos, shift=0, out=None):
        """(B, L) ascending stream positions, plus shift (where a mixture's run of blocks starts in
        this stream) -> (B, L) int64 tokens, written into out when given (a mixture's batch, one
        run at a time)."""
        n = self.n_tokens
        first, last = (int(pos[0, 0]) + shift) // n, (int(pos[-1, -1]) + shift) // n
        if first == last:  # usually one epoch per batch
            block, offset = np.divmod(pos + (shift - first * n), self.block)
            block = self._perm(first)[block]
        else:              # tiny corpora wrap several times
            epoch = (pos + shift) // n
            block, offset = np.divmod(pos + shift - epoch * n, self.block)
            for e in range(first, last + 1):
                sel = epoch == e
                block[sel] = self._perm(e)[block[sel]]
        src = block * self.block + offset  # where each token sits in the shards, end to end
        out = np.empty(src.shape, dtype=np.int64) if out is None else out
        if len(self.shards) == 1:
            out[...] = self.shards[0][src]
            return out
        which = np.searchsorted(self.starts, src, side="right") - 1
        for i in np.unique(which):
            sel = which == i
            out[sel] = self.shards[i][src[sel] - self.starts[i]]
        return out


# -------------------------------------------------------------------------------------------------
# Mixtures: several corpora, each with its weight, interleaved block by block

def mixture_pattern(weights, period=MIX_PERIOD):
    """The block order of a mixture, repeated every `period` blocks: (source of each
    block of the period, the block's rank among that source's blocks in the period,
    blocks per source in a period). Source s gets n_s = weight_s * period blocks (largest
    remainder, at least one), spread evenly like a smooth weighted round robin: its j-th
    block sits at time (j + 0.5) / n_s of the period. Any stretch of the stream then
    holds each source within about one block of its share, from the first batch on."""
    raw = np.asarray(weights, dtype=np.float64) * period
    n = np.maximum(1, np.floor(raw)).astype(np.int64)
    for _ in range(period - int(n.sum())):  # hand out the remainders, largest first
        n[np.argmax(raw - n)] += 1
    # Tiny weights were raised to one block: take it back from the largest.
    for _ in range(int(n.sum()) - period):
        n[np.argmax(np.where(n > 1, n - raw, -np.inf))] -= 1
    source = np.repeat(np.arange(len(n)), n)
    rank = np.concatenate([np.arange(c) for c in n])
    order = np.argsort((rank + 0.5) / n[source], kind="stable")
    return source[order], rank[order], n


class MixtureLoader(Loader):
    """A Loader over a corpus mixture: several sources, each with its own shards and its weight.

    The global stream is cut into blocks of block_tokens. Block k belongs to source
    s = source[k % P] of mixture_pattern (P = MIX_PERIOD) and is that source's block
    j = (k // P) * n_s + rank[k % P], so finding where any position comes from is O(1). A source's
    blocks are read from its own stream, which is exactly a Loader's (its blocks shuffled per
    epoch, repeating forever): a source whose weight asks for more tokens than it holds is
    repeated, one that holds more is cut. Windows, rank sharding, MLM masks (hashed from the global
    position) and prefetch are the Loader's, so determinism, exact resume, a changed world size and
    the disjoint DDP shards hold as they do for one corpus. epochs() says how often each source has
    been read.
    sources: [{"name", "weight", "files"}]; the other arguments are the Loader's."""

    def __init__(self, sources, n_ordinary, special, settings=None, device="cpu", prefetch=None):
        # the Loader's checks and state, over all shards: n_tokens is the mixture's total
        every_shard = [f for s in sources for f in s["files"]]
        super().__init__(every_shard, n_ordinary, special, settings, device, prefetch)
        self.names, self.weights = [s["name"] for s in sources], [s["weight"] for s in sources]
        # One Loader per source, of which only _read is used: a part reads the global stream.
        one = {**DEFAULTS, **(settings or {}), "rank": 0, "world_size": 1}
        self.parts = [Loader(s["files"], n_ordinary, special, one, "cpu", prefetch=False)
                      for s in sources]
        # Python lists: _read looks up a few blocks per batch, where numpy's per-call cost dominates
        self.pattern, self.nth, self.n_blocks = (a.tolist() for a in mixture_pattern(self.weights))

    def state_dict(self):
        sources = [{"name": name, "weight": w, "n_tokens": part.n_tokens}
                   for name, w, part in zip(self.names, self.weights, self.parts)]
        return {**super().state_dict(), "sources": sources, "epochs": self.epochs()}

    def load_state_dict(self, state):
        mine = self.state_dict()["sources"]
        # A resumed run must read the same mixture, or its stream differs.
        if state.get("sources") != mine:
            describe = lambda ss: ", ".join(  # noqa: E731
                f"{s['name']}:{s['weight']:.4g} ({s['n_tokens']} tokens)" for s in ss)
            theirs = describe(state["sources"]) if "sources" in state else "one corpus"
            raise ValueError(f"loader state is for {theirs}, this mixture is {describe(mine)}")
        self.position, self.batches = int(state["position"]), int(state["batches"])
        self.seed = int(state["seed"])
        for part in self.parts:
            part.seed, part._perms = self.seed, {}
        self._ahead = None

    def _read(self, pos):
        """(B, L) global stream positions -> (B, L) int64 tokens. Positions ascend through the
        batch, row after row, so a batch is a few runs of consecutive blocks of one source each (a
        batch spans a few blocks), and within a run a position in the source's stream is the global
        one plus a constant, which its _read adds."""
        flat, P = pos.reshape(-1), len(self.pattern)
        runs = []  # [source, shift, first global block] per run
        for k in range(int(flat[0]) // self.block, int(flat[-1]) // self.block + 1):
            s = self.pattern[k % P]
            if not runs or runs[-1][0] != s:  # a new run; its block k is the source's block j
                j = (k // P) * self.n_blocks[s] + self.nth[k % P]
                runs.append([s, (j - k) * self.block, k])
        if len(runs) == 1:  # the usual case: the batch lies in one run
            return self.parts[runs[0][0]]._read(pos, runs[0][1])
        if int(flat[-1]) - int(flat[0]) == flat.size - 1:  # MLM windows lie back to back
            edges = [0, *(k * self.block - int(flat[0]) for _, _, k in runs[1:]), flat.size]
        else:                                              # CLM windows overlap by one token
            edges = [0, *np.searchsorted(flat, [k * self.block for _, _, k in runs[1:]]), flat.size]
        out = np.empty(flat.shape, dtype=np.int64)
        for (s, shift, _), a, b in zip(runs, edges[:-1], edges[1:]):
            self.parts[s]._read(flat[None, a:b], shift, out[None, a:b])
        return out.reshape(pos.shape)

    def tokens_drawn(self):
        """{source: tokens the stream has taken from it so far} (all ranks together)."""
        P = len(self.pattern)
        k, offset = divmod(self.position, self.block)
        # whole periods give each source its n_s blocks; the current period, its blocks so far
        blocks = (k // P) * np.array(self.n_blocks) + np.bincount(self.pattern[:k % P],
                                                                  minlength=len(self.parts))
        drawn = blocks * self.block
        drawn[self.pattern[k % P]] += offset
        return dict(zip(self.names, drawn.tolist()))

    def epochs(self):
        """{source: passes over its tokens so far}: above 1 the source is being repeated."""
        drawn = self.tokens_drawn().items()
        return {name: round(n / part.n_tokens, 4) for (name, n), part in zip(drawn, self.parts)}


# -------------------------------------------------------------------------------------------------
# The shard format: SHARD_HEADER (32 bytes), then `count` little-endian uint16 or uint32 tokens

def write_shard(path, tokens, itemsize=2):
    """Write one shard atomically (tests and tools; data.py's prepare_data streams its shards)."""
    tokens = np.asarray(tokens, dtype=f"<u{itemsize}")
    # Written beside path and renamed into place (atomic in one folder): a crash never leaves half a
    # file. (files.atomic_write does the same; this file imports nothing of the project.)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(SHARD_HEADER.pack(SHARD_MAGIC, SHARD_VERSION, itemsize, tokens.size))
        f.write(tokens.tobytes())
    os.replace(tmp, path)


def close_shard(shard, itemsize):
    """Write the real header over the placeholder and close a shard being streamed (data.py writes
    shards as {"f": open file starting with SHARD_HEADER.size zero bytes, "n": tokens written})."""
    shard["f"].seek(0)
    shard["f"].write(SHARD_HEADER.pack(SHARD_MAGIC, SHARD_VERSION, itemsize, shard["n"]))
    shard["f"].close()
    shard["f"] = None


def read_shard(path):
    """Validate the header and memory-map the tokens: (count,) read-only uint16/uint32 array."""
    if not os.path.exists(path):
        raise ValueError(f"shard not found: {path}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(SHARD_HEADER.size)
    if len(head) < SHARD_HEADER.size:
        raise ValueError(f"{path}: truncated shard header ({size} bytes)")
    magic, version, itemsize, count = SHARD_HEADER.unpack(head)
    if magic != SHARD_MAGIC:
        raise ValueError(f"{path}: not a token shard (bad magic {magic!r})")
    if version != SHARD_VERSION or itemsize not in (2, 4):
        raise ValueError(f"{path}: unsupported shard "
                         f"(version {version}, {itemsize} bytes per token)")
    if size != SHARD_HEADER.size + count * itemsize:  # the size tells a shard cut short by a crash
        raise ValueError(f"{path}: truncated or corrupt shard "
                         f"({size} bytes, header says {count} tokens)")
    if count == 0:
        return np.zeros(0, dtype=f"<u{itemsize}")
    return np.memmap(path, dtype=f"<u{itemsize}", mode="r", offset=SHARD_HEADER.size,
                     shape=(count,))
