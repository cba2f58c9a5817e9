"""Spec for data.py: sources, cleaning, tokenizer, shards, batches, downloads. Hermetic: tiny
corpora built in tmp_path, downloads served by a local http.server on 127.0.0.1, no network.

    python -m pytest -q tests/test_data.py
"""
import gzip
import http.server
import json
import os
import socket
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry
import torch

import data
import download
import tokenizer
from loader import make_loader, mixture_pattern, read_shard, write_shard

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "ven", "dar", "el", "gu"]


def make_docs(n_docs, words=60, seed=0):
    """Pseudo-English documents of made-up words: repeated pairs enough for a few hundred merges."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        ws = ["".join(rng.choice(SYLLABLES, size=rng.integers(1, 4))) for _ in range(words)]
        docs.append(" ".join(ws).capitalize() + ". " + str(int(rng.integers(0, 1000))) + "\n")
    return docs


def draw(loader, n_batches, batch_size, seq_len):
    """The input ids of the loader's next n_batches batches, end to end: (n_batches * B * T,)."""
    return np.concatenate([loader.next_batch(batch_size, seq_len)["input_ids"].numpy().ravel()
                           for _ in range(n_batches)])


def write_jsonl(path, docs, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    return str(path)


def write_parquet(path, docs, column="text"):
    pq.write_table(pa.table({column: docs}), path, row_group_size=4)
    return str(path)


def fake_meta(tmp_path, tokens, n_ordinary=100):
    """A hand-made prepared split: a shard of `tokens`, and the specials pad/cls/sep/mask at
    n_ordinary .. n_ordinary + 3."""
    path = str(tmp_path / "train_00000.bin")
    write_shard(path, tokens)
    special = {"pad": n_ordinary, "cls": n_ordinary + 1, "sep": n_ordinary + 2,
               "mask": n_ordinary + 3}
    return {"dir": str(tmp_path), "train": [path], "val": [path], "n_ordinary": n_ordinary,
            "special_ids": special}


@pytest.fixture(scope="module")
def docs_enc():
    """A 384-token BPE trained on 40 made-up documents (not conftest's sentence tokenizer `enc`)."""
    return tokenizer.train_tokenizer(make_docs(40), vocab_size=384)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    src = write_jsonl(root / "corpus.jsonl", make_docs(30))
    return data.prepare_data(src, str(root / "cache"),
                             {"vocab_size": 320, "workers": 1, "val_fraction": 0.1}, progress=False)


# -----------------------------------------------------------------------------
# Sources

def test_missing_path_is_a_one_line_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match="data path not found: .*nope.*--data sample") as e:
        data.list_files(str(tmp_path / "nope"))
    assert "\n" not in str(e.value)


def test_folder_without_corpus_files_is_an_error(tmp_path):
    (tmp_path / "notes.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="holds no .txt"):
        data.list_files(str(tmp_path))


def test_txt_jsonl_gz_and_parquet_are_read_from_a_folder(tmp_path):
    (tmp_path / "a.txt").write_text("plain text file\n")
    write_jsonl(tmp_path / "b.jsonl.gz", ["gz one", "gz two"], gz=True)
    write_parquet(tmp_path / "c.parquet", ["pq one", "pq two", "pq three"])
    files = data.list_files(str(tmp_path))
    docs = [d for f in files for d in data.iter_documents(f)]
    assert docs == ["plain text file\n", "gz one", "gz two", "pq one", "pq two", "pq three"]


def test_sample_corpus_is_bundled_with_42_works():
    name, files, _ = data._resolve("sample", None, "unused", {**data.DEFAULTS, "progress": False})
    docs = list(data.iter_documents(files[0]))
    assert name == "sample" and len(docs) == 42 and sum(map(len, docs)) > 4_000_000


def test_big_txt_file_is_cut_into_documents_at_blank_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "TXT_DOC_CHARS", 20)
    (tmp_path / "a.txt").write_text("first paragraph is long\n\nsecond one is long too\n\nend\n")
    docs = list(data.iter_documents(str(tmp_path / "a.txt")))
    assert docs == ["first paragraph is long\n\n", "second one is long too\n\n", "end\n"]


def test_jsonl_line_without_text_field_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"body": "no text here"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: no 'text' field"):
        list(data.iter_documents(str(path)))


def test_parquet_without_text_column_names_file_and_columns(tmp_path):
    path = write_parquet(tmp_path / "bad.parquet", ["x"], column="content")
    with pytest.raises(ValueError, match=r"bad.parquet: no 'text' column \(columns: content\)"):
        list(data.iter_documents(path))


def test_invalid_utf8_is_replaced_and_counted_per_file(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"caf\xe9 ok\n\xff\xfe end\n")
    data._UTF8["replaced"].clear()
    docs = list(data.iter_documents(str(path)))
    assert docs == ["caf\ufffd ok\n\ufffd\ufffd end\n"]
    assert data._UTF8["replaced"][str(path)] == 3


# -----------------------------------------------------------------------------
# Cleaning

def test_clean_text_normalizes_lowercases_and_strips_accents_reporting_bytes():
    decomposed = "Cafe\u0301 NAI\u0308VE"  # 'e' + combining acute: NFC makes it one character
    text, removed = data.clean_text(decomposed, normalize="NFC", lowercase=True, strip_accents=True)
    assert text == "cafe naive"
    # NFC: e+U+0301 (3 bytes) -> é (2 bytes), I+U+0308 -> Ï: 2 bytes removed;
    # stripping the accents: 2 more
    assert removed == {"normalize": 2, "lowercase": 0, "strip_accents": 2}


def test_prepare_removes_duplicates_empty_and_incompressible_documents(tmp_path):
    docs = make_docs(12)
    junk = "".join(chr(0x4E00 + i * 37) for i in range(300))  # unseen CJK: ~3 byte tokens a char
    src = write_jsonl(tmp_path / "c.jsonl", docs + [docs[0], docs[1], "   ", junk])
    settings = {"vocab_size": 320, "workers": 1, "max_tokens_per_char": 1.0}
    meta = data.prepare_data(src, str(tmp_path / "cache"), settings, progress=False)
    r = meta["report"]
    assert r["documents_in"] == 16 and r["documents_out"] == 12
    assert r["removed"]["duplicate"] == {"documents": 2, "bytes": len((docs[0] + docs[1]).encode())}
    assert r["removed"]["empty"]["documents"] == 1
    assert r["removed"]["compressibility"] == {"documents": 1, "bytes": len(junk.encode())}
    assert r["bytes_out"] == sum(len(d.encode()) for d in docs)


# -----------------------------------------------------------------------------
# Tokenizer

def test_vocab_is_padded_to_a_multiple_of_64_with_specials_after_the_merges(docs_enc):
    assert docs_enc.n_vocab == 384 and docs_enc.n_vocab % 64 == 0
    ids = tokenizer.special_ids(docs_enc)
    # 256 bytes + 120 merges, then 4 specials + 4 reserved
    assert tokenizer.n_ordinary(docs_enc) == ids["pad"] == 376
    assert [ids[k] for k in ("pad", "cls", "sep", "mask")] == [376, 377, 378, 379]
    assert docs_enc.decode_single_token_bytes(383) == b"[RESERVED_3]"


def test_vocab_size_not_a_multiple_of_64_is_rounded_up():
    assert tokenizer.train_tokenizer(make_docs(40), vocab_size=330).n_vocab == 384
    with pytest.raises(ValueError, match="too small"):
        tokenizer.train_tokenizer(["abc"], vocab_size=260)


def test_encode_decode_round_trips_any_utf8(docs_enc):
    rng = np.random.default_rng(0)
    texts = ["", "naïve café", "日本語のテキスト", "emoji 🤖👍🏽 ZWJ 👩‍👩‍👧", "e\u0301 combining",
             "\r\n\t\x00 nul", "12345678901234567890", "[MASK] [CLS] look like specials"]
    for _ in range(20):  # random code points, surrogates left out (not valid in UTF-8)
        texts.append("".join(chr(c) for c in rng.integers(1, 0x10FFFF, 50)
                             if not 0xD800 <= c < 0xE000))
    for t in texts:
        assert docs_enc.decode(docs_enc.encode_ordinary(t)) == t


def test_special_token_strings_in_text_are_ordinary_bytes(docs_enc):
    ids = docs_enc.encode_ordinary("[MASK]")
    assert tokenizer.special_ids(docs_enc)["mask"] not in ids
    assert max(ids) < tokenizer.n_ordinary(docs_enc)


def test_numbers_are_split_into_groups_of_at_most_two_digits(docs_enc):
    pieces = [docs_enc.decode([i]) for i in docs_enc.encode_ordinary("12345")]
    assert "".join(pieces) == "12345" and max(map(len, pieces)) <= 2


def test_tokenizer_file_is_plain_json_and_loads_identically(docs_enc, tmp_path):
    path = str(tmp_path / "tok.json")
    tokenizer.save_tokenizer(docs_enc, path)
    doc = json.load(open(path))
    assert doc["format"] == "growcram-tokenizer" and doc["version"] == 1
    assert len(doc["ranks"]) == 376
    loaded = tokenizer.load_tokenizer(path)
    text = " ".join(make_docs(3, seed=9))
    assert loaded.encode_ordinary(text) == docs_enc.encode_ordinary(text) and loaded.n_vocab == 384
    assert tokenizer.special_ids(loaded) == tokenizer.special_ids(docs_enc)
    assert os.listdir(tmp_path) == ["tok.json"]  # no temporary file left


def test_tokenizer_of_another_version_is_a_one_line_error_naming_the_file(docs_enc, tmp_path):
    path = str(tmp_path / "tok.json")
    tokenizer.save_tokenizer(docs_enc, path)
    doc = json.load(open(path))
    doc["version"] = 99
    json.dump(doc, open(path, "w"))
    message = r"tok.json: tokenizer format version 99, this data.py reads version 1"
    with pytest.raises(ValueError, match=message):
        tokenizer.load_tokenizer(path)
    open(path, "w").write("{not json")
    with pytest.raises(ValueError, match="tok.json: not a tokenizer file"):
        tokenizer.load_tokenizer(path)


def test_stock_encoding_offline_is_a_one_line_error(tmp_path, monkeypatch):
    def no_network(url):
        raise ConnectionError(f"network disabled in tests: {url}")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty cache: tiktoken must fetch
    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    with pytest.raises(ValueError, match="tokenizer 'gpt2': ranks not in .TIKTOKEN_CACHE_DIR") as e:
        tokenizer.stock_tokenizer("gpt2")
    assert "\n" not in str(e.value)


def test_stock_encoding_keeps_its_specials_and_gets_ours_after_them(monkeypatch):
    ranks = {bytes([i]): i for i in range(256)}
    fake = tiktoken.Encoding("fake", pat_str=r"\S+|\s+", mergeable_ranks=ranks,
                             special_tokens={"<|eot|>": 256})
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: fake)
    enc = tokenizer.stock_tokenizer("gpt2")
    assert enc.encode_single_token("<|eot|>") == 256 and tokenizer.special_ids(enc)["pad"] == 257
    assert enc.n_vocab == 320
    assert enc.encode_ordinary("hi there") == fake.encode_ordinary("hi there")


# -----------------------------------------------------------------------------
# Shards

@pytest.mark.parametrize("itemsize", [2, 4])
def test_shard_round_trips_through_memmap(tmp_path, itemsize):
    path = str(tmp_path / "s.bin")
    tokens = np.arange(1000) * (70 if itemsize == 4 else 1)
    write_shard(path, tokens, itemsize)
    got = read_shard(path)
    assert got.dtype == np.dtype(f"<u{itemsize}") and np.array_equal(got, tokens)
    assert os.path.getsize(path) == 32 + 1000 * itemsize


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:20], "truncated shard header"),
    (lambda b: b"NOTTOKEN" + b[8:], "not a token shard"),
    (lambda b: b[:8] + (7).to_bytes(4, "little") + b[12:], "unsupported shard"),
    (lambda b: b[:-2], "truncated or corrupt shard"),
])
def test_damaged_shard_is_a_one_line_error_naming_the_file(tmp_path, damage, message):
    path = tmp_path / "s.bin"
    write_shard(str(path), np.arange(10))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=f"s.bin: {message}"):
        read_shard(str(path))


def test_prepared_shards_hold_documents_each_followed_by_sep(prepared):
    enc = tokenizer.load_tokenizer(prepared["tokenizer"])
    sep = prepared["special_ids"]["sep"]
    train = np.concatenate([read_shard(p) for p in prepared["train"]])
    docs = make_docs(30)
    # val_fraction 0.1: documents 0, 10 and 20 go to val
    train_docs = [d for i, d in enumerate(docs) if i % 10 != 0]
    expected = [t for d in train_docs for t in enc.encode_ordinary(d) + [sep]]
    assert train.tolist() == expected
    assert prepared["train_documents"] == 27 and prepared["val_documents"] == 3
    assert prepared["train_tokens"] == len(expected) and train.dtype == np.uint16


def test_second_prepare_with_same_settings_reuses_the_cache(prepared):
    source, cache = prepared["settings"]["source"][0][0], os.path.dirname(prepared["dir"])
    settings = {"vocab_size": 320, "workers": 1, "val_fraction": 0.1}
    again = data.prepare_data(source, cache, settings, progress=False)
    other = data.prepare_data(source, cache, {**settings, "val_fraction": 0.2}, progress=False)
    assert again["reused"] and again["dir"] == prepared["dir"]
    assert not other["reused"] and other["dir"] != prepared["dir"]


def test_failed_prepare_leaves_no_partial_files(tmp_path):
    (tmp_path / "corpus").mkdir()
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_docs(5))
    (tmp_path / "corpus" / "b.jsonl").write_text('{"text": "fine"}\n{"oops": 1}\n')
    with pytest.raises(ValueError, match="b.jsonl:2"):
        data.prepare_data(str(tmp_path / "corpus"), str(tmp_path / "cache"),
                          {"vocab_size": 320, "workers": 1}, progress=False)
    assert not os.path.exists(tmp_path / "cache")  # not even the cache folder it would have made


def test_empty_corpus_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty.jsonl: no documents found"):
        data.prepare_data(str(tmp_path / "empty.jsonl"), str(tmp_path / "cache"),
                          {"vocab_size": 320, "workers": 1}, progress=False)


def test_process_pool_writes_the_same_shards_as_one_process(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", make_docs(20))
    tok = str(tmp_path / "tok.json")
    tokenizer.save_tokenizer(tokenizer.train_tokenizer(make_docs(20), 320), tok)
    one = data.prepare_data(src, str(tmp_path / "a"), {"tokenizer": tok, "workers": 1},
                            progress=False)
    two = data.prepare_data(src, str(tmp_path / "b"), {"tokenizer": tok, "workers": 2},
                            progress=False)
    for split in ("train", "val"):
        shards = [[open(p, "rb").read() for p in meta[split]] for meta in (one, two)]
        assert shards[0] == shards[1]


# -----------------------------------------------------------------------------
# Batches

def test_an_mlm_batch_has_fixed_shapes_and_a_fixed_number_of_masked_positions(tmp_path):
    loader = make_loader(fake_meta(tmp_path, np.arange(5000) % 100), "train", {"seed": 0})
    b = loader.next_batch(4, 128)
    assert b["input_ids"].shape == (4, 128)
    assert b["labels"].shape == (4, 32) == b["label_positions"].shape
    assert all(v.dtype == torch.int64 for v in b.values())
    assert (b["input_ids"][:, 0] == 101).all()    # [CLS] first
    assert (b["input_ids"][:, -1] == 102).all()   # [SEP] last
    assert (b["label_positions"].diff(dim=1) > 0).all()  # distinct, ascending


def test_mlm_masking_is_80_10_10_and_leaves_other_tokens_alone(tmp_path):
    tokens = np.arange(20000) % 100  # unshuffled stream: the original of window j is known
    loader = make_loader(fake_meta(tmp_path, tokens), "train", {"seed": 1, "shuffle": False})
    kinds = np.zeros(3)
    for _ in range(8):
        start = loader.position
        b = {k: v.numpy() for k, v in loader.next_batch(16, 64).items()}
        orig = tokens[start + np.arange(16)[:, None] * 62 + np.arange(62)]
        rows = np.arange(16)[:, None]
        assert np.array_equal(b["labels"], orig[rows, b["label_positions"] - 1])
        got = b["input_ids"][rows, b["label_positions"]]
        kinds += [(got == 103).sum(),                               # [MASK]
                  ((got != 103) & (got != b["labels"])).sum(),      # a random token
                  (got == b["labels"]).sum()]                       # unchanged
        untouched = np.ones((16, 64), bool)
        untouched[rows, b["label_positions"]] = False
        assert np.array_equal(b["input_ids"][:, 1:-1][untouched[:, 1:-1]], orig[untouched[:, 1:-1]])
    # 2048 masked tokens; a random replacement equals the original 1% of the time
    frac = kinds / kinds.sum()
    assert abs(frac[0] - 0.8) < 0.03 and abs(frac[1] - 0.1) < 0.02 and abs(frac[2] - 0.1) < 0.02


def test_special_tokens_are_never_masked_and_short_rows_get_ignore_labels(tmp_path):
    tokens = np.array([5, 102] * 500)  # one-token documents: half of every window is [SEP]
    loader = make_loader(fake_meta(tmp_path, tokens), "train", {"seed": 0, "mask_rate": 0.6})
    # k = round(0.6 * 12) = 7, but only 5 of the 10 window tokens are maskable
    b = loader.next_batch(8, 12)
    assert b["labels"].shape == (8, 7)
    assert ((b["labels"] == 5).sum(1) == 5).all() and ((b["labels"] == -100).sum(1) == 2).all()
    ignored = b["label_positions"][b["labels"] == -100]
    picked = b["input_ids"].gather(1, b["label_positions"])
    assert (picked[b["labels"] == -100] == 102).all() and len(ignored) == 16


def test_clm_labels_are_the_next_tokens(tmp_path):
    tokens = np.arange(3000) % 97
    loader = make_loader(fake_meta(tmp_path, tokens), "train",
                         {"objective": "clm", "seed": 0, "shuffle": False})
    b = loader.next_batch(3, 10)
    assert b["input_ids"].tolist()[1] == list(range(10, 20))
    assert b["labels"].tolist()[1] == list(range(11, 21))


def test_one_shuffled_epoch_reads_every_token_exactly_once(tmp_path):
    tokens = np.arange(64 * 40)
    loader = make_loader(fake_meta(tmp_path, tokens, n_ordinary=5000), "train",
                         {"objective": "clm", "seed": 3, "block_tokens": 64})
    seen = draw(loader, 10, 4, 64)
    assert sorted(seen.tolist()) == tokens.tolist() and not np.array_equal(seen, tokens)
    assert loader.state_dict()["epoch"] == 1


def test_the_same_seed_gives_the_same_batches_and_another_seed_other_batches(tmp_path):
    meta = fake_meta(tmp_path, np.arange(50000) % 100)
    a, b, c = (make_loader(meta, "train", {"seed": s}).next_batch(8, 32) for s in (7, 7, 8))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["input_ids"], c["input_ids"])


def test_resumed_loader_reproduces_the_uninterrupted_stream_bitwise(tmp_path):
    meta = fake_meta(tmp_path, np.arange(7000) % 100)  # small: the stream wraps over several epochs
    sizes = [(8, 32), (16, 32), (16, 64), (4, 130), (32, 64)]
    run = make_loader(meta, "train", {"seed": 5})
    for B, T in sizes[:2]:
        run.next_batch(B, T)
    state = json.loads(json.dumps(run.state_dict()))  # survives a JSON checkpoint
    later = [run.next_batch(B, T) for B, T in sizes[2:] * 4]
    resumed = make_loader(meta, "train", {"seed": 123})
    resumed.load_state_dict(state)
    for want, (B, T) in zip(later, sizes[2:] * 4):
        got = resumed.next_batch(B, T)
        assert all(torch.equal(want[k], got[k]) for k in want)
    assert state["epoch"] == 0 and run.state_dict()["epoch"] >= 2


def test_prefetching_loader_returns_the_same_stream(tmp_path):
    meta = fake_meta(tmp_path, np.arange(20000) % 100)
    ahead, plain = (make_loader(meta, "train", {"seed": 4}, prefetch=p) for p in (True, False))
    for B, T in [(8, 32), (8, 32), (4, 64), (4, 64), (16, 16)]:
        x, y = ahead.next_batch(B, T), plain.next_batch(B, T)
        assert all(torch.equal(x[k], y[k]) for k in x)
    assert ahead.state_dict() == plain.state_dict()


def test_a_batch_can_ask_for_its_own_masking_rate_and_prefetch_keeps_it(tmp_path):
    """A falling masking rate (train.py --mask-rate-end) asks each batch for its rate: the batch
    masks round(rate x T) positions, and a prefetching loader, which built the next batch at the
    previous rate, returns what a plain loader makes at the new one."""
    meta = fake_meta(tmp_path, np.arange(20000) % 100)
    ahead, plain = (make_loader(meta, "train", {"seed": 4, "mask_rate": 0.5}, prefetch=p)
                    for p in (True, False))
    for rate in (None, 0.5, 0.4, 0.3, 0.3, 0.2):
        x, y = ahead.next_batch(8, 32, rate), plain.next_batch(8, 32, rate)
        assert all(torch.equal(x[k], y[k]) for k in x)
        assert x["label_positions"].shape == (8, round((rate or 0.5) * 32))


def test_ranks_draw_disjoint_sequences_that_together_equal_one_rank(tmp_path):
    meta = fake_meta(tmp_path, np.arange(100000) % 100)
    ranks = [make_loader(meta, "train", {"seed": 2, "rank": r, "world_size": 2}) for r in (0, 1)]
    single = make_loader(meta, "train", {"seed": 2})
    for _ in range(3):
        parts = [loader.next_batch(4, 32) for loader in ranks]
        whole = single.next_batch(8, 32)
        for k in whole:
            assert torch.equal(torch.cat([parts[0][k], parts[1][k]]), whole[k])
    starts = [loader.state_dict()["position"] for loader in ranks + [single]]
    assert starts == [3 * 8 * 30] * 3


def test_loader_state_from_other_data_is_rejected(tmp_path):
    a = make_loader(fake_meta(tmp_path, np.arange(1000) % 100), "train", {"objective": "clm"})
    (tmp_path / "b").mkdir()
    b = make_loader(fake_meta(tmp_path / "b", np.arange(999) % 100), "train", {"objective": "clm"})
    with pytest.raises(ValueError, match="1000 tokens, this one has 999"):
        b.load_state_dict(a.state_dict())


def test_loader_reads_a_prepared_folder(prepared):
    loader = make_loader(prepared["dir"], "val", {"seed": 0})
    b = loader.next_batch(2, 16)
    assert b["input_ids"].shape == (2, 16) and loader.n_tokens == prepared["val_tokens"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_batches_land_on_the_gpu(prepared):
    b = make_loader(prepared, "train", device="cuda").next_batch(4, 32)
    assert all(v.is_cuda for v in b.values())


# -----------------------------------------------------------------------------
# Mixtures

ACCENTED = ["é", "à", "ç", "ou", "ei", "œu", "ill", "gn", "è", "ô", "ù", "qu"]


def make_accented_docs(n_docs, words=40, seed=0):
    """French-looking documents: accented syllables, which byte-level BPE over-segments unless it
    learns them."""
    rng = np.random.default_rng(seed)
    word = lambda: "".join(rng.choice(ACCENTED, size=rng.integers(1, 4)))  # noqa: E731
    return [" ".join(word() for _ in range(words)) + ".\n" for _ in range(n_docs)]


def fake_mixture(tmp_path, parts, weights, n_ordinary=100):
    """A hand-made prepared mixture: source i's train (and val) shard holds parts[i], its weight is
    weights[i]."""
    meta = fake_meta(tmp_path, np.zeros(1), n_ordinary)
    sources = []
    for i, (tokens, weight) in enumerate(zip(parts, weights)):
        path = str(tmp_path / f"s{i}.bin")
        write_shard(path, tokens)
        sources.append({"name": f"s{i}", "weight": weight, "train": [path], "val": [path]})
    return {**meta, "sources": sources, "train": [s["train"][0] for s in sources],
            "val": [s["val"][0] for s in sources]}


def test_a_mixture_string_takes_the_weight_after_the_last_colon_and_normalizes_weights():
    entries = data.parse_mixture("wiki.jsonl:3, fineweb2:fra_Latn:1")
    assert entries == [{"source": "wiki.jsonl", "weight": 0.75},
                       {"source": "fineweb2:fra_Latn", "weight": 0.25}]
    assert data.parse_mixture("a,b", temperature=2.0) == [{"source": "a", "weight": None},
                                                           {"source": "b", "weight": None}]


def test_one_source_without_a_weight_is_a_single_corpus_even_with_colons_or_commas(tmp_path):
    one = [{"source": "fineweb2:fra_Latn", "weight": None}]
    assert data.parse_mixture("fineweb2:fra_Latn") == one
    odd = tmp_path / "a,b.jsonl"
    write_jsonl(odd, ["x"])
    assert data.parse_mixture(str(odd)) == [{"source": str(odd), "weight": None}]


@pytest.mark.parametrize("spec, temperature, message", [
    ("a:0.5,b:0", None, "the weight of b must be a positive number \\(got 0\\)"),
    ("a:0.5,b:-1", None, "the weight of b must be a positive number"),
    ("a:0.5,b:nan", None, "the weight of b must be a positive number"),
    ("a:0.5,b", None, "give every source a weight or none of them \\(b has none\\)"),
    ("a,b", None,
     "2 sources without weights; write SOURCE:WEIGHT for each, or give --mix-temperature"),
    ("a:1,b:1", 2.0, "the sources have weights, so --mix-temperature would set nothing"),
    ("a:0.5,,b:0.5", None, "entry 2 has no source"),
    ("a:0.5,b:", None, "entry 2 \\('b:'\\) ends in ':' without a weight"),
    ("a:0.5,a:0.5", None, "a appears twice"),
])
def test_a_bad_mixture_string_is_a_one_line_error_naming_data(spec, temperature, message):
    with pytest.raises(ValueError, match=f"--data '{spec}': {message}") as e:
        data.parse_mixture(spec, temperature)
    assert "\n" not in str(e.value)


def test_an_unknown_source_or_temperature_in_a_mixture_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="data path not found: .*nope"):
        data.prepare_data("sample:0.5,nope:0.5", str(tmp_path), progress=False)
    with pytest.raises(ValueError, match="--mix-temperature must be > 0 \\(got 0.0\\)"):
        data.prepare_data("a,b", str(tmp_path), {"mix_temperature": 0.0}, progress=False)
    message = "--data fineweb2:French: FineWeb-2 names a language as lang_Script"
    with pytest.raises(ValueError, match=message):
        data.prepare_data("sample:0.5,fineweb2:French:0.5", str(tmp_path), progress=False)


def test_temperature_weights_are_size_to_the_power_one_over_T_normalized():
    weights = data.temperature_weights
    assert weights([900, 100], 1.0) == pytest.approx([0.9, 0.1])                # T = 1: by size
    assert weights([900, 100], 2.0) == pytest.approx([0.75, 0.25])              # 30 : 10
    xlmr = np.array([8, 1, 1]) ** 0.3 / (8 ** 0.3 + 2)                          # XLM-R's alpha 0.3
    assert weights([800, 100, 100], 1 / 0.3) == pytest.approx(xlmr)
    assert weights([900, 100], 1e6) == pytest.approx([0.5, 0.5], abs=1e-5)      # large T: uniform


def test_the_block_pattern_gives_every_source_its_share_in_every_stretch_of_the_stream():
    source, rank, n = mixture_pattern([0.6, 0.3, 0.1], period=1000)
    assert n.tolist() == [600, 300, 100] and np.bincount(source).tolist() == [600, 300, 100]
    counts = np.cumsum(np.eye(3, dtype=int)[source], axis=0)    # blocks of each source so far
    expected = np.arange(1, 1001)[:, None] * np.array([0.6, 0.3, 0.1])
    assert np.abs(counts - expected).max() <= 1.0
    for s in range(3):                                            # a source's blocks come in order
        assert rank[source == s].tolist() == list(range(n[s]))
    # every source gets a block, however small its weight
    assert mixture_pattern([0.99999, 0.00001], period=1000)[2].tolist() == [999, 1]


def test_mixture_proportions_hold_within_a_percent_over_many_batches(tmp_path):
    parts = [np.arange(6400) % 50, 50 + np.arange(6400) % 50]  # tokens of s0 < 50, of s1 >= 50
    loader = make_loader(fake_mixture(tmp_path, parts, [0.7, 0.3]), "train",
                         {"objective": "clm", "seed": 0, "block_tokens": 64})
    seen = draw(loader, 100, 8, 32)
    assert abs((seen < 50).mean() - 0.7) < 0.01                # 25,600 tokens, 400 blocks
    drawn = loader.tokens_drawn()
    assert drawn["s0"] + drawn["s1"] == loader.position == 100 * 8 * 32
    assert abs(drawn["s0"] / loader.position - 0.7) < 0.01


@pytest.mark.parametrize("overlap", [0, 1], ids=["mlm-back-to-back", "clm-overlapping"])
def test_a_batch_of_many_blocks_reads_each_position_from_its_own_blocks_source(tmp_path, overlap):
    parts = [np.arange(6400) % 50, 50 + np.arange(6400) % 50]
    loader = make_loader(fake_mixture(tmp_path, parts, [0.7, 0.3]), "train",
                         {"seed": 0, "block_tokens": 64})
    starts = 1000 + 30 * np.arange(12)               # 12 windows over ~6 blocks
    pos = starts[:, None] + np.arange(30 + overlap)  # overlap: windows share a token
    one_at_a_time = [loader._read(np.array([[p]]))[0, 0] for p in pos.ravel()]
    assert loader._read(pos).ravel().tolist() == one_at_a_time


def test_a_small_source_is_repeated_to_its_weight_and_its_epochs_are_reported(tmp_path):
    small, big = 1000 + np.arange(640), np.arange(64000) % 1000  # 10 blocks of 64 against 1,000
    settings = {"objective": "clm", "seed": 1, "block_tokens": 64}
    loader = make_loader(fake_mixture(tmp_path, [big, small], [0.5, 0.5], n_ordinary=5000),
                         "train", settings)
    seen = draw(loader, 40, 4, 64)
    from_small = seen[seen >= 1000]
    assert len(from_small) == 5120                                    # 8 whole epochs
    assert np.array_equal(np.sort(from_small), np.repeat(small, 8))
    alone = make_loader(fake_meta(tmp_path, small, n_ordinary=5000), "train", settings)
    # in the order of the source's own shuffled stream
    assert np.array_equal(from_small, draw(alone, 20, 4, 64))
    assert loader.epochs() == {"s0": 5120 / 64000, "s1": 8.0} == loader.state_dict()["epochs"]


def test_a_mixture_is_deterministic_and_resumes_bitwise(tmp_path):
    meta = fake_mixture(tmp_path, [np.arange(3000) % 100, np.arange(1100) % 90], [0.6, 0.4])
    sizes = [(8, 32), (16, 32), (4, 64), (8, 130), (16, 48)]
    run = make_loader(meta, "train", {"seed": 5, "block_tokens": 256})
    again = make_loader(meta, "train", {"seed": 5, "block_tokens": 256})
    for B, T in sizes[:2]:
        x, y = run.next_batch(B, T), again.next_batch(B, T)
        assert all(torch.equal(x[k], y[k]) for k in x)
    state = json.loads(json.dumps(run.state_dict()))
    later = [run.next_batch(B, T) for B, T in sizes[2:] * 4]
    resumed = make_loader(meta, "train", {"seed": 99, "block_tokens": 256})
    resumed.load_state_dict(state)
    for want, (B, T) in zip(later, sizes[2:] * 4):
        got = resumed.next_batch(B, T)
        assert all(torch.equal(want[k], got[k]) for k in want)
    assert min(run.epochs().values()) > 1  # both sources wrapped meanwhile


def test_mixture_ranks_draw_disjoint_sequences_that_together_equal_one_process(tmp_path):
    meta = fake_mixture(tmp_path, [np.arange(20000) % 100, np.arange(5000) % 100], [0.5, 0.5])
    settings = {"seed": 2, "block_tokens": 128}
    ranks = [make_loader(meta, "train", {**settings, "rank": r, "world_size": 2}) for r in (0, 1)]
    single = make_loader(meta, "train", {"seed": 2, "block_tokens": 128})
    for _ in range(4):
        parts = [loader.next_batch(4, 32) for loader in ranks]
        whole = single.next_batch(8, 32)
        for k in whole:
            assert torch.equal(torch.cat([parts[0][k], parts[1][k]]), whole[k])
    assert ranks[0].state_dict() == ranks[1].state_dict() == single.state_dict()


def test_loader_state_of_another_mixture_or_of_one_corpus_is_rejected(tmp_path):
    parts = [np.arange(1000) % 100, np.arange(500) % 100]
    a = make_loader(fake_mixture(tmp_path, parts, [0.5, 0.5]), "train", {"objective": "clm"})
    b = make_loader(fake_mixture(tmp_path, parts, [0.8, 0.2]), "train", {"objective": "clm"})
    with pytest.raises(ValueError, match="loader state is for s0:0.5 .*, this mixture is s0:0.8"):
        b.load_state_dict(a.state_dict())
    one = make_loader(fake_meta(tmp_path, np.arange(1500) % 100), "train", {"objective": "clm"})
    with pytest.raises(ValueError, match="loader state is for a corpus mixture"):
        one.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="loader state is for one corpus"):
        a.load_state_dict(one.state_dict())


MIXED_SETTINGS = {"vocab_size": 320, "workers": 1, "val_fraction": 0.1}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Two made-up languages, 30 and 10 documents, mixed 0.6 : 0.4 with a 320-token BPE."""
    root = tmp_path_factory.mktemp("mix")
    en = write_jsonl(root / "en.jsonl", make_docs(30))
    fr = write_jsonl(root / "fr.jsonl", make_accented_docs(10))
    meta = data.prepare_data(f"{en}:0.6,{fr}:0.4", str(root / "cache"), MIXED_SETTINGS,
                             progress=False)
    return meta, en, fr


def test_each_source_of_a_mixture_keeps_its_own_val_split_of_whole_documents(mixed):
    meta, _, _ = mixed
    enc, sep = tokenizer.load_tokenizer(meta["tokenizer"]), meta["special_ids"]["sep"]
    assert [(s["name"], s["weight"]) for s in meta["sources"]] == [("en", 0.6), ("fr", 0.4)]
    for s, docs in zip(meta["sources"], (make_docs(30), make_accented_docs(10))):
        val = np.concatenate([read_shard(p) for p in s["val"]]).tolist()
        held_out = docs[::10]  # documents 0, 10, 20
        assert val == [t for d in held_out for t in enc.encode_ordinary(d) + [sep]]
        assert s["val_documents"] == len(held_out)
        assert s["train_documents"] == len(docs) - len(held_out)
    assert meta["train_tokens"] == sum(s["train_tokens"] for s in meta["sources"])
    assert meta["report"]["documents_in"] == 40
    assert os.path.basename(meta["dir"]).startswith("en+fr-")
    loader = make_loader(meta, "val", source="fr")
    assert loader.n_tokens == meta["sources"][1]["val_tokens"]
    with pytest.raises(ValueError, match="no source named 'de' \\(sources: en, fr\\)"):
        make_loader(meta, "val", source="de")


def test_a_mixture_is_cached_under_all_its_sources_and_weights(mixed):
    meta, en, fr = mixed
    cache = os.path.dirname(meta["dir"])
    again = data.prepare_data(f"{en}:3,{fr}:2", cache, MIXED_SETTINGS, progress=False)
    other = data.prepare_data(f"{en}:0.5,{fr}:0.5", cache, MIXED_SETTINGS, progress=False)
    assert again["reused"] and again["dir"] == meta["dir"]  # 3 : 2 is 0.6 : 0.4
    assert not other["reused"] and other["dir"] != meta["dir"]


def test_the_tokenizer_sample_draws_each_source_in_its_proportion_repeating_a_small_one(tmp_path):
    big = write_jsonl(tmp_path / "big.jsonl",
                      [f"{i:03d}" + "a" * 397 for i in range(10)])   # 4,000 characters
    small = write_jsonl(tmp_path / "small.jsonl",
                        [f"{i:03d}" + "b" * 37 for i in range(10)])  # 400 characters
    sources = [{"files": [big]}, {"files": [small]}]
    assert [data._source_chars(s["files"]) for s in sources] == [4000, 400]
    texts = list(data._mixture_training_texts(sources, [0.5, 0.5], [4000, 400], {},
                                              max_chars=10 ** 9))
    chars = [sum(len(t) for t in texts if letter in t) for letter in "ab"]
    # half of 4,400 each: the small source is read 5.5 times, the big one is cut
    assert chars == [2200, 2200]


def test_fertility_is_tokens_per_whitespace_word_for_each_source(tmp_path, capsys):
    """With no merges every token is a byte: 'ab cd ef' is 8 tokens for 3 words, 'été à' 8 for 2."""
    tok = str(tmp_path / "bytes.json")
    tokenizer.save_tokenizer(tokenizer.train_tokenizer(["x"], 320), tok)
    a = write_jsonl(tmp_path / "a.jsonl", ["ab cd ef"] * 4)
    b = write_jsonl(tmp_path / "b.jsonl", ["été à"] * 4)
    meta = data.main(["--data", f"{a}:0.5,{b}:0.5", "--out", str(tmp_path / "cache"),
                      "--tokenizer", tok, "--no-dedup", "--workers", "1", "--val-fraction", "0.25"])
    (sa, sb) = meta["sources"]
    assert (sa["tokens_per_word"], sa["bytes_per_token"], sa["words"]) == (round(8 / 3, 4), 1.0, 12)
    assert (sb["tokens_per_word"], sb["bytes_per_token"], sb["words"]) == (4.0, 1.0, 8)
    out = capsys.readouterr().out
    assert ("a:               weight 0.500, 27 train / 9 val tokens, "
            "1.00 bytes/token, 2.67 tokens/word") in out
    assert ("b:               weight 0.500, 27 train / 9 val tokens, "
            "1.00 bytes/token, 4.00 tokens/word") in out


def test_one_corpus_reports_its_fertility_too(tmp_path, capsys):
    tok = str(tmp_path / "bytes.json")
    tokenizer.save_tokenizer(tokenizer.train_tokenizer(["x"], 320), tok)
    a = write_jsonl(tmp_path / "a.jsonl", ["ab cd ef"] * 4)
    meta = data.main(["--data", a, "--out", str(tmp_path / "cache"), "--tokenizer", tok,
                      "--no-dedup", "--workers", "1", "--val-fraction", "0.25"])
    assert meta["report"]["words_out"] == 12
    assert "fertility:       2.67 tokens per whitespace word" in capsys.readouterr().out


# -----------------------------------------------------------------------------
# Downloads

class FixtureHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder; honours Range (bytes=A- or bytes=A-B: 206) unless ignore_range;
    truncate_first cuts the first response short."""
    ignore_range, truncate_first, log = False, False, []

    def log_message(self, *args):
        pass

    def do_GET(self):
        type(self).log.append((self.path, self.headers.get("Range")))
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            return self.send_error(404)
        body, ranged = open(path, "rb").read(), self.headers.get("Range") and not self.ignore_range
        first, last = self.headers["Range"][6:].split("-") if ranged else ("0", "")
        start, end = int(first), min(len(body), int(last) + 1) if last else len(body)
        self.send_response(206 if ranged else 200)
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(body)}")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if type(self).truncate_first:
            type(self).truncate_first = False
            self.wfile.write(body[start:start + (end - start) // 2])
            self.close_connection = True
            return
        self.wfile.write(body[start:end])


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "remote"
    root.mkdir()
    handler = type("Handler", (FixtureHandler,), {"log": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                            lambda *a: handler(*a, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


def test_fineweb_download_feeds_prepare_data(server, tmp_path):
    root, url, _ = server
    for i in range(2):
        write_parquet(root / f"shard_{i:05d}.parquet", make_docs(10, seed=i))
    settings = {"vocab_size": 320, "fineweb_shards": 2, "fineweb_url": url, "workers": 1}
    meta = data.prepare_data("fineweb", str(tmp_path / "cache"), settings, progress=False)
    assert meta["report"]["documents_in"] == 20 and meta["train_tokens"] > 0
    for i in range(2):
        name = f"shard_{i:05d}.parquet"
        got = open(tmp_path / "cache" / "fineweb" / name, "rb").read()
        assert got == open(root / name, "rb").read()


def test_download_resumes_a_partial_file_with_a_range_request(server, tmp_path):
    root, url, handler = server
    body = os.urandom(100_000)
    (root / "f.bin").write_bytes(body)
    (tmp_path / "f.bin.partial").write_bytes(body[:40_000])
    download.download_file(f"{url}/f.bin", str(tmp_path / "f.bin"), progress=False)
    assert (tmp_path / "f.bin").read_bytes() == body and handler.log == [("/f.bin", "bytes=40000-")]
    assert not (tmp_path / "f.bin.partial").exists()


def test_download_starts_over_when_the_server_ignores_range(server, tmp_path):
    root, url, handler = server
    handler.ignore_range = True
    (root / "f.bin").write_bytes(b"x" * 5000)
    (tmp_path / "f.bin.partial").write_bytes(b"junk")
    download.download_file(f"{url}/f.bin", str(tmp_path / "f.bin"), progress=False)
    assert (tmp_path / "f.bin").read_bytes() == b"x" * 5000


def test_cut_off_download_is_retried_and_resumed(server, tmp_path):
    root, url, handler = server
    handler.truncate_first = True
    body = os.urandom(50_000)
    (root / "f.bin").write_bytes(body)
    download.download_file(f"{url}/f.bin", str(tmp_path / "f.bin"), progress=False,
                           network={"backoff_s": 0})
    assert (tmp_path / "f.bin").read_bytes() == body
    assert handler.log == [("/f.bin", None), ("/f.bin", "bytes=25000-")]


def test_missing_remote_file_fails_at_once(server, tmp_path):
    _, url, handler = server
    with pytest.raises(ValueError, match="HTTP 404"):
        download.download_file(f"{url}/nope.bin", str(tmp_path / "nope.bin"), progress=False,
                               network={"backoff_s": 0})
    assert len(handler.log) == 1


def test_offline_download_error_is_one_line_naming_the_alternatives(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "DOWNLOAD_BACKOFF_S", 0.0)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ValueError) as e:
        data.prepare_data("fineweb", str(tmp_path),
                          {"fineweb_url": f"http://127.0.0.1:{port}"}, progress=False)
    msg = str(e.value)
    assert "offline" in msg and "--data sample" in msg and "--data PATH" in msg and "\n" not in msg
    assert os.listdir(tmp_path) == []  # not even the fineweb/ folder it made: it stayed empty


def test_a_failed_preparation_keeps_its_finished_download_for_the_retry(server, tmp_path):
    """The download is whole (it landed by rename); the preparation then fails on a damaged
    tokenizer file. The retry prepares from the file on disk: the server is asked once."""
    root, url, handler = server
    write_parquet(root / "shard_00000.parquet", make_docs(10))
    (tmp_path / "tok.json").write_text("{}")
    settings = {"vocab_size": 320, "fineweb_url": url, "workers": 1}
    cache = str(tmp_path / "cache")
    with pytest.raises(ValueError, match="tok.json"):
        data.prepare_data("fineweb", cache, {**settings, "tokenizer": str(tmp_path / "tok.json")},
                          progress=False)
    meta = data.prepare_data("fineweb", cache, settings, progress=False)
    assert meta["report"]["documents_in"] == 10
    assert handler.log == [("/shard_00000.parquet", None)]


def test_fineweb_shard_count_follows_the_token_budget():
    assert download.shards_for_tokens(1e6) == 1 and download.shards_for_tokens(5.5e9) == 100


def fineweb2_files(root, n_docs=400, lang="fra_Latn"):
    """data/<lang>/train/000_00000.parquet (n_docs documents of 1,000 characters, 4 per row group)
    and 000_00001.parquet (8 documents), as the Hub lays FineWeb-2 out; returns the documents of
    each file."""
    folder = root / "data" / lang / "train"
    folder.mkdir(parents=True)
    letters = np.array(list("abcdeéèàçôù "))
    docs = [["".join(row) for row in np.random.default_rng(i).choice(letters, (n, 1000))]
            for i, n in enumerate((n_docs, 8))]
    for i, d in enumerate(docs):  # no min/max statistics: the footer stays small beside the text
        pq.write_table(pa.table({"text": d}), folder / f"000_{i:05d}.parquet", row_group_size=4,
                       write_statistics=False)
    return docs


def test_fineweb2_fetches_only_the_row_groups_its_budget_needs_by_range_requests(server, tmp_path):
    root, url, handler = server
    docs = fineweb2_files(root)
    out = str(tmp_path / "fra_Latn")
    just_over_one_group = sum(map(len, docs[0][:4])) + 1
    paths = download.download_fineweb2("fra_Latn", out, just_over_one_group, url, progress=False)
    assert [os.path.basename(p) for p in paths] == ["000_00000-00000.parquet",
                                                    "000_00000-00001.parquet"]
    assert [d for p in paths for d in data.iter_documents(p)] == docs[0][:8]
    # every request was a Range request
    ranges = [tuple(map(int, r[6:].split("-"))) for _, r in handler.log]
    size = os.path.getsize(root / "data/fra_Latn/train/000_00000.parquet")
    assert {p for p, _ in handler.log} == {"/data/fra_Latn/train/000_00000.parquet"}
    assert sum(b - a + 1 for a, b in ranges) < 0.3 * size  # the footer and two row groups, not all


def test_fineweb2_download_resumes_at_the_next_row_group_and_stops_when_the_language_ends(
        server, tmp_path):
    root, url, handler = server
    docs = fineweb2_files(root, n_docs=12)
    out = str(tmp_path / "fra_Latn")
    first = download.download_fineweb2("fra_Latn", out, 1, url, progress=False)  # one row group
    stamp = os.stat(first[0]).st_mtime_ns
    everything = download.download_fineweb2("fra_Latn", out, 1e12, url, progress=False)
    assert len(everything) == 3 + 2 and everything[0] == first[0]
    assert os.stat(first[0]).st_mtime_ns == stamp  # not fetched again
    assert [d for p in everything for d in data.iter_documents(p)] == docs[0] + docs[1]
    # missing: the language ends there
    assert handler.log[-1][0] == "/data/fra_Latn/train/000_00002.parquet"
    handler.log.clear()
    assert download.download_fineweb2("fra_Latn", out, 4001, url, progress=False) == everything[:2]
    assert handler.log == []  # all there: nothing is fetched


def test_fineweb2_unknown_language_offline_or_without_range_support_is_a_one_line_error(
        server, tmp_path, monkeypatch):
    root, url, handler = server
    fineweb2_files(root, n_docs=4)
    with pytest.raises(ValueError, match="HTTP 404 .*; is xyz_Latn a FineWeb-2 language") as e:
        download.download_fineweb2("xyz_Latn", str(tmp_path / "x"), 100, url, progress=False)
    assert "\n" not in str(e.value)
    handler.ignore_range = True
    with pytest.raises(ValueError, match="the server ignores HTTP Range requests"):
        download.download_fineweb2("fra_Latn", str(tmp_path / "f"), 100, url, progress=False)
    monkeypatch.setattr(download, "DOWNLOAD_BACKOFF_S", 0.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    message = "after 5 tries .*offline\\? is fra_Latn a FineWeb-2 language.*--data sample"
    with pytest.raises(ValueError, match=message):
        download.download_fineweb2("fra_Latn", str(tmp_path / "g"), 100, dead, progress=False)


def test_fineweb2_language_joins_a_mixture_with_its_share_of_the_token_budget(server, tmp_path):
    root, url, _ = server
    docs = fineweb2_files(root, n_docs=12)
    en = write_jsonl(tmp_path / "en.jsonl", make_docs(20))
    # a token budget whose half needs one row group
    budget = sum(map(len, docs[0][:8])) / download.FINEWEB2_CHARS_PER_TOKEN
    settings = {"vocab_size": 320, "max_tokens": budget, "fineweb2_url": url, "workers": 1}
    meta = data.prepare_data(f"{en}:0.5,fineweb2:fra_Latn:0.5", str(tmp_path / "cache"), settings,
                             progress=False)
    fr = meta["sources"][1]
    assert (fr["name"], fr["source"], fr["weight"]) == ("fra_Latn", "fineweb2:fra_Latn", 0.5)
    assert fr["train_documents"] + fr["val_documents"] == 4  # one row group of 4 documents
    assert os.listdir(tmp_path / "cache" / "fineweb2" / "fra_Latn") == ["000_00000-00000.parquet"]


# -----------------------------------------------------------------------------
# CLI

def test_cli_prints_a_summary_and_writes_json(tmp_path, capsys):
    src = write_jsonl(tmp_path / "c.jsonl", make_docs(10))
    meta = data.main(["--data", src, "--out", str(tmp_path / "cache"), "--vocab-size", "320",
                      "--workers", "1"])
    out = capsys.readouterr().out
    assert "documents:       10 in, 10 kept (9 train / 1 val)" in out
    saved = json.load(open(os.path.join(meta["dir"], "meta.json")))
    assert saved["train_tokens"] == meta["train_tokens"]


def test_the_cli_exits_with_one_line_on_a_bad_mixture(tmp_path):
    message = "error: --data 'sample:0.5,b': give every source a weight or none"
    with pytest.raises(SystemExit, match=message):
        data.main(["--data", "sample:0.5,b", "--out", str(tmp_path)])


def test_the_cli_exits_with_one_line_on_a_bad_path(tmp_path):
    with pytest.raises(SystemExit, match="error: data path not found"):
        data.main(["--data", str(tmp_path / "missing"), "--out", str(tmp_path)])
