"""download.py: what growcram downloads, from where, and how: public files over HTTP, so that a
flaky network or a kill never leaves a half file.

What and from where (the addresses are the public ones; tests serve the same names on 127.0.0.1):
- FineWeb-Edu shards (download_fineweb, sized by shards_for_tokens) and FineWeb-2 row groups
  (download_fineweb2), the corpora data.py prepares;
- the GLUE tasks (download_glue: the classic zips, MRPC built from SentEval's files, AX), which
  evaluate_glue.py fine-tunes on.
How: every download
- resumes: a file grows in DEST.partial and a new try asks for the rest with an HTTP Range request;
- retries network errors, 5xx answers and short reads with exponential backoff;
  a 4xx answer fails at once;
- checks the byte count against Content-Length or Content-Range, and renames into place only when
  it is whole;
- fails with one line that names the URL, the reason and what to do instead (the caller's `hint`).
RemoteFile reads parts of a remote file by Range requests (parquet: the footer, then a row group).
"""
import http.client
import io
import itertools
import math
import os
import re
import shutil
import time
import urllib.error
import urllib.request
import zipfile

from tqdm import tqdm

from files import atomic_write  # a temporary file, then os.replace: never half a file

# The first retry wait of a failed download (seconds), doubling per retry: exponential backoff
# spreads the retries of many clients apart, instead of hammering a server already struggling.
DOWNLOAD_BACKOFF_S = 2.0
# How hard to try: one dict for download_file, fetch_range and RemoteFile; callers override keys.
NETWORK = {
    "retries": 5,         # tries in all; a flaky link usually recovers within a few backoff waits
    "backoff_s": None,    # first wait between tries; None reads DOWNLOAD_BACKOFF_S when it is used
    "timeout_s": 60.0,    # per socket read: a slow mirror gets through, a hung one is noticed
}
# what a failure suggests when the caller gives no hint of its own
NO_HINT = "check the URL and the network"


def download_file(url, dest, progress=True, hint=NO_HINT, network=None):
    """Download url to dest: resumes a dest.partial with an HTTP Range request, retries with
    exponential backoff (retrying), checks the byte count against Content-Length/Content-Range and
    renames into place at the end. Existing files are not fetched again. Failure is a one-line
    ValueError (see retrying). network: the keys of NETWORK to override."""
    # dest appears only by the rename at the end, so if it exists it is whole: nothing to do
    if os.path.exists(dest):
        return dest
    part = dest + ".partial"
    timeout_s = {**NETWORK, **(network or {})}["timeout_s"]

    def attempt():
        # ask only for the bytes we lack: a killed 5 GB download resumes instead of starting over
        have = os.path.getsize(part) if os.path.exists(part) else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                if resp.status == 206:  # the server resumes where the partial file ends
                    total = int(resp.headers.get("Content-Range", "/-1").rsplit("/", 1)[1])
                    mode = "ab"
                else:                   # a plain 200 ignores the range: start over
                    have, total, mode = 0, int(resp.headers.get("Content-Length", -1)), "wb"
                with open(part, mode) as f, tqdm(total=total if total >= 0 else None, initial=have,
                                                 unit="B", unit_scale=True,
                                                 desc=os.path.basename(dest),
                                                 disable=not progress) as bar:
                    # 1 MiB reads: few syscalls, and the bar still moves on a slow link
                    while chunk := resp.read(1 << 20):
                        f.write(chunk)
                        bar.update(len(chunk))
        except urllib.error.HTTPError as e:
            # 416: the partial file does not fit the remote file (it changed?): retry from zero
            if e.code == 416 and os.path.exists(part):
                os.remove(part)
                raise OSError(f"HTTP 416 {e.reason}") from None
            raise
        # a connection that closes early looks like success to urllib: count the bytes ourselves
        size = os.path.getsize(part)
        if total >= 0 and size != total:
            raise OSError(f"got {size} bytes, expected {total}")
        # atomic on POSIX: a reader sees either no file or the whole file, never half of one
        os.replace(part, dest)
        return dest
    return retrying(url, attempt, network, hint)


def fetch_range(url, start, end, hint=NO_HINT, network=None):
    """(bytes start..end-1 of a remote file, the file's size) by one HTTP Range request, retried
    like download_file. A short answer is retried; a server that ignores Range is a one-line error,
    never a silent download of the whole (multi-GB) file. network: keys of NETWORK to override."""
    timeout_s = {**NETWORK, **(network or {})}["timeout_s"]

    def attempt():
        # HTTP ranges are inclusive at both ends (RFC 9110, section 14.1.2), hence end - 1
        request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end - 1}"})
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            if resp.status != 206:
                raise ValueError(f"cannot fetch part of {url}: the server ignores HTTP Range "
                                 f"requests (status {resp.status})")
            # "bytes 0-0/12345": the part after the slash is the whole file's size
            size = int(resp.headers.get("Content-Range", "/-1").rsplit("/", 1)[1])
            body = resp.read()
        if len(body) != min(end, size) - start:
            raise OSError(f"got {len(body)} bytes of {url} at {start}, "
                          f"expected {min(end, size) - start}")
        return body, size
    return retrying(url, attempt, network, hint)


class RemoteFile(io.RawIOBase):
    """A remote file read through HTTP Range requests (fetch_range), for pyarrow: it reads a parquet
    file's footer and then only the column chunks asked for, so one row group is fetched without the
    file around it. kwargs (hint, network) go to every fetch_range."""

    def __init__(self, url, **kwargs):
        super().__init__()
        self.url, self.kwargs, self.pos = url, kwargs, 0
        self.size = fetch_range(url, 0, 1, **kwargs)[1]  # Content-Range carries the size

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=os.SEEK_SET):
        # whence 0, 1, 2: from the start, from here, from the end (io.IOBase.seek's convention)
        self.pos = [offset, self.pos + offset, self.size + offset][whence]
        return self.pos

    def read(self, n=-1):
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        body, _ = fetch_range(self.url, self.pos, end, **self.kwargs)
        self.pos = end
        return body


class HTTPStatusError(ValueError):
    """A request the server refused (HTTP 4xx): the one-line message, and the status for callers
    that expect one."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


def retrying(url, attempt, network, hint):
    """attempt() until it returns. Network errors, 5xx answers and short reads (OSError) are retried
    after backoff_s, 2*backoff_s, ... (network's keys over NETWORK); a 4xx answer fails at once.
    Failure is a one-line ValueError naming the URL, the reason and `hint` (what to do offline)."""
    network = {**NETWORK, **(network or {})}
    # DOWNLOAD_BACKOFF_S is read here, at call time, so that tests can set it to 0
    backoff_s = DOWNLOAD_BACKOFF_S if network["backoff_s"] is None else network["backoff_s"]
    error = None
    for i in range(network["retries"]):
        if i:
            time.sleep(backoff_s * 2 ** (i - 1))
        try:
            return attempt()
        except urllib.error.HTTPError as e:
            # a 4xx is the server's final word (missing file, no access): retrying cannot help
            if 400 <= e.code < 500:
                raise HTTPStatusError(f"cannot download {url}: HTTP {e.code} {e.reason}; {hint}",
                                      e.code) from None
            error = e
        except (OSError, http.client.HTTPException) as e:  # offline, refused, timeouts, short reads
            error = e
    reason = getattr(error, "reason", error)
    raise ValueError(f"cannot download {url} after {network['retries']} tries ({reason}); "
                     f"offline? {hint}")


# -------------------------------------------------------------------------------------------------
# FineWeb-Edu and FineWeb-2: the corpora data.py prepares (--data fineweb, --data fineweb2:LANG)

FINEWEB_URL = "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main"
# A shard holds about 250 M characters, 55-60 M tokens at ~4.3 characters per token (English BPE,
# 32K vocabulary): 55 M is the low end, so a token budget never gets too few shards.
FINEWEB_TOKENS_PER_SHARD = 55e6
FINEWEB2_URL = "https://huggingface.co/datasets/HuggingFaceFW/fineweb-2/resolve/main"
# A FineWeb-2 language: an ISO 639-3 language code, "_", an ISO 15924 script (fra_Latn).
FINEWEB2_LANG = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")
FINEWEB2_CHARS_PER_TOKEN = 5.0  # characters per budgeted token: generous, languages compress unlike
FINEWEB2_DEFAULT_CHARS = 250e6  # without a token budget: about one FineWeb-Edu shard's worth


def shards_for_tokens(n_tokens):
    """How many FineWeb-Edu shards (~55 M tokens each) hold n_tokens training tokens."""
    return max(1, math.ceil(n_tokens / FINEWEB_TOKENS_PER_SHARD))


OFFLINE_HINT = "use --data sample (bundled corpus) or --data PATH (local .txt/.jsonl/.parquet)"


def download_fineweb(n_shards, out_dir, base_url=FINEWEB_URL, **kwargs):
    """Fetch the first n_shards FineWeb-Edu shards (shard_00000.parquet, ...) into out_dir; returns
    their paths."""
    os.makedirs(out_dir, exist_ok=True)
    return [download_file(f"{base_url.rstrip('/')}/shard_{i:05d}.parquet",
                          os.path.join(out_dir, f"shard_{i:05d}.parquet"),
                          **{"hint": OFFLINE_HINT, **kwargs})
            for i in range(n_shards)]


def download_fineweb2(lang, out_dir, max_chars, base_url=FINEWEB2_URL, progress=True, **kwargs):
    """FineWeb-2 text of one language (lang_Script, e.g. fra_Latn) until it holds max_chars
    characters: the row groups of data/<lang>/train/000_00000.parquet, then 000_00001.parquet, ...
    (until one is missing). The files are GBs, so each row group's text column is fetched alone by
    Range requests (RemoteFile) and saved as a small parquet file, out_dir/000_00000-00003.parquet
    for row group 3, written atomically with its character count in the schema metadata. An
    interrupted download resumes at the next row group; a larger budget adds files."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(out_dir, exist_ok=True)
    hint = (f"is {lang} a FineWeb-2 language (data/{lang}/ on the dataset's page)? "
            f"Else {OFFLINE_HINT}")
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
                            if e.status == 404 and paths:  # no more files: use what we have
                                return paths
                            raise
                        if "text" not in remote.schema_arrow.names:
                            names = ", ".join(remote.schema_arrow.names)
                            raise ValueError(f"{url}: no 'text' column (columns: {names})")
                    if group >= remote.num_row_groups:
                        break
                    rows = remote.read_row_group(group, columns=["text"]).column(0).to_pylist()
                    texts = [t or "" for t in rows]
                    # the character count rides in the schema: reading it back costs no text
                    chars_meta = {"chars": str(sum(map(len, texts)))}
                    table = pa.table({"text": texts}).replace_schema_metadata(chars_meta)
                    atomic_write(path, lambda f: pq.write_table(table, f))
                n = int(pq.read_schema(path).metadata[b"chars"])
                paths.append(path)
                chars += n
                bar.update(n)
                if chars >= max_chars:
                    return paths


# -------------------------------------------------------------------------------------------------
# GLUE (evaluate_glue.py --download): the classic zips, MRPC from SentEval's files, AX diagnostics

GLUE_URL = "https://dl.fbaipublicfiles.com/glue/data/"
MRPC_URL = "https://dl.fbaipublicfiles.com/senteval/senteval_data/"
# Spelled out per task on purpose: the widely copied download script swaps QQP's and STS-B's URLs.
ZIPS = {"CoLA": "CoLA.zip", "SST-2": "SST-2.zip", "STS-B": "STS-B.zip", "QQP": "QQP-clean.zip",
        "MNLI": "MNLI.zip", "QNLI": "QNLIv2.zip", "RTE": "RTE.zip", "WNLI": "WNLI.zip"}
MRPC_HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"


def fetch(url, dest, retries=3, retry_wait_s=2.0):
    """download_file for GLUE (retries with backoff, resume, size check, atomic rename, progress
    bar); a failure stops the run with one line."""
    try:
        return download_file(url, dest, hint="set --download-url to a reachable mirror",
                             network={"retries": retries, "backoff_s": retry_wait_s})
    except ValueError as e:
        raise SystemExit(f"download failed: {e}") from None


def extract_task_zip(zip_path, glue_dir, task):
    """Unzip into a scratch folder, then move the task folder into place in one rename."""
    scratch = os.path.join(glue_dir, f".extract_{task}")
    shutil.rmtree(scratch, ignore_errors=True)
    with zipfile.ZipFile(zip_path) as z:
        for member in z.namelist():  # refuse paths that would land outside the scratch folder
            if os.path.isabs(member) or ".." in member.split("/"):
                raise ValueError(f"{zip_path}: unsafe path {member!r} in zip")
        z.extractall(scratch)
    tops = [d for d in os.listdir(scratch)
            if os.path.isdir(os.path.join(scratch, d)) and d != "__MACOSX"]
    top = task if task in tops else (tops[0] if len(tops) == 1 else None)
    if top is None:
        raise ValueError(f"{zip_path}: expected one folder named {task} in the zip, found {tops}")
    os.replace(os.path.join(scratch, top), os.path.join(glue_dir, task))
    shutil.rmtree(scratch, ignore_errors=True)


def build_mrpc(folder):
    """train.tsv/dev.tsv/test.tsv from SentEval's MSR paraphrase files and the list of dev pairs
    (#1 ID, #2 ID)."""
    with open(os.path.join(folder, "mrpc_dev_ids.tsv"), encoding="utf-8-sig") as f:
        dev_ids = {tuple(line.strip().split("\t")) for line in f if line.strip()}
    # train.tsv is written last: its presence is what marks a task folder as complete
    parts = {"dev": [MRPC_HEADER], "test": ["index\t#1 ID\t#2 ID\t#1 String\t#2 String\n"],
             "train": [MRPC_HEADER]}
    for name in ("train", "test"):
        src = os.path.join(folder, f"msr_paraphrase_{name}.txt")
        with open(src, encoding="utf-8-sig") as f:
            next(f)  # header
            for i, line in enumerate(f):
                fields = line.rstrip("\r\n").split("\t")
                if len(fields) != 5:
                    raise ValueError(f"{src}: line {i + 2} has {len(fields)} fields, expected 5")
                label, id1, id2, s1, s2 = fields
                if name == "test":
                    parts["test"].append(f"{i}\t{id1}\t{id2}\t{s1}\t{s2}\n")
                else:
                    split = "dev" if (id1, id2) in dev_ids else "train"
                    parts[split].append(line.rstrip("\r\n") + "\n")
    for name, lines in parts.items():
        text = "".join(lines)
        atomic_write(os.path.join(folder, f"{name}.tsv"), lambda f: f.write(text.encode("utf-8")))


def download_glue(glue_dir, tasks, base_url=GLUE_URL, mrpc_url=MRPC_URL, retries=3,
                  retry_wait_s=2.0):
    """Fetch each task in `tasks` not already in glue_dir (plus AX when MNLI is asked for)."""
    os.makedirs(glue_dir, exist_ok=True)
    base_url, mrpc_url = base_url.rstrip("/") + "/", mrpc_url.rstrip("/") + "/"

    def get(url, dest):
        return fetch(url, dest, retries=retries, retry_wait_s=retry_wait_s)
    for task in tasks:
        if os.path.isfile(os.path.join(glue_dir, task, "train.tsv")):
            print(f"{task}: already in {glue_dir}, not downloaded again")
            continue
        if task == "MRPC":
            folder = os.path.join(glue_dir, "MRPC")
            os.makedirs(folder, exist_ok=True)
            for f in ("msr_paraphrase_train.txt", "msr_paraphrase_test.txt"):
                get(mrpc_url + f, os.path.join(folder, f))
            get(base_url + "mrpc_dev_ids.tsv", os.path.join(folder, "mrpc_dev_ids.tsv"))
            build_mrpc(folder)
        else:
            # A task folder without train.tsv is the user's: never deleted to make room.
            if os.path.isdir(os.path.join(glue_dir, task)):
                raise ValueError(f"{os.path.join(glue_dir, task)}: exists without train.tsv; "
                                 "remove it and retry")
            zip_path = get(base_url + ZIPS[task], os.path.join(glue_dir, ZIPS[task]))
            extract_task_zip(zip_path, glue_dir, task)
            os.remove(zip_path)
        print(f"{task}: downloaded to {os.path.join(glue_dir, task)}")
    ax = os.path.join(glue_dir, "diagnostic", "diagnostic.tsv")
    if "MNLI" in tasks and not os.path.isfile(ax):
        os.makedirs(os.path.dirname(ax), exist_ok=True)
        get(base_url + "AX.tsv", ax)
        print(f"AX: downloaded to {ax}")
