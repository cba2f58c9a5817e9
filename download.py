"""download.py: fetch public files over HTTP so that a flaky network or a kill never leaves a half
file.

data.py fetches its corpora with it (FineWeb-Edu shards, FineWeb-2 row groups) and evaluate_glue.py
the GLUE tasks. Every download:
- resumes: a file grows in DEST.partial and a new try asks for the rest with an HTTP Range request;
- retries network errors, 5xx answers and short reads with exponential backoff; a 4xx answer fails
  at once;
- checks the byte count against Content-Length or Content-Range, and renames into place only when it
  is whole;
- fails with one line that names the URL, the reason and what to do instead (the caller's `hint`).
RemoteFile reads parts of a remote file by Range requests (for parquet: the footer, then one row
group).
"""
import http.client
import io
import os
import time
import urllib.error
import urllib.request

from tqdm import tqdm

# first retry wait of a failed download (seconds), doubling per retry: exponential backoff spreads
# the retries of many clients apart instead of hammering a server that is already struggling
DOWNLOAD_BACKOFF_S = 2.0
# How hard to try: one dict for download_file, fetch_range and RemoteFile; callers override keys
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
