"""Spec for tokenizer.save_hf_tokenizer: the Hugging Face fast tokenizer it writes gives the ids of
our tiktoken encoding, through transformers' AutoTokenizer from a local folder (no network).

    python -m pytest -q tests/test_tokenizer_hf.py
"""
import json
import os
import random

import pytest
import tiktoken

pytest.importorskip("tokenizers", reason="save_hf_tokenizer needs tokenizers (optional)")
transformers = pytest.importorskip("transformers", reason="AutoTokenizer needs transformers")

import data  # noqa: E402  (after the skips: only run with the optional packages)
import evaluate_glue  # noqa: E402
import tokenizer  # noqa: E402

# text that a plain-English corpus lacks: accents, emoji (with joiners), \r\n, runs of spaces and
# tabs, Unicode spaces, controls, combining marks, other scripts, contractions and long numbers
UNUSUAL = [
    "naïve café, déjà vu — Ærøskøbing, Straße, ÅNGSTRÖM, señor",
    "emoji 🙂🙃👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 ♥️",
    "windows\r\nline\r\n\r\nends\rcr only\n\n\n",
    "runs of spaces:" + " " * 40 + "x\t\t\t  \n   \n" + " " * 17 + "end  ",
    "no-break\u00a0space, ideographic\u3000space, line\u2028separator, zero\u200bwidth",
    "numbers 1234567 3.14159 1,000,000 ٣٤٥ 12/31/1999 ⅷ",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "contractions: it's we'll THEY'RE I'D you've 'tis",
    "controls \x00\x01\x1b[0m \x7f and combining e\u0301 a\u0308",
    "Ελληνικά Кириллица עברית العربية हिन्दी",
    "symbols {json: [1, 2]} ~~~ !!! ??? ... --- ___ <html> ``code``",
]


def random_text(seed, n=3000):
    """Characters drawn from ASCII, whitespace, Latin-1, Greek, CJK, emoji and combining marks."""
    rng = random.Random(seed)
    ranges = [(32, 126), (9, 13), (160, 255), (0x370, 0x3ff), (0x4e00, 0x4e40), (0x1f600, 0x1f64f),
              (0x300, 0x36f), (0x2000, 0x200d)]
    return "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(n))


def save_and_load(enc, folder, max_length=None):
    tokenizer.save_hf_tokenizer(enc, str(folder), max_length=max_length)
    # local_files_only and HF_HUB_OFFLINE: a local folder, never the Hub
    return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


@pytest.fixture(scope="module", autouse=True)
def offline():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield


@pytest.fixture(scope="module")
def sample(sample_cache, tmp_path_factory):
    """(enc, tok, documents): the suite's 512-token BPE of the sample corpus and its HF twin."""
    meta = data.prepare_data("sample", sample_cache, {"vocab_size": 512}, progress=False)
    enc = tokenizer.load_tokenizer(meta["tokenizer"])
    tok = save_and_load(enc, tmp_path_factory.mktemp("hf"), max_length=128)
    return enc, tok, list(data.iter_documents(data.SAMPLE_CORPUS))


@pytest.fixture(scope="module")
def unusual_enc():
    """A 1024-token BPE that learned merges of the unusual bytes too."""
    docs = list(data.iter_documents(data.SAMPLE_CORPUS))
    return tokenizer.train_tokenizer([d[:20000] for d in docs] + UNUSUAL * 20, vocab_size=1024)


def assert_same(enc, tok, texts):
    """add_special_tokens=False gives encode_ordinary's ids, the default [CLS] ids [SEP]; decode
    round-trips."""
    ids = tokenizer.special_ids(enc)
    want = enc.encode_ordinary_batch(texts)
    assert tok(texts, add_special_tokens=False)["input_ids"] == want
    assert tok(texts)["input_ids"] == [[ids["cls"]] + w + [ids["sep"]] for w in want]
    assert [tok.decode(w) for w in want] == texts


# ------------------------------------------------------------------------------- the sample corpus

def test_every_document_of_the_sample_corpus_encodes_as_tiktoken_does(sample):
    enc, tok, docs = sample
    assert len(docs) == 42
    assert_same(enc, tok, docs)


def test_pairs_read_cls_a_sep_b_sep_as_evaluate_glue_builds_them(sample):
    enc, tok, docs = sample
    a, b = [d[1000:1400] for d in docs[:2]], [d[5000:5300] for d in docs[2:4]]
    got = tok(a, b)
    ids = tokenizer.special_ids(enc)
    join = evaluate_glue.join_pair
    want = [join(enc.encode_ordinary(x), enc.encode_ordinary(y), ids, max_len=10**6)
            for x, y in zip(a, b)]
    assert got["input_ids"] == want
    # our models have no segment embeddings: transformers must not pass token_type_ids to them
    assert set(got) == {"input_ids", "attention_mask"}


def test_mask_in_text_is_our_mask_id_and_takes_the_space_before_it(sample):
    """As model.fill_mask builds its input: the space before [MASK] belongs to the masked word."""
    enc, tok, _ = sample
    ids = tokenizer.special_ids(enc)
    for text in ["The cat [MASK] on the [MASK].", "[MASK] is the question", "to be[MASK]or not"]:
        want = enc.encode(text.replace(" [MASK]", "[MASK]"), allowed_special={"[MASK]"})
        assert ids["mask"] in want
        assert tok(text)["input_ids"] == [ids["cls"]] + want + [ids["sep"]]
    assert tok.mask_token == "[MASK]" and tok.mask_token_id == ids["mask"]


def test_files_are_written_atomically_and_the_special_ids_are_ours(sample, tmp_path):
    enc, _, _ = sample
    tok = save_and_load(enc, tmp_path, max_length=128)
    tok = save_and_load(enc, tmp_path, max_length=128)  # over an existing folder
    assert sorted(os.listdir(tmp_path)) == ["special_tokens_map.json", "tokenizer.json",
                                            "tokenizer_config.json"]
    config = json.load(open(tmp_path / "tokenizer_config.json"))
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "unk_token" not in config
    assert tok.model_max_length == 128 and len(tok) == enc.n_vocab
    assert {s: tok.convert_tokens_to_ids(s) for s in enc.special_tokens_set} == \
        {s: enc.encode_single_token(s) for s in enc.special_tokens_set}
    ids = tokenizer.special_ids(enc)
    assert [tok.pad_token_id, tok.cls_token_id, tok.sep_token_id] == [ids["pad"], ids["cls"],
                                                                      ids["sep"]]
    # special strings in text are specials, as enc.encode(text, allowed_special="all") makes them
    text = "a[CLS]b [SEP] c[PAD][RESERVED_0]"
    want = enc.encode(text, allowed_special="all")
    assert tok(text, add_special_tokens=False)["input_ids"] == want


# -------------------------------------------------------------------------------- other tokenizers

def test_unusual_bytes_encode_as_tiktoken_does(unusual_enc, tmp_path):
    tok = save_and_load(unusual_enc, tmp_path)
    assert_same(unusual_enc, tok, UNUSUAL + [random_text(seed) for seed in range(5)])


@pytest.mark.parametrize("name", ["gpt2", "cl100k_base"])
def test_stock_encodings_with_their_own_split_pattern_and_specials(name, monkeypatch, tmp_path):
    """stock_tokenizer(name) as built from tiktoken's own recipe (pattern, specials and their ids),
    with ranks trained here on that pattern, as the real ranks cannot be downloaded."""
    import tiktoken_ext.openai_public as openai_public
    def recipe_with(ranks):  # tiktoken's recipe for name, its downloads replaced by ranks
        for loader in ["load_tiktoken_bpe", "data_gym_to_mergeable_bpe_ranks"]:
            monkeypatch.setattr(openai_public, loader, lambda *a, **k: ranks)
        return getattr(openai_public, name)()
    pattern = recipe_with({bytes([i]): i for i in range(256)})["pat_str"]
    docs = [d[:20000] for d in data.iter_documents(data.SAMPLE_CORPUS)] + UNUSUAL * 20
    ranks = tokenizer.train_tokenizer(docs, 1024, pattern=pattern)._mergeable_ranks
    recipe = {k: v for k, v in recipe_with(ranks).items() if k != "explicit_n_vocab"}
    monkeypatch.setattr(tiktoken, "get_encoding", lambda n: tiktoken.Encoding(**recipe))
    enc = tokenizer.stock_tokenizer(name)
    tok = save_and_load(enc, tmp_path)
    assert_same(enc, tok, UNUSUAL + [random_text(seed) for seed in range(3)] + docs[:3])
    assert tok.convert_tokens_to_ids("<|endoftext|>") == recipe["special_tokens"]["<|endoftext|>"]


def test_a_token_that_no_merge_reaches_comes_only_from_a_piece_that_is_exactly_it(tmp_path):
    """tiktoken takes a piece that is a whole token as that token before merging (ignore_merges)."""
    ranks = {**{bytes([i]): i for i in range(256)}, b"xyz": 256}  # no "xy" or "yz" to build it from
    enc = tokenizer._with_specials("unreachable", r"\S+|\s+", ranks)
    tok = save_and_load(enc, tmp_path)
    assert enc.encode_ordinary("xyz xyzw") == [256, 32, 120, 121, 122, 119]
    assert_same(enc, tok, ["xyz xyzw", " xyz\n"])


def test_an_encoding_without_our_specials_is_a_one_line_error(tmp_path):
    ranks = {bytes([i]): i for i in range(256)}
    plain = tiktoken.Encoding("plain", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={})
    message = r"plain: no \[PAD\] \[CLS\] \[SEP\] \[MASK\]; supported"
    with pytest.raises(ValueError, match=message) as e:
        tokenizer.save_hf_tokenizer(plain, str(tmp_path))
    assert "\n" not in str(e.value) and os.listdir(tmp_path) == []


def test_a_split_pattern_that_tokenizers_reads_differently_is_a_one_line_error(tmp_path):
    """`$` ends the text in tiktoken's regex engine but any line in Oniguruma (tokenizers')."""
    enc = tokenizer.train_tokenizer(["word  \n next  \n b"] * 50, 320, pattern=r"\s+$|\s+|\S+")
    with pytest.raises(ValueError, match="growcram: tokenizers splits text differently") as e:
        tokenizer.save_hf_tokenizer(enc, str(tmp_path / "hf"))
    assert "\n" not in str(e.value) and not os.path.exists(tmp_path / "hf")


# ------------------------------------------------------------- cleaning, causal, and reading back

@pytest.mark.parametrize("clean", [
    {"normalize": "NFC"},
    {"normalize": "NFC", "lowercase": True},
    {"normalize": "NFKC", "strip_accents": True},
    {"normalize": "NFC", "lowercase": True, "strip_accents": True},
], ids=["nfc", "lowercase", "nfkc-strip-accents", "all"])
def test_the_tokenizer_cleans_any_text_as_the_data_pipeline_does(unusual_enc, tmp_path, clean):
    """ids through transformers == ids of data.clean_text then our tokenizer, on text that is not
    clean: decomposed accents, capitals, compatibility characters, random code points."""
    tokenizer.save_hf_tokenizer(unusual_enc, str(tmp_path), clean=clean)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    texts = ["Cafe\u0301 nai\u0308ve re\u0301sume\u0301", "ÅNGSTRÖM Straße ﬁ ① Ｆｕｌｌ",
             *UNUSUAL, *[random_text(seed, 1000) for seed in range(5)]]
    if clean.get("lowercase"):
        # the one known difference: str.lower turns a word-final capital sigma into "ς",
        # tokenizers' Lowercase works character by character ("σ")
        texts = [t.replace("Σ", "") for t in texts]
    for text in texts:
        want = unusual_enc.encode_ordinary(data.clean_text(text, **clean)[0])
        assert tok(text, add_special_tokens=False)["input_ids"] == want, text[:40]
    # the specials are never cleaned: [MASK] stays our mask id under lowercasing
    assert tok("[MASK]", add_special_tokens=False)["input_ids"] == \
        [tokenizer.special_ids(unusual_enc)["mask"]]


def test_a_causal_tokenizer_starts_with_sep_and_appends_nothing(sample, tmp_path):
    enc, _, _ = sample
    tokenizer.save_hf_tokenizer(enc, str(tmp_path), causal=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    sep = tokenizer.special_ids(enc)["sep"]
    assert tok("to be or not")["input_ids"] == [sep, *enc.encode_ordinary("to be or not")]


def test_the_hugging_face_file_reads_back_as_the_same_tokenizer(unusual_enc, tmp_path):
    """transformers' save_pretrained keeps tokenizer.json; load_tokenizer reads it back, so a
    fine-tuned folder trains and evaluates in growcram with the ids it was trained on."""
    tokenizer.save_hf_tokenizer(unusual_enc, str(tmp_path / "hf"))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    tok.save_pretrained(str(tmp_path / "again"))
    back = tokenizer.load_tokenizer(str(tmp_path / "again" / "tokenizer.json"))
    assert back.n_vocab == unusual_enc.n_vocab
    assert tokenizer.special_ids(back) == tokenizer.special_ids(unusual_enc)
    for text in [*UNUSUAL, random_text(7)]:
        assert back.encode_ordinary(text) == unusual_enc.encode_ordinary(text)
    # another model's tokenizer.json is a one-line error naming the file
    (tmp_path / "wordpiece.json").write_text(json.dumps({"model": {"type": "WordPiece",
                                                                   "vocab": {"a": 0}}}))
    with pytest.raises(ValueError, match="wordpiece.json: not a tokenizer growcram's export"):
        tokenizer.load_tokenizer(str(tmp_path / "wordpiece.json"))
