"""data.py: raw text -> cleaned documents -> a BPE tokenizer -> token shards -> training batches.

    python data.py --data sample --out cache --vocab-size 8192     # the bundled Shakespeare corpus, offline
    python data.py --data my_corpus/ --out cache                    # .txt / .jsonl / .jsonl.gz / .parquet files
    python data.py --data fineweb --fineweb-shards 4 --out cache    # FineWeb-Edu parquet shards over HTTPS
    python data.py --data "sample:0.7,fineweb2:fra_Latn:0.3"        # a mixture; FineWeb-2 row groups by Range requests
    python data.py --data "sample,fr/" --mix-temperature 3.3        # weights from the sizes, as XLM samples languages

Pipeline (each stage is a small function below; prepare_data() runs them all and caches the result):
1. Sources. Documents are streamed file by file, never loaded whole, so RAM stays flat on big corpora.
   Downloads (FineWeb-Edu, FineWeb-2) go through download.py: resumed, retried, renamed into place whole.
2. Cleaning, after cramming's pipeline (Geiping & Goldstein, ICML 2023, arXiv 2212.14034): Unicode
   normalization, optional lowercasing and accent stripping (cramming does both; we keep case by default),
   exact-duplicate removal and a filter that drops documents needing too many tokens per character
   (cramming's `trash_cutoff`: keep a document iff tokens < 0.25 * characters; off by default here).
   Every step reports the documents and UTF-8 bytes it removed.
3. Tokenizer: byte-level BPE trained with rustbpe, wrapped as a tiktoken.Encoding (fast, multi-threaded encoding).
   Specials [PAD] [CLS] [SEP] [MASK] plus reserved ids come after the merges; n_vocab is a multiple of 64.
4. Shards: every document is encoded and followed by [SEP]; a process pool tokenizes, the main process
   deduplicates and writes flat binary shards (32-byte header, then uint16/uint32 tokens). A document goes
   to the validation split when its index among kept documents is a multiple of round(1 / val_fraction).
5. Batches: the shards of a split form one token stream that repeats forever, cut into blocks of 8192 tokens
   that are shuffled per epoch. Batch i is a pure function of (seed, stream position, rank), so the loader's
   state is just the position and resuming reproduces the uninterrupted stream bit for bit.
   MLM masking follows BERT (Devlin et al. 2019, sec. 3.1: 80% [MASK], 10% random token, 10% unchanged) at
   cramming's 25% rate, with exactly k = round(mask_rate * T) masked positions per sequence (static shapes).
Mixtures (several sources, each with a weight) share one tokenizer trained on a sample in the mixture's
proportions; each source keeps its own shards and val split, and MixtureLoader gives block k of the stream to a
source by a fixed, evenly spread pattern (mixture_pattern), so everything above still holds for them.
"""
import argparse
import base64
import codecs
import collections
import concurrent.futures
import contextlib
import gzip
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import struct
import sys
import unicodedata

import numpy as np
import tiktoken
import torch
from tqdm import tqdm

from download import HTTPStatusError, RemoteFile, download_file  # resumable, retried HTTP downloads
from model import VOCAB_MULTIPLE, atomic_write, round_up  # one definition each, in the module everything imports

SAMPLE_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpora", "shakespeare.jsonl.gz")
FINEWEB_URL = "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main"
FINEWEB_TOKENS_PER_SHARD = 55e6  # ~250 M characters per shard at ~4.5 characters per token (32K BPE)
FINEWEB2_URL = "https://huggingface.co/datasets/HuggingFaceFW/fineweb-2/resolve/main"
FINEWEB2_LANG = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")  # ISO 639-3 language _ ISO 15924 script, as in fra_Latn
FINEWEB2_CHARS_PER_TOKEN = 5.0  # characters fetched per budgeted token: generous, as languages compress unlike
FINEWEB2_DEFAULT_CHARS = 250e6  # without a token budget: about one FineWeb-Edu shard's worth
SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".parquet")
TXT_DOC_CHARS = 65536          # a .txt file is cut at blank lines into documents of about this many characters

# GPT-4's split pattern with numbers grouped by at most 2 digits (nanochat: best at a 32K vocabulary).
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
                 r"""|\s*[\r\n]|\s+(?!\S)|\s+""")
SPECIAL_TOKENS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]"]
MIN_RESERVED = 4               # spare special ids ("[RESERVED_i]") so later features need no new vocabulary
TOKENIZER_FORMAT, TOKENIZER_VERSION = "growcram-tokenizer", 1
TOKENIZER_CHARS = 1_000_000_000  # characters of (cleaned) corpus the tokenizer is trained on, at most

SHARD_MAGIC, SHARD_VERSION = b"GCTOKENS", 1
SHARD_HEADER = struct.Struct("<8sIIQ8x")  # magic, version, bytes per token (2 or 4), token count, padding: 32 bytes
SHARD_TOKENS = 1 << 27         # tokens per shard file before a new one starts (256 MB as uint16)
PREPARE_VERSION = 1            # bump when prepare_data's output changes, so old caches are not reused
BLOCK_TOKENS = 8192            # shuffle granularity of the training stream
MIX_PERIOD = 10_000            # a mixture's block pattern repeats every this many blocks: weights to 1/10,000


# ----------------------------------------------------------------------------------------------------------
# Sources: local files, the bundled sample, FineWeb-Edu downloads

_UTF8 = {"path": None, "replaced": collections.Counter()}  # invalid UTF-8 sequences replaced, per file


def _count_and_replace(err):
    _UTF8["replaced"][_UTF8["path"]] += 1
    return "\ufffd", err.end


codecs.register_error("growcram_count", _count_and_replace)


def _decode(raw, path):
    """bytes -> str; invalid UTF-8 becomes U+FFFD and is counted per file (reported, never fatal)."""
    _UTF8["path"] = path
    return raw.decode("utf-8", errors="growcram_count")


def list_files(path):
    """A file or a folder (searched recursively, sorted) -> the corpus files. ValueError if none."""
    if not os.path.exists(path):
        raise ValueError(f"data path not found: {path} (use --data sample, --data fineweb or --data PATH)")
    if os.path.isfile(path):
        if not path.endswith(SUFFIXES):
            raise ValueError(f"{path}: unsupported file type (expected one of {', '.join(SUFFIXES)})")
        return [os.path.abspath(path)]
    files = sorted(os.path.abspath(os.path.join(root, name)) for root, dirs, names in os.walk(path)
                   for name in names if name.endswith(SUFFIXES) and not name.startswith("."))
    if not files:
        raise ValueError(f"{path}: folder holds no {', '.join(SUFFIXES)} files")
    return files


def iter_documents(path):
    """Yield the documents (str) of one corpus file; a one-line ValueError names the file on bad input."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq  # only parquet corpora need pyarrow
        try:
            pf = pq.ParquetFile(path)
        except Exception as e:
            raise ValueError(f"{path}: not a readable parquet file ({e})") from None
        if "text" not in pf.schema_arrow.names:
            raise ValueError(f"{path}: no 'text' column (columns: {', '.join(pf.schema_arrow.names)})")
        for batch in pf.iter_batches(columns=["text"], batch_size=1024):  # one row group at a time
            yield from (t or "" for t in batch.column(0).to_pylist())
    elif path.endswith((".jsonl", ".jsonl.gz")):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    row = json.loads(_decode(raw, path))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise ValueError(f"{path}:{lineno}: no 'text' field holding a string")
                text = row["text"]
                # a JSON "\ud800" escape decodes to a lone surrogate, which is not UTF-8: replace and count it too
                yield text if text.isascii() else _decode(text.encode("utf-8", "surrogatepass"), path)
    else:  # .txt: cut at blank lines once a piece is long enough, so huge files stream and split by document
        with open(path, "rb") as f:
            lines, n = [], 0
            for raw in f:
                line = _decode(raw, path)
                lines.append(line)
                n += len(line)
                if n >= TXT_DOC_CHARS and not line.strip():
                    yield "".join(lines)
                    lines, n = [], 0
            if lines:
                yield "".join(lines)


def shards_for_tokens(n_tokens):
    """How many FineWeb-Edu shards (~55 M tokens each) hold n_tokens training tokens."""
    return max(1, math.ceil(n_tokens / FINEWEB_TOKENS_PER_SHARD))


OFFLINE_HINT = "use --data sample (bundled corpus) or --data PATH (local .txt/.jsonl/.parquet)"


def download_fineweb(n_shards, out_dir, base_url=FINEWEB_URL, **kwargs):
    """Fetch FineWeb-Edu shards shard_00000.parquet ... (first n_shards) into out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    return [download_file(f"{base_url.rstrip('/')}/shard_{i:05d}.parquet",
                          os.path.join(out_dir, f"shard_{i:05d}.parquet"), **{"hint": OFFLINE_HINT, **kwargs})
            for i in range(n_shards)]


def download_fineweb2(lang, out_dir, max_chars, base_url=FINEWEB2_URL, progress=True, **kwargs):
    """FineWeb-2 text of one language (lang_Script, e.g. fra_Latn) until it holds max_chars characters: the row
    groups of data/<lang>/train/000_00000.parquet, then 000_00001.parquet, ... (until one is missing). The files
    are GBs, so each row group's text column is fetched alone by Range requests (RemoteFile) and saved as a small
    parquet file, out_dir/000_00000-00003.parquet for row group 3, written atomically with its character count
    in the schema metadata. An interrupted download resumes at the next row group; a larger budget adds files."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(out_dir, exist_ok=True)
    hint = f"is {lang} a FineWeb-2 language (data/{lang}/ on the dataset's page)? Else {OFFLINE_HINT}"
    paths, chars = [], 0
    with tqdm(total=int(max_chars), unit="char", unit_scale=True, desc=f"fineweb2 {lang}",
              disable=not progress) as bar:
        for i in itertools.count():
            url, remote = f"{base_url.rstrip('/')}/data/{lang}/train/000_{i:05d}.parquet", None
            for group in itertools.count():
                path = os.path.join(out_dir, f"000_{i:05d}-{group:05d}.parquet")
                if not os.path.exists(path):
                    if remote is None:  # the footer, fetched only when a row group is missing here
                        try:
                            remote = pq.ParquetFile(RemoteFile(url, hint=hint, **kwargs))
                        except HTTPStatusError as e:
                            if e.status == 404 and paths:  # the language has no more files: use what we have
                                return paths
                            raise
                        if "text" not in remote.schema_arrow.names:
                            names = ", ".join(remote.schema_arrow.names)
                            raise ValueError(f"{url}: no 'text' column (columns: {names})")
                    if group >= remote.num_row_groups:
                        break
                    texts = [t or "" for t in remote.read_row_group(group, columns=["text"]).column(0).to_pylist()]
                    table = pa.table({"text": texts}).replace_schema_metadata({"chars": str(sum(map(len, texts)))})
                    atomic_write(path, lambda f: pq.write_table(table, f))
                n = int(pq.read_schema(path).metadata[b"chars"])
                paths.append(path)
                chars += n
                bar.update(n)
                if chars >= max_chars:
                    return paths


# ----------------------------------------------------------------------------------------------------------
# Cleaning

def clean_text(text, normalize="NFC", lowercase=False, strip_accents=False):
    """Returns (cleaned text, {step: UTF-8 bytes removed}). Steps run in this order; each is optional."""
    removed, size = {}, len(text.encode("utf-8"))
    steps = [("normalize", normalize and (lambda t: unicodedata.normalize(normalize, t))),
             ("lowercase", lowercase and str.lower),
             # NFD splits "é" into "e" + U+0301; dropping the combining marks strips the accent (as cramming does)
             ("strip_accents", strip_accents and (lambda t: t if t.isascii() else unicodedata.normalize(
                 normalize or "NFC", "".join(c for c in unicodedata.normalize("NFD", t)
                                             if not unicodedata.combining(c)))))]
    for name, fn in steps:
        if fn:
            text = fn(text)
            new = len(text.encode("utf-8"))
            removed[name], size = size - new, new
    return text, removed


def _digest(text):
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()


# ----------------------------------------------------------------------------------------------------------
# Tokenizer

def _with_specials(name, pattern, ranks, base_specials=None):
    """tiktoken.Encoding whose specials follow every existing id, reserved ids padding n_vocab to a multiple
    of 64 (tensor-core friendly embedding and output matrices)."""
    base_specials = dict(base_specials or {})
    first = max([len(ranks) - 1, *base_specials.values()]) + 1
    n_vocab = round_up(first + len(SPECIAL_TOKENS) + MIN_RESERVED, VOCAB_MULTIPLE)
    names = SPECIAL_TOKENS + [f"[RESERVED_{i}]" for i in range(n_vocab - first - len(SPECIAL_TOKENS))]
    specials = {**base_specials, **{s: first + i for i, s in enumerate(names)}}
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)


def train_tokenizer(texts, vocab_size=32768, pattern=SPLIT_PATTERN):
    """Byte-level BPE trained by rustbpe on an iterable of str -> tiktoken.Encoding.

    vocab_size is rounded up to a multiple of 64; 256 byte tokens + merges + 8 specials/reserved fill it.
    A corpus too small for that many merges gives fewer merges and n_vocab = the next multiple of 64."""
    import rustbpe  # training only; encoding needs tiktoken alone
    n_special = len(SPECIAL_TOKENS) + MIN_RESERVED
    if vocab_size < 256 + n_special:
        raise ValueError(f"vocab_size {vocab_size} is too small: 256 byte tokens + {n_special} specials at least")
    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(iter(texts), round_up(vocab_size, VOCAB_MULTIPLE) - n_special, pattern=pattern)
    ranks = {bytes(b): rank for b, rank in bpe.get_mergeable_ranks()}  # rank == token id == merge priority
    return _with_specials("growcram", bpe.get_pattern(), ranks)


def stock_tokenizer(name):
    """A stock tiktoken encoding ('gpt2', 'cl100k_base') plus our specials. Needs its ranks cached in
    $TIKTOKEN_CACHE_DIR or a network connection; otherwise a one-line ValueError."""
    try:
        base = tiktoken.get_encoding(name)
    except Exception as e:
        raise ValueError(f"tokenizer '{name}': ranks not in $TIKTOKEN_CACHE_DIR and not downloadable "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                         f"use --tokenizer train or a tokenizer.json path") from None
    ranks = {b: base.encode_single_token(b) for b in base.token_byte_values()}
    specials = {s: base.encode_single_token(s) for s in base.special_tokens_set}
    return _with_specials(f"{name}+growcram", base._pat_str, ranks, specials)


def special_ids(enc):
    """{"pad", "cls", "sep", "mask"} -> token id. Insert specials by id; encode_ordinary never emits them."""
    return {s.strip("[]").lower(): enc.encode_single_token(s) for s in SPECIAL_TOKENS}


def n_ordinary(enc):
    """Ids below this are ordinary (byte/merge) tokens; ids at or above it are special."""
    return min(enc.encode_single_token(s) for s in enc.special_tokens_set)


def save_tokenizer(enc, path):
    """Plain JSON (no pickle): format/version, name, split pattern, base64 tokens in rank order, specials."""
    ranks = {b: enc.encode_single_token(b) for b in enc.token_byte_values()}
    by_rank = sorted(ranks, key=ranks.get)
    if [ranks[b] for b in by_rank] != list(range(len(by_rank))):
        raise ValueError(f"{path}: cannot save a tokenizer whose ranks are not 0..{len(by_rank) - 1}")
    doc = {"format": TOKENIZER_FORMAT, "version": TOKENIZER_VERSION, "name": enc.name, "pattern": enc._pat_str,
           "n_vocab": enc.n_vocab, "special_tokens": {s: enc.encode_single_token(s) for s in
                                                      sorted(enc.special_tokens_set, key=enc.encode_single_token)},
           "ranks": [base64.b64encode(b).decode("ascii") for b in by_rank]}
    atomic_write(path, lambda f: f.write(json.dumps(doc, indent=1).encode("utf-8")))


def load_tokenizer(path):
    """tokenizer.json -> tiktoken.Encoding; a one-line ValueError names the file on any problem."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        raise ValueError(f"tokenizer file not found: {path}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a tokenizer file (invalid JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != TOKENIZER_FORMAT:
        raise ValueError(f"{path}: not a growcram tokenizer file (format field is not '{TOKENIZER_FORMAT}')")
    if doc.get("version") != TOKENIZER_VERSION:
        raise ValueError(f"{path}: tokenizer format version {doc.get('version')}, this data.py reads version "
                         f"{TOKENIZER_VERSION}; re-create it with `python data.py`")
    try:
        ranks = {base64.b64decode(t, validate=True): i for i, t in enumerate(doc["ranks"])}
        enc = tiktoken.Encoding(doc["name"], pat_str=doc["pattern"], mergeable_ranks=ranks,
                                special_tokens={s: int(i) for s, i in doc["special_tokens"].items()})
    except Exception as e:
        raise ValueError(f"{path}: corrupt tokenizer file ({type(e).__name__}: {e})") from None
    if enc.n_vocab != doc.get("n_vocab") or any(s not in enc.special_tokens_set for s in SPECIAL_TOKENS):
        raise ValueError(f"{path}: corrupt tokenizer file (n_vocab or special tokens do not match)")
    return enc


# ----------------------------------------------------------------------------------------------------------
# Token shards: SHARD_HEADER (32 bytes) then `count` little-endian uint16 or uint32 tokens

def _close_shard(sp, itemsize):
    """Write the real header over the placeholder and close the split's open shard."""
    sp["f"].seek(0)
    sp["f"].write(SHARD_HEADER.pack(SHARD_MAGIC, SHARD_VERSION, itemsize, sp["n"]))
    sp["f"].close()
    sp["f"] = None


def write_shard(path, tokens, itemsize=2):
    """Write one shard atomically (tests and tools; prepare_data streams its shards instead)."""
    tokens = np.asarray(tokens, dtype=f"<u{itemsize}")
    atomic_write(path, lambda f: f.write(SHARD_HEADER.pack(SHARD_MAGIC, SHARD_VERSION, itemsize, tokens.size)
                                         + tokens.tobytes()))


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
        raise ValueError(f"{path}: unsupported shard (version {version}, {itemsize} bytes per token)")
    if size != SHARD_HEADER.size + count * itemsize:
        raise ValueError(f"{path}: truncated or corrupt shard ({size} bytes, header says {count} tokens)")
    if count == 0:
        return np.zeros(0, dtype=f"<u{itemsize}")
    return np.memmap(path, dtype=f"<u{itemsize}", mode="r", offset=SHARD_HEADER.size, shape=(count,))


# ----------------------------------------------------------------------------------------------------------
# prepare_data: sources -> cleaning -> tokenizer -> shards, cached by settings

_WORKER = {}


def _init_worker(tokenizer_path, clean_kwargs, threads):
    _WORKER.update(enc=load_tokenizer(tokenizer_path), clean=clean_kwargs, threads=threads)


def _encode_docs(docs):
    """Worker: clean + encode documents -> [(digest, raw bytes, {step: bytes removed}, chars, words, ids)]."""
    enc, dtype = _WORKER["enc"], np.uint16 if _WORKER["enc"].n_vocab <= 1 << 16 else np.uint32
    cleaned = [clean_text(d, **_WORKER["clean"]) for d in docs]
    # whitespace-only documents count as empty: they encode to nothing and are dropped
    ids = enc.encode_ordinary_batch([t if t.strip() else "" for t, _ in cleaned], num_threads=_WORKER["threads"])
    return [(_digest(t), len(d.encode("utf-8")), rm, len(t), len(t.split()), np.array(i, dtype=dtype))
            for d, (t, rm), i in zip(docs, cleaned, ids)]


def _chunks(files, chunk_chars=1 << 20):
    chunk, n = [], 0
    for path in files:
        for doc in iter_documents(path):
            chunk.append(doc)
            n += len(doc)
            if n >= chunk_chars:
                yield chunk
                chunk, n = [], 0
    if chunk:
        yield chunk


def _encoded(files, workers, init_args):
    """Yield per-document results in corpus order. At most 2 chunks per worker are in flight: Pool.imap would
    read the whole corpus into its task queue, the RAM blow-up this design avoids."""
    if workers <= 1:
        _init_worker(*init_args)
        for chunk in _chunks(files):
            yield from _encode_docs(chunk)
        return
    # spawn: safe on every OS and after rustbpe/torch have started threads in this process
    with multiprocessing.get_context("spawn").Pool(workers, _init_worker, init_args[:2] + (1,)) as pool:
        pending = collections.deque()
        for chunk in _chunks(files):
            pending.append(pool.apply_async(_encode_docs, (chunk,)))
            if len(pending) >= 2 * workers:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


def _training_texts(files, clean_kwargs, max_chars):
    """The cleaned, deduplicated corpus prefix the tokenizer is trained on (at most max_chars characters)."""
    seen = set()
    for path in files:
        for doc in iter_documents(path):
            text, _ = clean_text(doc, **clean_kwargs)
            digest = _digest(text)
            if not text.strip() or digest in seen:
                continue
            seen.add(digest)
            yield text[:max_chars]
            max_chars -= len(text)
            if max_chars <= 0:
                return


def _resolve(data, cache_dir, fineweb_shards, max_tokens, fineweb_url, progress, fineweb2_url=FINEWEB2_URL):
    """data (one source) -> (short name, corpus files, identity for the cache key). Downloads are sized by
    max_tokens (training tokens wanted from this source), when given."""
    if data.startswith("fineweb2:"):
        lang = data.split(":", 1)[1]
        if not FINEWEB2_LANG.fullmatch(lang):
            raise ValueError(f"--data {data}: FineWeb-2 names a language as lang_Script, e.g. fineweb2:fra_Latn "
                             "(an ISO 639-3 code and an ISO 15924 script)")
        chars = max_tokens * FINEWEB2_CHARS_PER_TOKEN if max_tokens else FINEWEB2_DEFAULT_CHARS
        files = download_fineweb2(lang, os.path.join(cache_dir, "fineweb2", lang), chars, fineweb2_url,
                                  progress=progress)
        return lang, files, [fineweb2_url, lang, [os.path.basename(f) for f in files]]
    if data == "sample":
        return "sample", [SAMPLE_CORPUS], [os.path.basename(SAMPLE_CORPUS), os.path.getsize(SAMPLE_CORPUS)]
    if data == "fineweb":
        n = fineweb_shards or (shards_for_tokens(max_tokens) if max_tokens else 1)
        files = download_fineweb(n, os.path.join(cache_dir, "fineweb"), fineweb_url, progress=progress)
        return "fineweb", files, [fineweb_url, [os.path.basename(f) for f in files]]
    files = list_files(data)
    name = os.path.basename(os.path.normpath(data)).split(".")[0] or "data"
    return name, files, [[f, os.path.getsize(f), os.stat(f).st_mtime_ns] for f in files]


def prepare_data(data="sample", cache_dir="cache", vocab_size=32768, tokenizer="train", normalize="NFC",
                 lowercase=False, strip_accents=False, dedup=True, max_tokens_per_char=None, val_fraction=0.05,
                 max_val_tokens=10_000_000, tokenizer_chars=TOKENIZER_CHARS, fineweb_shards=None, max_tokens=None,
                 fineweb_url=FINEWEB_URL, workers=None, shard_tokens=SHARD_TOKENS, progress=True,
                 mix_temperature=None, fineweb2_url=FINEWEB2_URL):
    """Everything train.py needs, as a plain dict (also saved as <cache_dir>/<name>-<key>/meta.json).

    data: "sample" (bundled), "fineweb" (download fineweb_shards shards, or enough for max_tokens tokens,
    default 1; max_tokens sizes only the download), "fineweb2:LANG" (FineWeb-2 row groups for max_tokens), a
    file/folder path, or a mixture of these, "a:0.7,b:0.3" or weighted by mix_temperature (parse_mixture,
    _prepare_mixture). tokenizer: "train" (rustbpe on the first tokenizer_chars characters), "gpt2"/"cl100k_base"
    (stock tiktoken + our specials) or a tokenizer.json path. The val split stops growing at max_val_tokens.
    The result is cached under a key of all settings and the files' sizes and mtimes: the same settings again
    return it ("reused": True). The folder appears by one atomic rename, so a failed run leaves no partial shard
    or tokenizer."""
    _check_settings(cache_dir, vocab_size, val_fraction, max_val_tokens, tokenizer_chars, fineweb_shards, max_tokens,
                    max_tokens_per_char, workers, mix_temperature)
    mixture = parse_mixture(data, mix_temperature)
    clean_kwargs = dict(normalize=normalize, lowercase=lowercase, strip_accents=strip_accents)
    tok_id = tokenizer if tokenizer in ("train", "gpt2", "cl100k_base") else \
        [os.path.abspath(tokenizer), os.path.getsize(tokenizer) if os.path.exists(tokenizer) else -1]
    common = dict(vocab_size=vocab_size, tokenizer=tok_id, clean=clean_kwargs, dedup=dedup,
                  max_tokens_per_char=max_tokens_per_char, val_fraction=val_fraction, max_val_tokens=max_val_tokens,
                  tokenizer_chars=tokenizer_chars, shard_tokens=shard_tokens)
    resolve = lambda source, tokens: _resolve(source, cache_dir, fineweb_shards, tokens, fineweb_url,  # noqa: E731
                                              progress, fineweb2_url)
    if len(mixture) > 1:
        return _prepare_mixture(mixture, mix_temperature, cache_dir, common, resolve, max_tokens, tokenizer,
                                workers, progress)
    name, files, identity = resolve(mixture[0]["source"], max_tokens)
    settings = dict(version=PREPARE_VERSION, source=identity, **common)
    return _build_once(_cache_folder(cache_dir, name, settings),
                       lambda tmp: _prepare_into(tmp, files, data, settings, tokenizer, workers, progress))


def _cache_folder(cache_dir, name, settings):
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(cache_dir, f"{name}-{key}")


def _build_once(out, build):
    """out's prepared data if it exists ("reused"), else build(tmp) into OUT.<pid>.tmp, renamed to out at the end."""
    if os.path.exists(os.path.join(out, "meta.json")):
        return {**load_meta(out), "reused": True}
    _remove_stale_temps(out)
    tmp = f"{out}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        build(tmp)
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished the same preparation first: use its result
            if not os.path.exists(os.path.join(out, "meta.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**load_meta(out), "reused": False}


def _check_settings(cache_dir, vocab_size, val_fraction, max_val_tokens, tokenizer_chars, fineweb_shards,
                    max_tokens, max_tokens_per_char, workers, mix_temperature=None):
    """One-line errors (ValueError) for settings that would prepare nothing useful, before any work."""
    rules = [("vocab_size", vocab_size, vocab_size >= 64, ">= 64"),
             ("val_fraction", val_fraction, 0 < val_fraction <= 0.5, "in (0, 0.5]: training needs a held-out split"),
             ("max_val_tokens", max_val_tokens, max_val_tokens >= 1, ">= 1"),
             ("tokenizer_chars", tokenizer_chars, tokenizer_chars >= 1, ">= 1"),
             ("fineweb_shards", fineweb_shards, fineweb_shards is None or fineweb_shards >= 1, ">= 1"),
             ("max_tokens", max_tokens, max_tokens is None or max_tokens > 0, "> 0"),
             ("max_tokens_per_char", max_tokens_per_char, max_tokens_per_char is None or max_tokens_per_char > 0, "> 0"),
             ("workers", workers, workers is None or workers >= 1, ">= 1"),
             ("mix_temperature", mix_temperature,
              mix_temperature is None or (math.isfinite(mix_temperature) and mix_temperature > 0), "> 0")]
    for name, value, ok, rule in rules:
        if not ok:
            raise ValueError(f"--{name.replace('_', '-')} must be {rule} (got {value!r})")
    if os.path.isfile(cache_dir):
        raise ValueError(f"{cache_dir} is a file; the cache must be a folder")


def _remove_stale_temps(out):
    """Delete OUT.<pid>.tmp folders left by preparations that were killed (their process is gone)."""
    folder, prefix = os.path.dirname(out) or ".", os.path.basename(out) + "."
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        pid = name[len(prefix):-len(".tmp")]
        if name.startswith(prefix) and name.endswith(".tmp") and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


@contextlib.contextmanager
def exit_cleanly_on_sigterm(cache_dir, message):
    """While preparing: SIGTERM removes this process's temporary folders in cache_dir, prints message and exits 1.
    (An exception raised from the handler could surface inside the tokenizer's native code; exiting cannot.)"""
    def stop(signum, frame):
        suffix = f".{os.getpid()}.tmp"
        for name in os.listdir(cache_dir) if os.path.isdir(cache_dir) else ():
            if name.endswith(suffix):
                shutil.rmtree(os.path.join(cache_dir, name), ignore_errors=True)
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        os._exit(1)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _prepare_into(tmp, files, data, settings, tokenizer, workers, progress):
    """Tokenizer + shards + meta.json into the folder tmp."""
    enc = _make_tokenizer(_training_texts(files, settings["clean"], settings["tokenizer_chars"]), settings, tokenizer)
    save_tokenizer(enc, os.path.join(tmp, "tokenizer.json"))
    itemsize = 2 if enc.n_vocab <= 1 << 16 else 4
    splits, report = _write_shards(tmp, files, special_ids(enc)["sep"], itemsize, settings, workers, progress)
    _check_kept(data, splits, report)
    meta = _meta(settings, enc, itemsize, report, splits)
    atomic_write(os.path.join(tmp, "meta.json"), lambda f: f.write(json.dumps(meta, indent=1).encode()))


def _make_tokenizer(texts, settings, tokenizer):
    """The tokenizer: trained on texts (an iterable of str, read only here) or a stock or saved one."""
    if tokenizer != "train":
        return stock_tokenizer(tokenizer) if tokenizer in ("gpt2", "cl100k_base") else load_tokenizer(tokenizer)
    enc = train_tokenizer(texts, settings["vocab_size"])
    if enc.n_vocab < round_up(settings["vocab_size"], VOCAB_MULTIPLE):
        print(f"note: the tokenizer learned {enc.n_vocab} tokens, fewer than the {settings['vocab_size']} asked "
              f"for: {settings['tokenizer_chars']:,} characters of this corpus hold no more merges (raise "
              "--tokenizer-chars, or give a bigger corpus)", file=sys.stderr)
    return enc


def _check_kept(data, splits, report):
    if report["documents_in"] == 0:
        raise ValueError(f"{data}: no documents found (empty corpus)")
    if splits["train"]["tokens"] == 0:
        raise ValueError(f"{data}: no training documents left after cleaning ({report['documents_out']} kept of "
                         f"{report['documents_in']}; a train/val split needs at least 2)")


def _meta(settings, enc, itemsize, report, splits):
    """meta.json's fields (paths relative to the folder; load_meta makes them absolute)."""
    return {"settings": settings, "tokenizer": "tokenizer.json", "n_vocab": enc.n_vocab,
            "n_ordinary": n_ordinary(enc), "special_ids": special_ids(enc), "itemsize": itemsize, "report": report,
            **{s: sp["files"] for s, sp in splits.items()},
            **{f"{s}_tokens": sp["tokens"] for s, sp in splits.items()},
            **{f"{s}_documents": sp["documents"] for s, sp in splits.items()}}


def _write_shards(tmp, files, sep, itemsize, settings, workers, progress, prefix=""):
    """Stream the corpus through the workers; drop empty, duplicate and incompressible documents; append the
    rest (each followed by [SEP]) to train_00000.bin ... / val_00000.bin ... (after prefix, a mixture's source
    folder). Returns (splits, report); the report also counts the kept documents' whitespace words."""
    report = {"documents_in": 0, "bytes_in": 0, "documents_out": 0, "bytes_out": 0, "words_out": 0, "invalid_utf8": {},
              "removed": {s: {"documents": 0, "bytes": 0} for s in
                          ("normalize", "lowercase", "strip_accents", "empty", "duplicate", "compressibility")}}
    splits = {s: {"files": [], "tokens": 0, "documents": 0, "f": None, "n": 0} for s in ("train", "val")}
    val_every = round(1 / settings["val_fraction"]) if settings["val_fraction"] > 0 else 0
    max_tpc, seen, sep = settings["max_tokens_per_char"], set(), np.array([sep], dtype=f"<u{itemsize}").tobytes()
    _UTF8["replaced"].clear()
    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    init_args = (os.path.join(tmp, "tokenizer.json"), settings["clean"], os.cpu_count() or 1)
    try:
        for digest, nbytes, removed, nchars, nwords, toks in tqdm(_encoded(files, workers, init_args),
                                                                  desc="tokenizing", unit="doc", disable=not progress):
            kept = nbytes - sum(removed.values())  # UTF-8 bytes left after cleaning
            report["documents_in"] += 1
            report["bytes_in"] += nbytes
            for step, n in removed.items():
                report["removed"][step]["bytes"] += n
            drop = "empty" if toks.size == 0 else "duplicate" if settings["dedup"] and digest in seen else \
                "compressibility" if max_tpc and toks.size > max_tpc * nchars else None
            if settings["dedup"]:
                seen.add(digest)  # 8-byte digests: ~100 bytes of RAM per document
            if drop:
                report["removed"][drop]["documents"] += 1
                report["removed"][drop]["bytes"] += kept
                continue
            to_val = val_every and report["documents_out"] % val_every == 0 and \
                splits["val"]["tokens"] < settings["max_val_tokens"]
            split = "val" if to_val else "train"
            sp = splits[split]
            report["documents_out"] += 1
            report["bytes_out"] += kept
            report["words_out"] += nwords
            if sp["f"] is None:  # start a new shard file, header zeroed until the count is known
                sp["files"].append(f"{prefix}{split}_{len(sp['files']):05d}.bin")
                sp["f"], sp["n"] = open(os.path.join(tmp, sp["files"][-1]), "wb"), 0
                sp["f"].write(bytes(SHARD_HEADER.size))
            sp["f"].write(toks.astype(f"<u{itemsize}", copy=False).tobytes() + sep)
            sp["n"] += toks.size + 1
            sp["tokens"] += toks.size + 1
            sp["documents"] += 1
            if sp["n"] >= settings["shard_tokens"]:
                _close_shard(sp, itemsize)
        for sp in splits.values():
            if sp["f"] is not None:
                _close_shard(sp, itemsize)
    finally:  # on error: close what is open; prepare_data deletes the whole folder
        for sp in splits.values():
            if sp["f"] is not None:
                sp["f"].close()
    report["invalid_utf8"] = dict(_UTF8["replaced"])
    return splits, report


def load_meta(path):
    """A prepared folder (or its meta.json) -> the dict prepare_data returns, with absolute paths."""
    folder = os.path.dirname(path) if path.endswith(".json") else path
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{os.path.join(folder, 'meta.json')}: cannot read prepared data ({e})") from None
    join = lambda p: os.path.join(os.path.abspath(folder), p)
    splits = lambda d: {"train": [join(p) for p in d["train"]], "val": [join(p) for p in d["val"]]}  # noqa: E731
    if "sources" in meta:  # a mixture: every source's shards too
        meta["sources"] = [{**s, **splits(s)} for s in meta["sources"]]
    return {**meta, "dir": os.path.abspath(folder), "tokenizer": join(meta["tokenizer"]), **splits(meta)}


# ----------------------------------------------------------------------------------------------------------
# Mixtures: several sources, each with its weight, one tokenizer, each source's own shards and val split

def parse_mixture(data, temperature=None):
    """--data -> [{"source", "weight"}]: one entry for a single source (today's path), several for a mixture
    "a:0.6,b:0.4", with weights normalized to sum 1. The weight follows an entry's last ':' when it is a number,
    so "fineweb2:fra_Latn:0.3" is the source fineweb2:fra_Latn at 0.3. Weights are all given or none: none means
    by size, with --mix-temperature (temperature_weights, once the sizes are known: weight None here). An
    existing path is one source, commas or not. A malformed string is a one-line ValueError naming --data."""
    if data in ("sample", "fineweb") or os.path.exists(data):
        return [{"source": data, "weight": None}]
    entries = []
    for i, entry in enumerate(data.split(","), 1):
        entry = entry.strip()
        source, colon, tail = entry.rpartition(":")
        weight = _number(tail)
        if weight is None:
            source = entry
        if colon and not tail:
            raise ValueError(f"--data {data!r}: entry {i} ({entry!r}) ends in ':' without a weight")
        if not source:
            raise ValueError(f"--data {data!r}: entry {i} has no source (expected SOURCE or SOURCE:WEIGHT, "
                             "separated by commas)")
        if weight is not None and not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"--data {data!r}: the weight of {source} must be a positive number (got {tail})")
        entries.append({"source": source, "weight": weight})
    names = [e["source"] for e in entries]
    twice = next((n for n in names if names.count(n) > 1), None)
    given = [e["weight"] is not None for e in entries]
    if twice:
        raise ValueError(f"--data {data!r}: {twice} appears twice; give each source once, with its whole weight")
    if len(entries) > 1 and any(given) and not all(given):
        raise ValueError(f"--data {data!r}: give every source a weight or none of them "
                         f"({names[given.index(False)]} has none)")
    if len(entries) > 1 and all(given) and temperature is not None:
        raise ValueError(f"--data {data!r}: the sources have weights, so --mix-temperature would set nothing; "
                         "give weights or --mix-temperature, not both")
    if len(entries) > 1 and not any(given) and temperature is None:
        raise ValueError(f"--data {data!r}: {len(entries)} sources without weights; write SOURCE:WEIGHT for each, "
                         "or give --mix-temperature T to weight them by size")
    if all(given):
        total = sum(e["weight"] for e in entries)
        entries = [{**e, "weight": e["weight"] / total} for e in entries]
    return entries


def downloads(data):
    """Whether --data downloads (fineweb or fineweb2:LANG, alone or in a mixture): a token budget then sizes it."""
    return any(entry.strip().split(":")[0] in ("fineweb", "fineweb2") for entry in data.split(","))


def _number(text):
    try:
        return float(text)
    except ValueError:
        return None


def temperature_weights(sizes, temperature):
    """Sampling weights q_i = p_i^a / sum_j p_j^a with a = 1/T and p_i = size_i / sum of sizes: XLM's language
    sampling (Lample & Conneau 2019; XLM-R, Conneau et al. 2020, used a = 0.3). T = 1 samples by size; a larger
    T is flatter (T -> infinity: uniform), giving small languages more of the stream than their size."""
    p = np.asarray(sizes, dtype=np.float64)
    p = p / p.sum()
    q = p ** (1.0 / temperature)
    return (q / q.sum()).tolist()


def _prepare_mixture(mixture, temperature, cache_dir, common, resolve, max_tokens, tokenizer, workers, progress):
    """prepare_data for a mixture: resolve every source (a download sized by its weight of max_tokens), then one
    cached folder keyed by all sources and weights (_prepare_mixture_into)."""
    sources = []
    for entry in mixture:
        share = entry["weight"] if entry["weight"] is not None else 1.0  # by size: the whole budget, at most
        name, files, identity = resolve(entry["source"], max_tokens * share if max_tokens else None)
        sources.append({"name": name, "source": entry["source"], "weight": entry["weight"], "files": files,
                        "identity": identity})
    names = [s["name"] for s in sources]
    for i, s in enumerate(sources):  # two folders both named data/ become data-1 and data-2
        if names.count(s["name"]) > 1:
            s["name"] = f"{s['name']}-{names[:i + 1].count(s['name'])}"
    if temperature is not None and any(downloads(s["source"]) for s in sources):
        print("note: --mix-temperature weights the sources by their size here, and a download's size is what the "
              "budget fetched, not the language's; give fineweb sources weights instead", file=sys.stderr)
    settings = dict(version=PREPARE_VERSION, mixture=[[s["identity"], s["weight"]] for s in sources],
                    mix_temperature=temperature, **common)
    out = _cache_folder(cache_dir, "+".join(s["name"] for s in sources)[:60], settings)
    return _build_once(out, lambda tmp: _prepare_mixture_into(tmp, sources, settings, tokenizer, workers, progress))


def _prepare_mixture_into(tmp, sources, settings, tokenizer, workers, progress):
    """A mixture's tokenizer, each source's shards in tmp/<name>/ (its own val split: whole documents, as for
    one corpus) and meta.json: the totals of one corpus plus "sources", one entry per source (_source_entry)."""
    sizes = [_source_chars(s["files"]) for s in sources]
    for s, size in zip(sources, sizes):
        if size == 0:
            raise ValueError(f"{s['source']}: no documents found (empty corpus)")
    weights = [s["weight"] for s in sources] if sources[0]["weight"] is not None else \
        temperature_weights(sizes, settings["mix_temperature"])
    texts = _mixture_training_texts(sources, weights, sizes, settings["clean"], settings["tokenizer_chars"])
    enc = _make_tokenizer(texts, settings, tokenizer)
    save_tokenizer(enc, os.path.join(tmp, "tokenizer.json"))
    itemsize = 2 if enc.n_vocab <= 1 << 16 else 4
    entries, reports = [], []
    for s, weight, size in zip(sources, weights, sizes):
        os.makedirs(os.path.join(tmp, s["name"]))
        splits, report = _write_shards(tmp, s["files"], special_ids(enc)["sep"], itemsize, settings, workers,
                                       progress, prefix=s["name"] + "/")
        _check_kept(s["source"], splits, report)
        entries.append(_source_entry(s, weight, size, splits, report))
        reports.append(report)
    total = {split: {"files": [f for e in entries for f in e[split]],
                     "tokens": sum(e[f"{split}_tokens"] for e in entries),
                     "documents": sum(e[f"{split}_documents"] for e in entries)} for split in ("train", "val")}
    meta = {**_meta(settings, enc, itemsize, _sum_reports(reports), total), "sources": entries}
    atomic_write(os.path.join(tmp, "meta.json"), lambda f: f.write(json.dumps(meta, indent=1).encode()))


def _source_chars(files):
    """A source's size for temperature sampling and the tokenizer's sample: characters of its documents."""
    return sum(len(doc) for path in files for doc in iter_documents(path))


def _mixture_training_texts(sources, weights, sizes, clean_kwargs, max_chars):
    """The tokenizer's training sample of a mixture: min(max_chars, all characters) characters, the share
    weight_i of them from source i (its cleaned, deduplicated documents, cycled when its share is larger than
    the source). The merges then follow the mixture's proportions, so a small language is not starved of merges
    (XLM learns its BPE on sentences sampled with its language sampling, Lample & Conneau 2019)."""
    total = min(max_chars, sum(sizes))
    for s, weight in zip(sources, weights):
        quota = round(weight * total)
        while quota > 0:
            before = quota
            for text in _training_texts(s["files"], clean_kwargs, quota):
                quota -= len(text)
                yield text
            if quota == before:  # nothing left after cleaning: the shard writer reports it
                break


def _source_entry(source, weight, chars, splits, report):
    """meta["sources"][i]: what the loader needs (name, weight, files) and the source's summary. bytes_per_token
    and tokens_per_word (fertility: tokens per whitespace-separated word) count the documents' text, not the
    [SEP] after each; a language the tokenizer over-segments shows a high fertility."""
    both = lambda key: splits["train"][key] + splits["val"][key]  # noqa: E731
    bytes_per_token, tokens_per_word = text_ratios(report, both("tokens"), both("documents"))
    return {"name": source["name"], "source": source["source"], "weight": weight, "chars": chars,
            "train": splits["train"]["files"], "val": splits["val"]["files"],
            **{f"{s}_{k}": splits[s][k] for s in ("train", "val") for k in ("tokens", "documents")},
            "words": report["words_out"], "bytes_per_token": bytes_per_token, "tokens_per_word": tokens_per_word,
            "report": report}


def text_ratios(report, tokens, documents):
    """(bytes per token, tokens per whitespace word) of the kept documents' text, rounded to 4 digits: the
    [SEP] after each document is not text, so it is not counted."""
    text_tokens = tokens - documents
    return (round(report["bytes_out"] / max(1, text_tokens), 4),
            round(text_tokens / max(1, report["words_out"]), 4))


def _sum_reports(reports):
    """The cleaning reports of several sources added up, as one corpus's report."""
    total = {k: sum(r[k] for r in reports) for k in ("documents_in", "bytes_in", "documents_out", "bytes_out",
                                                     "words_out")}
    total["invalid_utf8"] = {path: n for r in reports for path, n in r["invalid_utf8"].items()}
    total["removed"] = {step: {k: sum(r["removed"][step][k] for r in reports) for k in ("documents", "bytes")}
                        for step in reports[0]["removed"]}
    return total


# ----------------------------------------------------------------------------------------------------------
# Batches: a counter-based hash makes every random choice a pure function of (seed, purpose, stream position)

_U64 = (1 << 64) - 1


def _mix_int(x):  # splitmix64 finalizer on a Python int
    x = (x + 0x9E3779B97F4A7C15) & _U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def hash64(seed, salt, positions):
    """uint64 pseudo-random numbers, one per int64 position: splitmix64 of (key(seed, salt) + position * gamma).
    No generator state, so any batch can be recomputed from its stream position alone."""
    x = positions.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(_mix_int(_mix_int(seed) ^ salt))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class Loader:
    """Endless, deterministic, rank-sharded batches from one split's shards.

    The split's tokens (documents followed by [SEP]) form a stream of n_tokens per epoch; epoch e reads them in
    blocks of block_tokens permuted by hash64(seed, e) (the val split is read in order). `position` counts
    stream tokens consumed by all ranks. A call next_batch(B, T) builds world_size * B windows back to back
    from `position`; rank r takes windows r*B .. r*B+B-1, and position advances past all of them. Hence ranks
    never overlap, and their batches concatenated in rank order equal the batch one rank would draw with
    batch size world_size * B, masks included. B and T may change from call to call.
      MLM: window = T-2 stream tokens, input_ids = [CLS] window [SEP] (B, T). k masked positions per sequence,
        chosen uniformly among non-special tokens: label_positions (B, k) ascending positions into T, labels
        (B, k) the original ids (-100 where a sequence has fewer than k maskable tokens).
      CLM: window = T+1 stream tokens (windows overlap by one), input_ids = window[:-1], labels = window[1:].
    The state holds the global position and seed; a run resumed with another world_size continues the same
    global stream. The stream is cut at block and epoch boundaries without a [SEP]; with 8192-token blocks that
    touches about T/8192 of the windows."""

    def __init__(self, shards, n_ordinary, special, objective="mlm", seed=0, rank=0, world_size=1,
                 mask_rate=0.25, device="cpu", shuffle=True, block_tokens=BLOCK_TOKENS, prefetch=None):
        if objective not in ("mlm", "clm"):
            raise ValueError(f"objective must be 'mlm' or 'clm', got {objective!r}")
        if not 0 < mask_rate < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 < mask_rate < 1 and 0 <= rank < world_size "
                             f"(got {mask_rate}, {rank}, {world_size})")
        self.shards = [np.asarray(read_shard(p)) for p in shards]  # plain views: memmap indexing costs more
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])  # shard i holds stream ids starts[i]..
        self.n_tokens = int(self.starts[-1])
        if self.n_tokens == 0:
            raise ValueError(f"no tokens in shards {shards}")
        self.n_ordinary, self.special, self.objective, self.seed = n_ordinary, special, objective, seed
        self.rank, self.world_size, self.mask_rate, self.device = rank, world_size, mask_rate, torch.device(device)
        self.shuffle, self.block = shuffle, block_tokens
        # prefetch pays off on CUDA, where the main thread waits for the GPU; on CPU the thread only competes
        # for the GIL and the cores (bench/bench_data.py measures both)
        self.prefetch = self.device.type == "cuda" if prefetch is None else prefetch
        self.position, self.batches, self._perms, self._ahead, self._pool = 0, 0, {}, None, None

    def state_dict(self):
        return {"position": self.position, "epoch": self.position // self.n_tokens, "batches": self.batches,
                "seed": self.seed, "n_tokens": self.n_tokens}

    def load_state_dict(self, state):
        if "sources" in state:
            raise ValueError("loader state is for a corpus mixture, this loader reads one corpus")
        if state["n_tokens"] != self.n_tokens:
            raise ValueError(f"loader state is for a split of {state['n_tokens']} tokens, this one has {self.n_tokens}")
        self.position, self.batches, self.seed = int(state["position"]), int(state["batches"]), int(state["seed"])
        self._ahead, self._perms = None, {}

    def _perm(self, epoch):
        """Block order of one epoch: full blocks shuffled by hash, the last partial block kept at the end."""
        perm = self._perms.get(epoch)
        if perm is None:
            if len(self._perms) > 4:  # a batch spans at most a few epochs; keep the cache small
                self._perms = {}
            n_full = self.n_tokens // self.block
            order = np.argsort(hash64(self.seed, 1000 + epoch, np.arange(n_full)), kind="stable")
            perm = self._perms[epoch] = np.append(order, n_full) if self.shuffle else np.arange(n_full + 1)
        return perm

    def _read(self, pos, shift=0, out=None):
        """(B, L) ascending stream positions, plus shift (where a mixture's run of blocks starts in this stream)
        -> (B, L) int64 tokens, written into out when given (a mixture's batch, one run of blocks at a time)."""
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
        src = block * self.block + offset
        out = np.empty(src.shape, dtype=np.int64) if out is None else out
        if len(self.shards) == 1:
            out[...] = self.shards[0][src]
            return out
        which = np.searchsorted(self.starts, src, side="right") - 1
        for i in np.unique(which):
            sel = which == i
            out[sel] = self.shards[i][src[sel] - self.starts[i]]
        return out

    def _mask(self, window, pos, T):
        """BERT masking of (B, T-2) windows -> the MLM batch (numpy)."""
        k = round(self.mask_rate * T)
        if not 1 <= k <= T - 2:
            raise ValueError(f"mask_rate {self.mask_rate} at seq_len {T} gives {k} masked positions (need 1..{T - 2})")
        score = hash64(self.seed, 1, pos)
        score[window >= self.n_ordinary] = np.iinfo(np.uint64).max  # specials are picked last, never masked
        pick = np.sort(np.argpartition(score, k - 1, axis=1)[:, :k], axis=1)  # (B, k) columns of the window
        orig, ppos = np.take_along_axis(window, pick, 1), np.take_along_axis(pos, pick, 1)
        maskable = orig < self.n_ordinary
        h = hash64(self.seed, 2, ppos)  # low 32 bits pick the action, high 32 bits the random token
        action = ((h & np.uint64(0xFFFFFFFF)) % np.uint64(10)).astype(np.int64)
        rand = ((h >> np.uint64(32)) % np.uint64(self.n_ordinary)).astype(np.int64)
        new = np.where(action < 8, self.special["mask"], np.where(action == 8, rand, orig))
        ids = np.empty((window.shape[0], T), dtype=np.int64)  # (B, T) = [CLS] window [SEP]
        ids[:, 0], ids[:, 1:-1], ids[:, -1] = self.special["cls"], window, self.special["sep"]
        np.put_along_axis(ids, pick + 1, np.where(maskable, new, orig), 1)
        return {"input_ids": ids, "labels": np.where(maskable, orig, -100), "label_positions": pick + 1}

    def _make(self, position, B, T):
        """The batch of this rank starting at stream `position`, as numpy arrays (pinned tensors on CUDA)."""
        mlm = self.objective == "mlm"
        stride = T - 2 if mlm else T
        if B < 1 or stride < 1:
            raise ValueError(f"need batch_size >= 1 and seq_len >= {3 if mlm else 1} (got {B}, {T})")
        starts = position + stride * (self.rank * B + np.arange(B))
        pos = starts[:, None] + np.arange(stride if mlm else T + 1)  # (B, L) stream positions
        window = self._read(pos)
        batch = self._mask(window, pos, T) if mlm else {"input_ids": window[:, :-1], "labels": window[:, 1:]}
        batch = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
        if self.device.type == "cuda":  # page-locked host memory lets the copy to the GPU run asynchronously
            batch = {k: v.pin_memory() for k, v in batch.items()}
        return batch

    def next_batch(self, batch_size, seq_len=128):
        """The next batch of this rank as a dict of int64 tensors on the loader's device (see class doc).
        With prefetch, a background thread builds the batch after it (same sizes) during the training step;
        since a batch is a pure function of its position, prefetching never changes what is returned."""
        key = (self.position, batch_size, seq_len)
        ahead, self._ahead = self._ahead, None
        batch = ahead[1].result() if ahead is not None and ahead[0] == key else self._make(*key)
        self.position += self.world_size * batch_size * (seq_len - 2 if self.objective == "mlm" else seq_len)
        self.batches += 1
        if self.prefetch:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="growcram-loader")
            nxt = (self.position, batch_size, seq_len)
            self._ahead = (nxt, self._pool.submit(self._make, *nxt))
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}


def mixture_pattern(weights, period=MIX_PERIOD):
    """The block order of a mixture, repeated every `period` blocks: (source of each block of the period, the
    block's rank among that source's blocks in the period, blocks per source in a period). Source s gets
    n_s = weight_s * period blocks (largest remainder, at least one), spread evenly like a smooth weighted round
    robin: its j-th block sits at time (j + 0.5) / n_s of the period. Any stretch of the stream then holds each
    source within about one block of its share, from the first batch on."""
    raw = np.asarray(weights, dtype=np.float64) * period
    n = np.maximum(1, np.floor(raw)).astype(np.int64)
    for _ in range(period - int(n.sum())):        # hand out the remainders, largest first
        n[np.argmax(raw - n)] += 1
    for _ in range(int(n.sum()) - period):        # tiny weights raised to one block: take it from the largest
        n[np.argmax(np.where(n > 1, n - raw, -np.inf))] -= 1
    source = np.repeat(np.arange(len(n)), n)
    rank = np.concatenate([np.arange(c) for c in n])
    order = np.argsort((rank + 0.5) / n[source], kind="stable")
    return source[order], rank[order], n


class MixtureLoader(Loader):
    """A Loader over a corpus mixture: several sources, each with its own shards and its weight.

    The global stream is cut into blocks of block_tokens. Block k belongs to source s = source[k % P] of
    mixture_pattern (P = MIX_PERIOD) and is that source's block j = (k // P) * n_s + rank[k % P], so finding
    where any position comes from is O(1). A source's blocks are read from its own stream, which is exactly a
    Loader's (its blocks shuffled per epoch, repeating forever): a source whose weight asks for more tokens than
    it holds is repeated, one that holds more is cut. Windows, rank sharding, MLM masks (hashed from the global
    position) and prefetch are the Loader's, so determinism, exact resume, a changed world size and the disjoint
    DDP shards hold as they do for one corpus. epochs() says how often each source has been read."""

    def __init__(self, sources, n_ordinary, special, objective="mlm", seed=0, rank=0, world_size=1, mask_rate=0.25,
                 device="cpu", shuffle=True, block_tokens=BLOCK_TOKENS, prefetch=None):
        # the Loader's checks and state, over all shards: n_tokens is the mixture's total
        super().__init__([f for s in sources for f in s["files"]], n_ordinary, special, objective, seed, rank,
                         world_size, mask_rate, device, shuffle, block_tokens, prefetch)
        self.names, self.weights = [s["name"] for s in sources], [s["weight"] for s in sources]
        self.parts = [Loader(s["files"], n_ordinary, special, objective, seed, 0, 1, mask_rate, "cpu", shuffle,
                             block_tokens, prefetch=False) for s in sources]  # only their _read is used
        # as Python lists: _read looks up a few blocks per batch, where numpy's per-call cost would dominate
        self.pattern, self.nth, self.n_blocks = (a.tolist() for a in mixture_pattern(self.weights))

    def state_dict(self):
        return {**super().state_dict(), "sources": [{"name": name, "weight": w, "n_tokens": part.n_tokens}
                                                    for name, w, part in zip(self.names, self.weights, self.parts)],
                "epochs": self.epochs()}

    def load_state_dict(self, state):
        mine = self.state_dict()["sources"]
        if state.get("sources") != mine:
            describe = lambda ss: ", ".join(f"{s['name']}:{s['weight']:.4g} ({s['n_tokens']} tokens)" for s in ss)
            raise ValueError(f"loader state is for {describe(state['sources']) if 'sources' in state else 'one corpus'}"
                             f", this mixture is {describe(mine)}")
        self.position, self.batches, self.seed = int(state["position"]), int(state["batches"]), int(state["seed"])
        for part in self.parts:
            part.seed, part._perms = self.seed, {}
        self._ahead = None

    def _read(self, pos):
        """(B, L) global stream positions -> (B, L) int64 tokens. Positions ascend through the batch, row after
        row, so a batch is a few runs of consecutive blocks of one source each (a batch spans a few blocks), and
        within a run a position in the source's stream is the global one plus a constant, which its _read adds."""
        flat, P = pos.reshape(-1), len(self.pattern)
        runs = []                                        # [source, shift, first global block] per run
        for k in range(int(flat[0]) // self.block, int(flat[-1]) // self.block + 1):
            s = self.pattern[k % P]
            if not runs or runs[-1][0] != s:             # a new run; its block k is the source's block j
                j = (k // P) * self.n_blocks[s] + self.nth[k % P]
                runs.append([s, (j - k) * self.block, k])
        if len(runs) == 1:                               # the usual case: the batch lies in one run
            return self.parts[runs[0][0]]._read(pos, runs[0][1])
        if int(flat[-1]) - int(flat[0]) == flat.size - 1:  # MLM windows lie back to back: positions are consecutive
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
        blocks = (k // P) * np.array(self.n_blocks) + np.bincount(self.pattern[:k % P], minlength=len(self.parts))
        drawn = blocks * self.block
        drawn[self.pattern[k % P]] += offset
        return dict(zip(self.names, drawn.tolist()))

    def epochs(self):
        """{source: passes over its tokens so far}: above 1 the source is being repeated."""
        return {name: round(n / part.n_tokens, 4) for (name, n), part in zip(self.tokens_drawn().items(), self.parts)}


def make_loader(meta, split="train", objective="mlm", seed=0, rank=None, world_size=None, mask_rate=0.25,
                device="cpu", shuffle=None, block_tokens=BLOCK_TOKENS, prefetch=None, source=None):
    """Loader over prepare_data's output (the dict, its folder or meta.json). rank/world_size default to
    torch.distributed's when it is initialized, else 0/1; shuffle defaults to True for train only; prefetch
    (a background thread building the next batch) defaults to True on CUDA only. A mixture gives a
    MixtureLoader over its sources' splits, or with source=NAME a Loader over that source's split alone."""
    meta = load_meta(meta) if isinstance(meta, str) else meta
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    sources = meta.get("sources")
    if source is not None:
        match = [s for s in sources or [] if s["name"] == source]
        if not match:
            raise ValueError(f"{meta['dir']}: no source named {source!r} (sources: "
                             f"{', '.join(s['name'] for s in sources or []) or 'none, one corpus'})")
        meta, sources = {**meta, split: match[0][split]}, None
    if not meta[split]:
        raise ValueError(f"{meta['dir']}: split '{split}' is empty (val_fraction 0?)")
    dist = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = rank if rank is not None else torch.distributed.get_rank() if dist else 0
    world_size = world_size if world_size is not None else torch.distributed.get_world_size() if dist else 1
    args = (meta["n_ordinary"], meta["special_ids"], objective, seed, rank, world_size, mask_rate, device,
            split == "train" if shuffle is None else shuffle, block_tokens, prefetch)
    if sources:
        return MixtureLoader([{"name": s["name"], "weight": s["weight"], "files": s[split]} for s in sources], *args)
    return Loader(meta[split], *args)


# ----------------------------------------------------------------------------------------------------------

# The two flags that name the data, shared with train.py's command line
DATA_HELP = ("'sample' (bundled Shakespeare), 'fineweb' (FineWeb-Edu download), 'fineweb2:LANG' (FineWeb-2 download, "
             "e.g. fineweb2:fra_Latn), a file/folder of .txt/.jsonl/.jsonl.gz/.parquet, or a mixture of these: "
             "'SOURCE:WEIGHT,SOURCE:WEIGHT,...' (docs/data.md: mixtures)")
MIX_TEMPERATURE_HELP = ("weight a mixture's sources by size^(1/T), size in characters (XLM's language sampling): "
                        "1 = by size, larger = flatter; the sources then take no weights")


def main(argv=None):
    p = argparse.ArgumentParser(prog="data.py", description="Prepare a corpus: clean, train a tokenizer, write token "
                                "shards.", usage="%(prog)s --data DATA [--out CACHE] [flags]  (--help lists them)")
    # Data
    p.add_argument("--data", default="sample", help=DATA_HELP)
    p.add_argument("--mix-temperature", type=float, default=None, metavar="T", help=MIX_TEMPERATURE_HELP)
    p.add_argument("--out", dest="cache_dir", metavar="OUT", default="cache",
                   help="cache folder; results land in OUT/<name>-<settings hash>/")
    p.add_argument("--fineweb-shards", type=int, default=None,
                   help="FineWeb-Edu shards to download (~55 M tokens each; default: from --max-tokens, else 1)")
    p.add_argument("--max-tokens", type=float, default=None, help="token budget; picks --fineweb-shards (tokens)")
    p.add_argument("--fineweb-url", default=FINEWEB_URL, help="base URL holding shard_00000.parquet, ...")
    p.add_argument("--fineweb2-url", default=FINEWEB2_URL, help="base URL holding data/<lang>/train/*.parquet")
    # Tokenizer
    p.add_argument("--tokenizer", default="train", help="'train' (rustbpe), 'gpt2', 'cl100k_base' or a tokenizer.json")
    p.add_argument("--vocab-size", type=int, default=32768, help="vocabulary size (tokens, rounded up to x64)")
    p.add_argument("--tokenizer-chars", type=int, default=TOKENIZER_CHARS, help="corpus characters to train on")
    # Cleaning
    p.add_argument("--normalize", default="NFC", type=lambda s: None if s.lower() == "none" else s,
                   help="Unicode normal form (NFC, NFKC, ...; 'none' = off)")
    p.add_argument("--lowercase", action="store_true", help="lowercase all text (cramming does; English-centric)")
    p.add_argument("--strip-accents", action="store_true",
                   help="drop combining accents (cramming does; English-centric: it merges distinct words elsewhere)")
    p.add_argument("--no-dedup", dest="dedup", action="store_false", help="keep exact duplicate documents")
    p.add_argument("--max-tokens-per-char", type=float, default=None,
                   help="drop documents above this tokens/character ratio (cramming: 0.25; default off)")
    p.add_argument("--val-fraction", type=float, default=0.05, help="fraction of documents for validation")
    p.add_argument("--max-val-tokens", type=int, default=10_000_000, help="cap on validation tokens")
    p.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: CPUs - 1)")
    args = p.parse_args(argv)
    try:
        with exit_cleanly_on_sigterm(args.cache_dir, "error: stopped by a signal; nothing was written (the cache "
                                     "keeps only finished entries)"):
            meta = prepare_data(**vars(args))  # each option's dest is a prepare_data parameter
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    r = meta["report"]
    print("---")
    print(f"folder:          {meta['dir']}{' (reused)' if meta['reused'] else ''}")
    print(f"tokenizer:       {meta['tokenizer']} (n_vocab {meta['n_vocab']})")
    print(f"documents:       {r['documents_in']:,} in, {r['documents_out']:,} kept "
          f"({meta['train_documents']:,} train / {meta['val_documents']:,} val)")
    for step, v in r["removed"].items():
        print(f"  {step + ':':16s} {v['documents']:,} documents, {v['bytes']:,} bytes removed")
    print(f"invalid UTF-8:   {sum(r['invalid_utf8'].values()):,} sequences replaced")
    print(f"tokens:          {meta['train_tokens']:,} train / {meta['val_tokens']:,} val "
          f"({r['bytes_out'] / max(1, meta['train_tokens'] + meta['val_tokens']):.2f} bytes/token)")
    if "words_out" in r:  # caches prepared before words were counted have no fertility
        _, tokens_per_word = text_ratios(r, meta["train_tokens"] + meta["val_tokens"],
                                         meta["train_documents"] + meta["val_documents"])
        print(f"fertility:       {tokens_per_word:.2f} tokens per whitespace word")
    for s in meta.get("sources", []):
        print(f"  {s['name'] + ':':16s} weight {s['weight']:.3f}, {s['train_tokens']:,} train / "
              f"{s['val_tokens']:,} val tokens, {s['bytes_per_token']:.2f} bytes/token, "
              f"{s['tokens_per_word']:.2f} tokens/word")
    print(f"summary json:    {os.path.join(meta['dir'], 'meta.json')}")
    return meta


if __name__ == "__main__":
    main()
