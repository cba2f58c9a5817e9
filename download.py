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

DOWNLOAD_BACKOFF_S = 2.0      # first retry wait of a failed download (seconds), doubling per retry
# what a failure suggests when the caller gives no hint of its own
NO_HINT = "check the URL and the network"


class HTTPStatusError(ValueError):
    """A request the server refused (HTTP 4xx): the one-line message, and the status for callers
    that expect one."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


def retrying(url, attempt, retries, backoff_s, hint):
    """attempt() until it returns. Network errors, 5xx answers and short reads (OSError) are retried
    after backoff_s, 2*backoff_s, ... (default DOWNLOAD_BACKOFF_S); a 4xx answer fails at once.
    Failure is a one-line ValueError naming the URL, the reason and `hint` (what to do offline)."""
    backoff_s = DOWNLOAD_BACKOFF_S if backoff_s is None else backoff_s
    error = None
    for i in range(retries):
        if i:
            time.sleep(backoff_s * 2 ** (i - 1))
        try:
            return attempt()
        except urllib.error.HTTPError as e:
            if 400 <= e.code < 500:
                raise HTTPStatusError(f"cannot download {url}: HTTP {e.code} {e.reason}; {hint}",
                                      e.code) from None
            error = e
        # URLError (offline, refused), timeouts, short reads
        except (OSError, http.client.HTTPException) as e:
            error = e
    reason = getattr(error, "reason", error)
    raise ValueError(f"cannot download {url} after {retries} tries ({reason}); offline? {hint}")


def download_file(url, dest, retries=5, backoff_s=None, timeout_s=60.0, progress=True,
                  hint=NO_HINT):
    """Download url to dest: resumes a dest.partial with an HTTP Range request, retries with
    exponential backoff (retrying), checks the byte count against Content-Length/Content-Range and
    renames into place at the end. Existing files are not fetched again. Failure is a one-line
    ValueError (see retrying)."""
    if os.path.exists(dest):
        return dest
    part = dest + ".partial"

    def attempt():
        have = os.path.getsize(part) if os.path.exists(part) else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                if resp.status == 206:  # the server resumes where the partial file ends
                    total, mode = int(resp.headers.get("Content-Range", "/-1").rsplit("/",
                                                                                      1)[1]), "ab"
                else:                   # a plain 200 ignores the range: start over
                    have, total, mode = 0, int(resp.headers.get("Content-Length", -1)), "wb"
                with open(part, mode) as f, tqdm(total=total if total >= 0 else None, initial=have,
                                                 unit="B",
                                                 unit_scale=True, desc=os.path.basename(dest),
                                                 disable=not progress) as bar:
                    while chunk := resp.read(1 << 20):
                        f.write(chunk)
                        bar.update(len(chunk))
        except urllib.error.HTTPError as e:
            # the partial file does not fit the remote file: retry anew
            if e.code == 416 and os.path.exists(part):
                os.remove(part)
                raise OSError(f"HTTP 416 {e.reason}") from None
            raise
        size = os.path.getsize(part)
        if total >= 0 and size != total:
            raise OSError(f"got {size} bytes, expected {total}")
        os.replace(part, dest)
        return dest
    return retrying(url, attempt, retries, backoff_s, hint)


def fetch_range(url, start, end, retries=5, backoff_s=None, timeout_s=60.0, hint=NO_HINT):
    """(bytes start..end-1 of a remote file, the file's size) by one HTTP Range request, retried
    like download_file. A short answer is retried; a server that ignores Range is a one-line error,
    never a silent download of the whole (multi-GB) file."""
    def attempt():
        request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end - 1}"})
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            if resp.status != 206:
                raise ValueError(f"cannot fetch part of {url}: the server ignores HTTP Range requests "
                                 f"(status {resp.status})")
            size = int(resp.headers.get("Content-Range", "/-1").rsplit("/", 1)[1])
            body = resp.read()
        if len(body) != min(end, size) - start:
            raise OSError(f"got {len(body)} bytes of {url} at {start}, expected {min(end, size) - start}")
        return body, size
    return retrying(url, attempt, retries, backoff_s, hint)


class RemoteFile(io.RawIOBase):
    """A remote file read through HTTP Range requests (fetch_range), for pyarrow: it reads a parquet
    file's footer and then only the column chunks asked for, so one row group is fetched without the
    file around it."""

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
        self.pos = [offset, self.pos + offset, self.size + offset][whence]
        return self.pos

    def read(self, n=-1):
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        body, _ = fetch_range(self.url, self.pos, end, **self.kwargs)
        self.pos = end
        return body
