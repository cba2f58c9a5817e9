"""data.py: raw text -> cleaned documents -> a BPE tokenizer -> token shards, cached by settings.

    python data.py --data sample --out cache --vocab-size 8192   # bundled Shakespeare, offline
    python data.py --data my_corpus/ --out cache                  # .txt .jsonl .jsonl.gz .parquet
    python data.py --data fineweb --fineweb-shards 4 --out cache  # FineWeb-Edu shards over HTTPS
    python data.py --data "sample:0.7,fineweb2:fra_Latn:0.3"      # a mixture, weights given
    python data.py --data "sample,fr/" --mix-temperature 3.3      # weights from sizes, as XLM's

    meta = prepare_data("sample", "cache", {"vocab_size": 8192})  # the same from Python
    train_batches = loader.make_loader(meta, "train", {"seed": 0})  # then batches (loader.py)

Pipeline (each stage is a small function below; prepare_data() runs them all, caches the result):
1. Sources. Documents are streamed file by file, never loaded whole, so RAM stays flat on big
   corpora. Downloads (FineWeb-Edu, FineWeb-2) go through download.py: resumed, retried, renamed
   into place whole.
2. Cleaning, after cramming's pipeline (Geiping & Goldstein, ICML 2023, arXiv 2212.14034): Unicode
   normalization, optional lowercasing and accent stripping (cramming does both; we keep case by
   default), exact-duplicate removal and a filter that drops documents needing too many tokens per
   character (cramming's `trash_cutoff`: keep a document iff tokens < 0.25 * characters; off by
   default). Every step reports the documents and UTF-8 bytes it removed.
3. Tokenizer (tokenizer.py): byte-level BPE, trained with rustbpe on the cleaned corpus's start.
4. Shards (their format is loader.py's): every document is encoded and followed by [SEP]; a
   process pool tokenizes, the main process deduplicates and writes flat binary shards. A document
   goes to the validation split when its index among kept documents is a multiple of
   round(1 / val_fraction).
Mixtures (several sources, each with a weight) share one tokenizer trained on a sample in the
mixture's proportions; each source keeps its own shards and val split (loader.py's MixtureLoader
interleaves them). The result is a folder <cache>/<name>-<settings hash>/ with tokenizer.json,
the shards and meta.json.
"""
import argparse
import codecs
import collections
import contextlib
import gzip
import hashlib
import json
import math
import multiprocessing
import os
import shutil
import signal
import sys
import unicodedata

import numpy as np
from tqdm import tqdm

# What is downloaded from where (FineWeb-Edu, FineWeb-2), and how: resumed, retried, whole or not.
from download import (
    FINEWEB2_CHARS_PER_TOKEN,
    FINEWEB2_DEFAULT_CHARS,
    FINEWEB2_LANG,
    FINEWEB2_URL,
    FINEWEB_URL,
    download_fineweb,
    download_fineweb2,
    shards_for_tokens,
)
from files import atomic_write  # a temporary file, then os.replace: never half a file
from tokenizer import (
    VOCAB_MULTIPLE,
    load_tokenizer,
    n_ordinary,
    round_up,
    save_tokenizer,
    special_ids,
    stock_tokenizer,
    train_tokenizer,
)

# The shard format and meta.json's reader are loader.py's, but loader.py imports torch for its
# batches. _build_once and _write_shards import it where they need it, so that importing data.py
# does not import torch: each tokenizing worker (a spawned process) imports data.py afresh.

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE_CORPUS = os.path.join(HERE, "corpora", "shakespeare.jsonl.gz")  # bundled: runs offline
SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".parquet")
TXT_DOC_CHARS = 65536  # a .txt file is cut at blank lines into documents of about this many chars
TOKENIZER_CHARS = 1_000_000_000  # cleaned characters the tokenizer is trained on, at most
SHARD_TOKENS = 1 << 27  # tokens per shard file before a new one starts (256 MB as uint16)
PREPARE_VERSION = 1  # bump when prepare_data's output changes, so old caches are not reused

# prepare_data's settings: pass a dict of some of these keys; the rest keep these values. The
# command line has one flag per key (--vocab-size for vocab_size, ...).
DEFAULTS = {
    # Tokenizer
    "vocab_size": 32768,         # rounded up to a multiple of 64 (tokenizer.py)
    "tokenizer": "train",        # "train" (rustbpe), "gpt2", "cl100k_base" or a tokenizer.json path
    "tokenizer_chars": TOKENIZER_CHARS,  # the tokenizer trains on at most this many characters
    # Cleaning: cramming's normalizer lowercases and strips accents; off here (not English-only)
    "normalize": "NFC",          # Unicode normal form, None = off
    "lowercase": False,
    "strip_accents": False,
    "dedup": True,               # drop exact duplicate documents (after cleaning)
    "max_tokens_per_char": None,  # drop documents above this ratio (cramming's trash_cutoff: 0.25)
    # Splits and shards
    "val_fraction": 0.05,        # every round(1 / val_fraction)-th kept document goes to validation
    "max_val_tokens": 10_000_000,  # ... until the val split holds this many tokens
    "shard_tokens": SHARD_TOKENS,
    "workers": None,             # tokenizer processes; None = CPUs - 1
    # Sources
    "fineweb_shards": None,      # FineWeb-Edu shards to fetch; None = enough for max_tokens, else 1
    "max_tokens": None,          # training tokens wanted: sizes downloads, never cuts local corpora
    "fineweb_url": FINEWEB_URL,
    "fineweb2_url": FINEWEB2_URL,
    "mix_temperature": None,     # weight unweighted sources by size^(1/T) (XLM's language sampling)
}


# -------------------------------------------------------------------------------------------------
# prepare_data: sources -> cleaning -> tokenizer -> shards, cached by settings

def prepare_data(data="sample", cache_dir="cache", settings=None, progress=True):
    """Everything train.py needs, as a plain dict, also saved as <cache_dir>/<name>-<key>/meta.json.

    data: "sample" (bundled), "fineweb" (download fineweb_shards shards, or enough for max_tokens
    tokens, default 1; max_tokens sizes only the download), "fineweb2:LANG" (FineWeb-2 row groups
    for max_tokens), a file/folder path, or a mixture of these, "a:0.7,b:0.3" or weighted by
    mix_temperature (parse_mixture, _prepare_mixture). settings: a dict of some of DEFAULTS' keys,
    e.g. {"vocab_size": 8192}. Its tokenizer: "train" (rustbpe on the first tokenizer_chars
    characters), "gpt2"/"cl100k_base" (stock tiktoken + our specials) or a tokenizer.json path. The
    val split stops growing at max_val_tokens. The result is cached under a key of all settings and
    the files' sizes and mtimes: the same settings again return it ("reused": True). The folder
    appears by one atomic rename, so a failed run leaves no partial shard or tokenizer, and two
    processes may prepare it at once. A failed run removes only what it made (the folders it
    created, if empty): another run's entries and finished downloads stay."""
    unknown = sorted(set(settings or {}) - set(DEFAULTS))
    if unknown:  # a misspelled key would otherwise be ignored in silence
        raise ValueError(f"unknown data setting {unknown[0]!r}; valid: {', '.join(DEFAULTS)}")
    opts = {**DEFAULTS, **(settings or {}), "progress": progress}  # every key, in one dict
    _check_settings(cache_dir, opts)
    made = [folder for folder in _folders_for(data, cache_dir) if not os.path.exists(folder)]
    try:
        return _prepare(data, cache_dir, opts)
    except BaseException:
        # A failed preparation removes what it made and nothing more. Its entry was built in a
        # temporary folder, gone already (_build_once). The folders it created go only if empty:
        # another process may have finished an entry in them meanwhile, and a finished download
        # (or a .partial one, which resumes) is kept for the next try.
        _remove_if_empty(made)
        raise


def _folders_for(data, cache_dir):
    """The folders preparing data may create, deepest first: each FineWeb-2 language's download
    folder, fineweb2/, fineweb/ and cache_dir itself."""
    entries = [entry.strip().split(":") for entry in data.split(",")]  # loosely, as downloads()
    langs = sorted({e[1] for e in entries if e[0] == "fineweb2" and len(e) > 1
                    and FINEWEB2_LANG.fullmatch(e[1])})
    fineweb2 = os.path.join(cache_dir, "fineweb2")
    return [os.path.join(fineweb2, lang) for lang in langs] + \
        [fineweb2, os.path.join(cache_dir, "fineweb"), cache_dir]


def _remove_if_empty(folders):
    for folder in folders:
        # os.rmdir, not shutil.rmtree: it refuses a folder that holds anything, someone's work
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def _prepare(data, cache_dir, opts):
    """prepare_data's work, once the settings are checked: one corpus or a mixture."""
    mixture = parse_mixture(data, opts["mix_temperature"])
    if len(mixture) > 1:
        return _prepare_mixture(mixture, cache_dir, _keyed_settings(opts), opts)
    name, files, identity = _resolve(mixture[0]["source"], opts["max_tokens"], cache_dir, opts)
    keyed = dict(version=PREPARE_VERSION, source=identity, **_keyed_settings(opts))
    return _build_once(_cache_folder(cache_dir, name, keyed),
                       lambda tmp: _prepare_into(tmp, files, data, keyed, opts))


def _keyed_settings(opts):
    """The settings that change what is prepared (not workers, not progress): with the source's
    identity they are hashed into the cache key and saved as meta.json's "settings". Names and order
    are the cache's format: changing them would orphan every prepared folder."""
    tokenizer = opts["tokenizer"]
    # a tokenizer file is known by its path and size: another file there makes another cache entry
    tok_id = tokenizer if tokenizer in ("train", "gpt2", "cl100k_base") else \
        [os.path.abspath(tokenizer),
         os.path.getsize(tokenizer) if os.path.exists(tokenizer) else -1]
    clean = {k: opts[k] for k in ("normalize", "lowercase", "strip_accents")}  # for clean_text
    return dict(vocab_size=opts["vocab_size"], tokenizer=tok_id, clean=clean, dedup=opts["dedup"],
                max_tokens_per_char=opts["max_tokens_per_char"], val_fraction=opts["val_fraction"],
                max_val_tokens=opts["max_val_tokens"], tokenizer_chars=opts["tokenizer_chars"],
                shard_tokens=opts["shard_tokens"])


def _check_settings(cache_dir, opts):
    """One-line errors (ValueError) for settings that would prepare nothing useful, before any
    work."""
    o = opts
    rules = [("vocab_size", o["vocab_size"] >= 64, ">= 64"),
             ("val_fraction", 0 < o["val_fraction"] <= 0.5,
              "in (0, 0.5]: training needs a held-out split"),
             ("max_val_tokens", o["max_val_tokens"] >= 1, ">= 1"),
             ("tokenizer_chars", o["tokenizer_chars"] >= 1, ">= 1"),
             # None: the default (chosen later from the budget), so only a given value is checked
             ("fineweb_shards", o["fineweb_shards"] is None or o["fineweb_shards"] >= 1, ">= 1"),
             ("max_tokens", o["max_tokens"] is None or o["max_tokens"] > 0, "> 0"),
             ("max_tokens_per_char",
              o["max_tokens_per_char"] is None or o["max_tokens_per_char"] > 0, "> 0"),
             ("workers", o["workers"] is None or o["workers"] >= 1, ">= 1"),
             # unicodedata's own error ("invalid normalization form") names neither flag nor value
             ("normalize", o["normalize"] in (None, "NFC", "NFD", "NFKC", "NFKD"),
              "NFC, NFD, NFKC, NFKD or none"),
             ("mix_temperature", o["mix_temperature"] is None
              or (math.isfinite(o["mix_temperature"]) and o["mix_temperature"] > 0), "> 0")]
    for name, ok, rule in rules:
        if not ok:  # named as the command-line flag, which is how most people set it
            raise ValueError(f"--{name.replace('_', '-')} must be {rule} (got {o[name]!r})")
    if os.path.isfile(cache_dir):
        raise ValueError(f"{cache_dir} is a file; the cache must be a folder")


def _resolve(data, max_tokens, cache_dir, opts):
    """data (one source) -> (short name, corpus files, identity for the cache key). Downloads are
    sized by max_tokens (training tokens wanted from this source), when given."""
    if data.startswith("fineweb2:"):
        lang = data.split(":", 1)[1]
        if not FINEWEB2_LANG.fullmatch(lang):
            raise ValueError(f"--data {data}: FineWeb-2 names a language as lang_Script, e.g. "
                             "fineweb2:fra_Latn (an ISO 639-3 code and an ISO 15924 script)")
        chars = max_tokens * FINEWEB2_CHARS_PER_TOKEN if max_tokens else FINEWEB2_DEFAULT_CHARS
        url = opts["fineweb2_url"]
        files = download_fineweb2(lang, os.path.join(cache_dir, "fineweb2", lang), chars, url,
                                  progress=opts["progress"])
        return lang, files, [url, lang, [os.path.basename(f) for f in files]]
    if data == "sample":  # the bundled file changes only with the repository: name and size suffice
        identity = [os.path.basename(SAMPLE_CORPUS), os.path.getsize(SAMPLE_CORPUS)]
        return "sample", [SAMPLE_CORPUS], identity
    if data == "fineweb":
        n = opts["fineweb_shards"] or (shards_for_tokens(max_tokens) if max_tokens else 1)
        url = opts["fineweb_url"]
        folder = os.path.join(cache_dir, "fineweb")
        files = download_fineweb(n, folder, url, progress=opts["progress"])
        return "fineweb", files, [url, [os.path.basename(f) for f in files]]
    files = list_files(data)
    name = os.path.basename(os.path.normpath(data)).split(".")[0] or "data"
    # A local file is known by its path, size and modification time: an edited one is prepared anew.
    return name, files, [[f, os.path.getsize(f), os.stat(f).st_mtime_ns] for f in files]


def _cache_folder(cache_dir, name, settings):
    # 12 hex digits of SHA-256: a collision among one person's cache entries is out of the question
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(cache_dir, f"{name}-{key}")


def _build_once(out, build):
    """out's prepared data if it exists ("reused"), else build(tmp) into OUT.<pid>.tmp, renamed to
    out at the end."""
    from loader import load_meta  # here, not at the top: loader.py imports torch
    if os.path.exists(os.path.join(out, "meta.json")):  # written last: its presence means done
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


def _prepare_into(tmp, files, data, keyed, opts):
    """Tokenizer + shards + meta.json into the folder tmp."""
    texts = _training_texts(files, keyed["clean"], keyed["tokenizer_chars"])
    enc = _make_tokenizer(texts, keyed, opts["tokenizer"])
    path = os.path.join(tmp, "tokenizer.json")
    with _naming_the_file(path):
        save_tokenizer(enc, path)  # first: the workers load it there
    splits, report = _write_shards(tmp, files, enc, keyed, opts)
    _check_kept(data, splits, report)
    meta = _meta(keyed, enc, report, splits)
    _write_json(os.path.join(tmp, "meta.json"), meta)


def _meta(settings, enc, report, splits):
    """meta.json's fields (paths relative to the folder; load_meta makes them absolute)."""
    return {"settings": settings, "tokenizer": "tokenizer.json", "n_vocab": enc.n_vocab,
            "n_ordinary": n_ordinary(enc), "special_ids": special_ids(enc),
            "itemsize": _itemsize(enc),
            "report": report, **{s: sp["files"] for s, sp in splits.items()},
            **{f"{s}_tokens": sp["tokens"] for s, sp in splits.items()},
            **{f"{s}_documents": sp["documents"] for s, sp in splits.items()}}


def _write_json(path, doc):
    # meta.json is written last: its presence is what marks a folder as finished
    with _naming_the_file(path):
        atomic_write(path, lambda f: f.write(json.dumps(doc, indent=1).encode()))


@contextlib.contextmanager
def _naming_the_file(path):
    """Writes to path inside fail with one line that names the file and what the cache kept. The
    operating system's own error for a failed write, a full disk's ENOSPC above all, names no file:
    "[Errno 28] No space left on device" alone does not say which disk."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:  # open()'s errors name their file already
            raise
        raise OSError(e.errno, f"{e.strerror} writing {path}; the cache keeps only finished "
                      "entries, so nothing of this one was kept") from None


def _itemsize(enc):  # bytes per token in the shards: uint16 when the ids fit
    return 2 if enc.n_vocab <= 1 << 16 else 4


def _remove_stale_temps(out):
    """Delete OUT.<pid>.tmp folders left by killed preparations (their process is gone)."""
    folder, prefix = os.path.dirname(out) or ".", os.path.basename(out) + "."
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        pid = name[len(prefix):-len(".tmp")]
        ours = name.startswith(prefix) and name.endswith(".tmp") and pid.isdigit()
        if ours and not _alive(int(pid)):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def _alive(pid):
    try:
        os.kill(pid, 0)  # signal 0 only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


@contextlib.contextmanager
def exit_cleanly_on_sigterm(cache_dir, message):
    """While preparing: SIGTERM removes this process's temporary folders in cache_dir, prints
    message and exits 1. (An exception raised from the handler could surface inside the tokenizer's
    native code; exiting cannot.)"""
    def stop(signum, frame):
        suffix = f".{os.getpid()}.tmp"
        for name in os.listdir(cache_dir) if os.path.isdir(cache_dir) else ():
            if name.endswith(suffix):
                shutil.rmtree(os.path.join(cache_dir, name), ignore_errors=True)
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        os._exit(1)  # no cleanup handlers, no exception: the process ends here
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


_UTF8 = {"path": None, "replaced": collections.Counter()}  # invalid UTF-8 replaced, per file


def _count_and_replace(err):
    # a codec error handler: one bad byte sequence -> one U+FFFD, counted against the current file
    _UTF8["replaced"][_UTF8["path"]] += 1
    return "\ufffd", err.end


codecs.register_error("growcram_count", _count_and_replace)  # registered once, used by name below


def _decode(raw, path):
    """bytes -> str; invalid UTF-8 becomes U+FFFD, counted per file (reported, never fatal)."""
    _UTF8["path"] = path
    return raw.decode("utf-8", errors="growcram_count")


def list_files(path):
    """A file or a folder (searched recursively, sorted) -> the corpus files. ValueError if none."""
    if not os.path.exists(path):
        raise ValueError(f"data path not found: {path} (use --data sample, --data fineweb or "
                         "--data PATH)")
    if os.path.isfile(path):
        if not path.endswith(SUFFIXES):
            raise ValueError(f"{path}: unsupported file type (expected one of "
                             f"{', '.join(SUFFIXES)})")
        return [os.path.abspath(path)]
    files = sorted(os.path.abspath(os.path.join(root, name)) for root, dirs, names in os.walk(path)
                   for name in names if name.endswith(SUFFIXES) and not name.startswith("."))
    if not files:
        raise ValueError(f"{path}: folder holds no {', '.join(SUFFIXES)} files")
    return files


def iter_documents(path):
    """Yield the documents (str) of one corpus file; a one-line ValueError names the file on bad
    input."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq  # only parquet corpora need pyarrow
        try:
            pf = pq.ParquetFile(path)
        except Exception as e:
            raise ValueError(f"{path}: not a readable parquet file ({e})") from None
        if "text" not in pf.schema_arrow.names:
            raise ValueError(f"{path}: no 'text' column (columns: "
                             f"{', '.join(pf.schema_arrow.names)})")
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
                # A JSON "\ud800" escape decodes to a lone surrogate, which is not UTF-8:
                # replaced and counted too.
                if not text.isascii():
                    text = _decode(text.encode("utf-8", "surrogatepass"), path)
                yield text
    else:  # .txt: cut at blank lines once a piece is long enough: huge files stream, by document
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


# -------------------------------------------------------------------------------------------------
# Cleaning

def clean_text(text, normalize="NFC", lowercase=False, strip_accents=False):
    """(cleaned text, {step: UTF-8 bytes removed}). Steps run in this order; each is optional."""
    removed, size = {}, len(text.encode("utf-8"))
    steps = [("normalize", normalize and (lambda t: unicodedata.normalize(normalize, t))),
             ("lowercase", lowercase and str.lower),
             ("strip_accents", strip_accents and (lambda t: _strip_accents(t, normalize)))]
    for name, fn in steps:
        if fn:
            text = fn(text)
            new = len(text.encode("utf-8"))
            removed[name], size = size - new, new  # each step reports what it took
    return text, removed


def _strip_accents(text, normalize):
    if text.isascii():  # nothing to strip, and the common case in English corpora
        return text
    # NFD splits "é" into "e" + U+0301; dropping the combining marks strips the accent (as
    # cramming does), then the text goes back to the chosen normal form.
    bare = "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))
    return unicodedata.normalize(normalize or "NFC", bare)


def _digest(text):
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()



# -------------------------------------------------------------------------------------------------
# Tokenizing and writing shards: a process pool encodes, the main process filters and writes

_WORKER = {}


def _init_worker(tokenizer_path, clean_kwargs, threads):
    _WORKER.update(enc=load_tokenizer(tokenizer_path), clean=clean_kwargs, threads=threads)


def _encode_docs(docs):
    """Worker: clean + encode documents ->
    [(digest, raw bytes, {step: bytes removed}, chars, words, ids)]."""
    enc, dtype = _WORKER["enc"], np.uint16 if _WORKER["enc"].n_vocab <= 1 << 16 else np.uint32
    cleaned = [clean_text(d, **_WORKER["clean"]) for d in docs]
    # whitespace-only documents count as empty: they encode to nothing and are dropped
    texts = [t if t.strip() else "" for t, _ in cleaned]
    ids = enc.encode_ordinary_batch(texts, num_threads=_WORKER["threads"])
    return [(_digest(t), len(d.encode("utf-8")), rm, len(t), len(t.split()),
             np.array(i, dtype=dtype)) for d, (t, rm), i in zip(docs, cleaned, ids)]


def _chunks(files, chunk_chars=1 << 20):
    # ~1 M characters per task: big enough to amortize the pickling, small enough to keep RAM flat
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
    """Yield per-document results in corpus order. At most 2 chunks per worker are in flight:
    Pool.imap would read the whole corpus into its task queue, the RAM blow-up this design
    avoids."""
    if workers <= 1:
        _init_worker(*init_args)
        for chunk in _chunks(files):
            yield from _encode_docs(chunk)
        return
    # spawn: safe on every OS and after rustbpe/torch have started threads in this process.
    # Each worker encodes with 1 thread: the processes already use every core.
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(workers, _init_worker, init_args[:2] + (1,)) as pool:
        pending = collections.deque()
        for chunk in _chunks(files):
            pending.append(pool.apply_async(_encode_docs, (chunk,)))
            if len(pending) >= 2 * workers:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


def _training_texts(files, clean_kwargs, max_chars):
    """The cleaned, deduplicated corpus prefix the tokenizer is trained on (at most max_chars
    characters)."""
    seen = set()
    for path in files:
        for doc in iter_documents(path):
            text, _ = clean_text(doc, **clean_kwargs)
            digest = _digest(text)
            if not text.strip() or digest in seen:
                continue
            seen.add(digest)
            # the last document is cut to the budget, so the sample never exceeds max_chars
            yield text[:max_chars]
            max_chars -= len(text)
            if max_chars <= 0:
                return


def _make_tokenizer(texts, settings, tokenizer):
    """The tokenizer: trained on texts (an iterable of str, read only here), or a stock or saved
    one."""
    if tokenizer != "train":
        if tokenizer in ("gpt2", "cl100k_base"):
            return stock_tokenizer(tokenizer)
        return load_tokenizer(tokenizer)
    enc = train_tokenizer(texts, settings["vocab_size"])
    if enc.n_vocab < round_up(settings["vocab_size"], VOCAB_MULTIPLE):
        print(f"note: the tokenizer learned {enc.n_vocab} tokens, fewer than the "
              f"{settings['vocab_size']} asked for: {settings['tokenizer_chars']:,} characters of "
              "this corpus hold no more merges (raise --tokenizer-chars, or give a bigger corpus)",
              file=sys.stderr)
    return enc


def _check_kept(data, splits, report):
    if report["documents_in"] == 0:
        raise ValueError(f"{data}: no documents found (empty corpus)")
    if splits["train"]["tokens"] == 0:
        raise ValueError(f"{data}: no training documents left after cleaning "
                         f"({report['documents_out']} kept of "
                         f"{report['documents_in']}; a train/val split needs at least 2)")


def _write_shards(tmp, files, enc, settings, opts, prefix=""):
    """Stream the corpus through the workers; drop empty, duplicate and incompressible documents;
    append the rest (each followed by [SEP]) to train_00000.bin ... / val_00000.bin ... (after
    prefix, a mixture's source folder) in the shard format of loader.py. settings: the keyed
    settings (_keyed_settings); opts: workers and progress. Returns (splits, report); the report
    also counts the kept documents' whitespace words."""
    from loader import SHARD_HEADER, close_shard  # here, not at the top: loader.py imports torch
    steps = ("normalize", "lowercase", "strip_accents", "empty", "duplicate", "compressibility")
    report = {"documents_in": 0, "bytes_in": 0, "documents_out": 0, "bytes_out": 0, "words_out": 0,
              "invalid_utf8": {}, "removed": {s: {"documents": 0, "bytes": 0} for s in steps}}
    # per split: its files, totals, the shard being written ("f") and the tokens in it ("n")
    splits = {s: {"files": [], "tokens": 0, "documents": 0, "f": None, "n": 0}
              for s in ("train", "val")}
    val_every = round(1 / settings["val_fraction"]) if settings["val_fraction"] > 0 else 0
    itemsize = _itemsize(enc)
    sep = np.array([special_ids(enc)["sep"]], dtype=f"<u{itemsize}").tobytes()
    max_tpc, seen = settings["max_tokens_per_char"], set()
    _UTF8["replaced"].clear()
    workers = opts["workers"] or max(1, (os.cpu_count() or 2) - 1)  # one core left for this process
    init_args = (os.path.join(tmp, "tokenizer.json"), settings["clean"], os.cpu_count() or 1)
    results = tqdm(_encoded(files, workers, init_args), desc="tokenizing", unit="doc",
                   disable=not opts["progress"])
    try:
        for digest, nbytes, removed, nchars, nwords, toks in results:
            kept = nbytes - sum(removed.values())  # UTF-8 bytes left after cleaning
            report["documents_in"] += 1
            report["bytes_in"] += nbytes
            for step, n in removed.items():
                report["removed"][step]["bytes"] += n
            # cramming's trash filter: many tokens per character mean a document is mostly not text
            drop = ("empty" if toks.size == 0
                    else "duplicate" if settings["dedup"] and digest in seen
                    else "compressibility" if max_tpc and toks.size > max_tpc * nchars else None)
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
            with _naming_the_file(sp["f"].name):
                sp["f"].write(toks.astype(f"<u{itemsize}", copy=False).tobytes() + sep)
            sp["n"] += toks.size + 1
            sp["tokens"] += toks.size + 1
            sp["documents"] += 1
            if sp["n"] >= settings["shard_tokens"]:
                with _naming_the_file(sp["f"].name):  # closing flushes the last tokens
                    close_shard(sp, itemsize)
        for sp in splits.values():
            if sp["f"] is not None:
                with _naming_the_file(sp["f"].name):
                    close_shard(sp, itemsize)
    finally:  # on error: close what is open; _build_once deletes the whole temporary folder
        for sp in splits.values():
            if sp["f"] is not None:
                # closing flushes what a full disk refused: that error is the one raised already
                with contextlib.suppress(OSError):
                    sp["f"].close()
    report["invalid_utf8"] = dict(_UTF8["replaced"])
    return splits, report


# -------------------------------------------------------------------------------------------------
# Mixtures: several sources, each with its weight: one tokenizer, and per source shards and a split

def parse_mixture(data, temperature=None):
    """--data -> [{"source", "weight"}]: one entry for a single source (today's path), several for a
    mixture "a:0.6,b:0.4", with weights normalized to sum 1. The weight follows an entry's last ':'
    when it is a number, so "fineweb2:fra_Latn:0.3" is the source fineweb2:fra_Latn at 0.3. Weights
    are all given or none: none means by size, with --mix-temperature (temperature_weights, once the
    sizes are known: weight None here). An existing path is one source, commas or not. A malformed
    string is a one-line ValueError naming --data."""
    # an existing path wins over the mixture syntax: a folder may have a comma or colon in its name
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
            raise ValueError(f"--data {data!r}: entry {i} has no source "
                             "(expected SOURCE or SOURCE:WEIGHT, separated by commas)")
        if weight is not None and not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"--data {data!r}: the weight of {source} must be a positive number "
                             f"(got {tail})")
        entries.append({"source": source, "weight": weight})
    names = [e["source"] for e in entries]
    twice = next((n for n in names if names.count(n) > 1), None)
    given = [e["weight"] is not None for e in entries]
    if twice:
        raise ValueError(f"--data {data!r}: {twice} appears twice; give each source once, with its "
                         "whole weight")
    if len(entries) > 1 and any(given) and not all(given):
        raise ValueError(f"--data {data!r}: give every source a weight or none of them "
                         f"({names[given.index(False)]} has none)")
    if len(entries) > 1 and all(given) and temperature is not None:
        raise ValueError(f"--data {data!r}: the sources have weights, so --mix-temperature would "
                         "set nothing; give weights or --mix-temperature, not both")
    if len(entries) > 1 and not any(given) and temperature is None:
        raise ValueError(f"--data {data!r}: {len(entries)} sources without weights; write "
                         "SOURCE:WEIGHT for each, or give --mix-temperature T to weight them "
                         "by size")
    if all(given):
        total = sum(e["weight"] for e in entries)
        entries = [{**e, "weight": e["weight"] / total} for e in entries]
    return entries


def downloads(data):
    """Whether --data downloads (fineweb or fineweb2:LANG, alone or in a mixture): a token budget
    then sizes it."""
    names = (entry.strip().split(":")[0] for entry in data.split(","))  # source names, no weights
    return any(name in ("fineweb", "fineweb2") for name in names)


def _number(text):
    # float() accepts "1e-3" and " 0.5 ", as a person writing weights would expect
    try:
        return float(text)
    except ValueError:
        return None


def temperature_weights(sizes, temperature):
    """Sampling weights q_i = p_i^a / sum_j p_j^a with a = 1/T and p_i = size_i / sum of sizes:
    XLM's language sampling (Lample & Conneau 2019; XLM-R, Conneau et al. 2020, used a = 0.3). T = 1
    samples by size; a larger T is flatter (T -> infinity: uniform), giving small languages more of
    the stream than their size."""
    # float64: sizes in characters reach 1e12, and the exponent needs the precision
    p = np.asarray(sizes, dtype=np.float64)
    p = p / p.sum()
    q = p ** (1.0 / temperature)
    return (q / q.sum()).tolist()


def _prepare_mixture(mixture, cache_dir, keyed, opts):
    """prepare_data for a mixture: resolve every source (a download sized by its weight of
    max_tokens), then one cached folder keyed by all sources and weights (_prepare_mixture_into)."""
    sources, max_tokens, temperature = [], opts["max_tokens"], opts["mix_temperature"]
    for entry in mixture:
        share = entry["weight"] if entry["weight"] is not None else 1.0  # by size: the whole budget
        tokens = max_tokens * share if max_tokens else None
        name, files, identity = _resolve(entry["source"], tokens, cache_dir, opts)
        sources.append({"name": name, "source": entry["source"], "weight": entry["weight"],
                        "files": files, "identity": identity})
    names = [s["name"] for s in sources]
    for i, s in enumerate(sources):  # two folders both named data/ become data-1 and data-2
        if names.count(s["name"]) > 1:
            s["name"] = f"{s['name']}-{names[:i + 1].count(s['name'])}"
    if temperature is not None and any(downloads(s["source"]) for s in sources):
        print("note: --mix-temperature weights the sources by their size here, and a download's "
              "size is what the budget fetched, not the language's; give fineweb sources weights "
              "instead", file=sys.stderr)
    keyed = dict(version=PREPARE_VERSION, mixture=[[s["identity"], s["weight"]] for s in sources],
                 mix_temperature=temperature, **keyed)
    out = _cache_folder(cache_dir, "+".join(s["name"] for s in sources)[:60], keyed)
    return _build_once(out, lambda tmp: _prepare_mixture_into(tmp, sources, keyed, opts))


def _prepare_mixture_into(tmp, sources, settings, opts):
    """A mixture's tokenizer, each source's shards in tmp/<name>/ (its own val split: whole
    documents, as for one corpus) and meta.json: the totals of one corpus plus "sources", one entry
    per source (_source_entry)."""
    sizes = [_source_chars(s["files"]) for s in sources]
    for s, size in zip(sources, sizes):
        if size == 0:
            raise ValueError(f"{s['source']}: no documents found (empty corpus)")
    weights = [s["weight"] for s in sources] if sources[0]["weight"] is not None else \
        temperature_weights(sizes, settings["mix_temperature"])
    texts = _mixture_training_texts(sources, weights, sizes, settings["clean"],
                                    settings["tokenizer_chars"])
    enc = _make_tokenizer(texts, settings, opts["tokenizer"])
    path = os.path.join(tmp, "tokenizer.json")
    with _naming_the_file(path):
        save_tokenizer(enc, path)
    entries, reports = [], []
    for s, weight, size in zip(sources, weights, sizes):
        os.makedirs(os.path.join(tmp, s["name"]))
        splits, report = _write_shards(tmp, s["files"], enc, settings, opts, prefix=s["name"] + "/")
        _check_kept(s["source"], splits, report)
        entries.append(_source_entry(s, weight, size, splits, report))
        reports.append(report)
    total = {split: {"files": [f for e in entries for f in e[split]],
                     "tokens": sum(e[f"{split}_tokens"] for e in entries),
                     "documents": sum(e[f"{split}_documents"] for e in entries)}
             for split in ("train", "val")}
    meta = {**_meta(settings, enc, _sum_reports(reports), total), "sources": entries}
    _write_json(os.path.join(tmp, "meta.json"), meta)


def _source_chars(files):
    """A source's size for temperature sampling and the tokenizer's sample: characters of its
    documents."""
    # characters, not bytes or tokens: comparable across scripts, known before any tokenizer exists
    return sum(len(doc) for path in files for doc in iter_documents(path))


def _mixture_training_texts(sources, weights, sizes, clean_kwargs, max_chars):
    """The tokenizer's training sample of a mixture: min(max_chars, all characters) characters, the
    share weight_i of them from source i (its cleaned, deduplicated documents, cycled when its share
    is larger than the source). The merges then follow the mixture's proportions, so a small
    language is not starved of merges (XLM learns its BPE on sentences sampled with its language
    sampling, Lample & Conneau 2019)."""
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
    """meta["sources"][i]: what the loader needs (name, weight, files) and the source's summary.
    bytes_per_token and tokens_per_word (fertility: tokens per whitespace-separated word) count the
    documents' text, not the [SEP] after each; a language the tokenizer over-segments shows a high
    fertility."""
    both = lambda key: splits["train"][key] + splits["val"][key]  # noqa: E731
    bytes_per_token, tokens_per_word = text_ratios(report, both("tokens"), both("documents"))
    return {"name": source["name"], "source": source["source"], "weight": weight, "chars": chars,
            "train": splits["train"]["files"], "val": splits["val"]["files"],
            **{f"{s}_{k}": splits[s][k] for s in ("train", "val") for k in ("tokens", "documents")},
            "words": report["words_out"], "bytes_per_token": bytes_per_token,
            "tokens_per_word": tokens_per_word, "report": report}


def source_lines(meta):
    """A mixture's sources, a line each: weight, tokens, bytes per token and tokens per word
    (fertility, Rust et al. 2021), so an over-segmented language shows before training."""
    return [f"  {s['name'] + ':':16s} weight {s['weight']:.3f}, {s['train_tokens']:,} train / "
            f"{s['val_tokens']:,} val tokens, {s['bytes_per_token']:.2f} bytes/token, "
            f"{s['tokens_per_word']:.2f} tokens/word" for s in meta.get("sources", [])]


def text_ratios(report, tokens, documents):
    """(bytes per token, tokens per whitespace word) of the kept documents' text, rounded to 4
    digits: the [SEP] after each document is not text, so it is not counted."""
    text_tokens = tokens - documents
    return (round(report["bytes_out"] / max(1, text_tokens), 4),
            round(text_tokens / max(1, report["words_out"]), 4))


def _sum_reports(reports):
    """The cleaning reports of several sources added up, as one corpus's report."""
    counts = ("documents_in", "bytes_in", "documents_out", "bytes_out", "words_out")
    total = {k: sum(r[k] for r in reports) for k in counts}
    total["invalid_utf8"] = {path: n for r in reports for path, n in r["invalid_utf8"].items()}
    total["removed"] = {step: {k: sum(r["removed"][step][k] for r in reports)
                               for k in ("documents", "bytes")} for step in reports[0]["removed"]}
    return total


# -------------------------------------------------------------------------------------------------
# Command line

# The two flags that name the data, shared with train.py's command line
DATA_HELP = ("'sample' (bundled Shakespeare), 'fineweb' (FineWeb-Edu download), 'fineweb2:LANG' "
             "(FineWeb-2 download, e.g. fineweb2:fra_Latn), a file/folder of "
             ".txt/.jsonl/.jsonl.gz/.parquet, or a mixture of these: "
             "'SOURCE:WEIGHT,SOURCE:WEIGHT,...' (docs/data.md: mixtures)")
MIX_TEMPERATURE_HELP = ("weight a mixture's sources by size^(1/T), size in characters (XLM's "
                        "language sampling): 1 = by size, larger = flatter; the sources then take "
                        "no weights")


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="data.py",
        description="Prepare a corpus: clean, train a tokenizer, write token shards.",
        usage="%(prog)s --data DATA [--out CACHE] [flags]  (--help lists them)")
    # Data
    p.add_argument("--data", default="sample", help=DATA_HELP)
    p.add_argument("--mix-temperature", type=float, default=None, metavar="T",
                   help=MIX_TEMPERATURE_HELP)
    p.add_argument("--out", dest="cache_dir", metavar="OUT", default="cache",
                   help="cache folder; results land in OUT/<name>-<settings hash>/")
    p.add_argument("--fineweb-shards", type=int, default=None,
                   help="FineWeb-Edu shards to download (~55 M tokens each; default: from "
                        "--max-tokens, else 1)")
    p.add_argument("--max-tokens", type=float, default=None,
                   help="token budget; picks --fineweb-shards (tokens)")
    p.add_argument("--fineweb-url", default=FINEWEB_URL,
                   help="base URL holding shard_00000.parquet, ...")
    p.add_argument("--fineweb2-url", default=FINEWEB2_URL,
                   help="base URL holding data/<lang>/train/*.parquet")
    # Tokenizer
    p.add_argument("--tokenizer", default="train",
                   help="'train' (rustbpe), 'gpt2', 'cl100k_base' or a tokenizer.json")
    p.add_argument("--vocab-size", type=int, default=32768,
                   help="vocabulary size (tokens, rounded up to x64)")
    p.add_argument("--tokenizer-chars", type=int, default=TOKENIZER_CHARS,
                   help="corpus characters to train on")
    # Cleaning
    p.add_argument("--normalize", default="NFC", type=lambda s: None if s.lower() == "none" else s,
                   help="Unicode normal form (NFC, NFKC, ...; 'none' = off)")
    p.add_argument("--lowercase", action="store_true",
                   help="lowercase all text (cramming does; English-centric)")
    p.add_argument("--strip-accents", action="store_true",
                   help="drop combining accents (cramming does; English-centric: it merges "
                        "distinct words elsewhere)")
    p.add_argument("--no-dedup", dest="dedup", action="store_false",
                   help="keep exact duplicate documents")
    p.add_argument("--max-tokens-per-char", type=float, default=None,
                   help="drop documents above this tokens/character ratio (cramming: 0.25; "
                        "default off)")
    p.add_argument("--val-fraction", type=float, default=0.05,
                   help="fraction of documents for validation")
    p.add_argument("--max-val-tokens", type=int, default=10_000_000,
                   help="cap on validation tokens")
    p.add_argument("--workers", type=int, default=None,
                   help="tokenizer processes (default: CPUs - 1)")
    args = p.parse_args(argv)
    try:
        message = ("error: stopped by a signal; nothing was written (the cache keeps only "
                   "finished entries)")
        with exit_cleanly_on_sigterm(args.cache_dir, message):
            settings = vars(args)  # each option's dest is a DEFAULTS key, but for these two
            meta = prepare_data(settings.pop("data"), settings.pop("cache_dir"), settings)
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
    for line in source_lines(meta):
        print(line)
    print(f"summary json:    {os.path.join(meta['dir'], 'meta.json')}")
    return meta


if __name__ == "__main__":
    main()
