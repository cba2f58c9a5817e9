"""tokenizer.py: train, save, load and use the byte-level BPE tokenizer, as a tiktoken.Encoding.

    enc = train_tokenizer(texts, vocab_size=32768)  # rustbpe learns merges from an iterable of str
    save_tokenizer(enc, "tokenizer.json")           # plain JSON, no pickle
    enc = load_tokenizer("tokenizer.json")
    enc = stock_tokenizer("gpt2")                   # or a stock tiktoken encoding plus our specials
    save_hf_tokenizer(enc, "hf")                    # the same tokenizer for transformers
    ids = enc.encode_ordinary("some text")          # never emits a special token
    sep = special_ids(enc)["sep"]                   # specials go in by id: pad, cls, sep, mask

The vocabulary is laid out as ids 0 .. n_ordinary(enc) - 1 for the 256 bytes and the learned merges
(a token's id is its merge rank), then [PAD] [CLS] [SEP] [MASK], then [RESERVED_i] ids that pad
n_vocab up to a multiple of 64. Training needs rustbpe; everything else needs only tiktoken and the
standard library (save_hf_tokenizer: also Hugging Face `tokenizers`), so this file can be copied
into another project on its own.
"""
import base64
import json
import os
import unicodedata

import tiktoken

# GPT-4's split pattern with numbers grouped by at most 2 digits (nanochat: best at a 32K
# vocabulary). It cuts text into pieces before BPE runs, so that no merge crosses the edge of a
# word, a number or punctuation.
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}"""
                 r"""| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+""")
SPECIAL_TOKENS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]"]  # BERT's (Devlin et al. 2019, sec. 3)
MIN_RESERVED = 4  # spare special ids ("[RESERVED_i]") so later features need no new vocabulary
VOCAB_MULTIPLE = 64  # n_vocab is a multiple of this (tensor-core friendly; model.py pads alike)
TOKENIZER_FORMAT, TOKENIZER_VERSION = "growcram-tokenizer", 1  # the JSON file's "format", "version"


def round_up(n, multiple):
    return -(-n // multiple) * multiple  # -(-a // b) is ceil(a / b) in integer arithmetic


# -------------------------------------------------------------------------------------------------
# Making a tokenizer: train one with rustbpe, or take a stock tiktoken one; both get our specials

def train_tokenizer(texts, vocab_size=32768, pattern=SPLIT_PATTERN):
    """Byte-level BPE trained by rustbpe on an iterable of str -> tiktoken.Encoding.

    vocab_size is rounded up to a multiple of 64; 256 byte tokens + merges + 8 specials/reserved
    fill it. A corpus too small for that many merges gives fewer merges and n_vocab = the next
    multiple of 64."""
    import rustbpe  # training only; encoding needs tiktoken alone
    n_special = len(SPECIAL_TOKENS) + MIN_RESERVED
    if vocab_size < 256 + n_special:
        raise ValueError(f"vocab_size {vocab_size} is too small: 256 byte tokens + {n_special} "
                         "specials at least")
    bpe = rustbpe.Tokenizer()
    # the merges fill the vocabulary but for the specials, which _with_specials appends after them
    n_merged = round_up(vocab_size, VOCAB_MULTIPLE) - n_special
    bpe.train_from_iterator(iter(texts), n_merged, pattern=pattern)
    # rank == token id == merge priority: tiktoken encodes by applying the lowest-ranked merge first
    ranks = {bytes(b): rank for b, rank in bpe.get_mergeable_ranks()}
    return _with_specials("growcram", bpe.get_pattern(), ranks)


def stock_tokenizer(name):
    """A stock tiktoken encoding ('gpt2', 'cl100k_base') plus our specials. Needs its ranks cached
    in $TIKTOKEN_CACHE_DIR or a network connection; otherwise a one-line ValueError."""
    try:
        base = tiktoken.get_encoding(name)
    except Exception as e:
        first_line = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"tokenizer '{name}': ranks not in $TIKTOKEN_CACHE_DIR and not "
                         f"downloadable ({type(e).__name__}: {first_line}); "
                         f"use --tokenizer train or a tokenizer.json path") from None
    ranks = {b: base.encode_single_token(b) for b in base.token_byte_values()}
    # the stock specials (gpt2's <|endoftext|>) keep their ids; ours follow the largest id
    specials = {s: base.encode_single_token(s) for s in base.special_tokens_set}
    return _with_specials(f"{name}+growcram", base._pat_str, ranks, specials)


def _with_specials(name, pattern, ranks, base_specials=None):
    """tiktoken.Encoding whose specials follow every existing id, reserved ids padding n_vocab to a
    multiple of 64 (tensor-core friendly embedding and output matrices)."""
    base_specials = dict(base_specials or {})
    first = max([len(ranks) - 1, *base_specials.values()]) + 1
    n_vocab = round_up(first + len(SPECIAL_TOKENS) + MIN_RESERVED, VOCAB_MULTIPLE)
    n_reserved = n_vocab - first - len(SPECIAL_TOKENS)  # MIN_RESERVED or more, to a multiple of 64
    names = SPECIAL_TOKENS + [f"[RESERVED_{i}]" for i in range(n_reserved)]
    specials = {**base_specials, **{s: first + i for i, s in enumerate(names)}}
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)


# -------------------------------------------------------------------------------------------------
# Using it: the special ids, and where the ordinary ids end

def special_ids(enc):
    """{"pad", "cls", "sep", "mask"} -> token id. Insert specials by id; encode_ordinary never emits
    them."""
    return {s.strip("[]").lower(): enc.encode_single_token(s) for s in SPECIAL_TOKENS}


def n_ordinary(enc):
    """Ids below this are ordinary (byte/merge) tokens; ids at or above it are special."""
    # The masking and the models' output heads rely on it: random replacements are drawn below it.
    return min(enc.encode_single_token(s) for s in enc.special_tokens_set)


# -------------------------------------------------------------------------------------------------
# Saving and loading: plain JSON, so a tokenizer file is readable and never runs code (no pickle)

def save_tokenizer(enc, path):
    """Plain JSON (no pickle): format/version, name, split pattern, base64 tokens in rank order,
    specials."""
    ranks = {b: enc.encode_single_token(b) for b in enc.token_byte_values()}
    by_rank = sorted(ranks, key=ranks.get)
    # the file stores tokens in rank order, so the ranks must be exactly 0..n-1 to round-trip
    if [ranks[b] for b in by_rank] != list(range(len(by_rank))):
        raise ValueError(f"{path}: cannot save a tokenizer whose ranks are not "
                         f"0..{len(by_rank) - 1}")
    specials = sorted(enc.special_tokens_set, key=enc.encode_single_token)
    doc = {"format": TOKENIZER_FORMAT, "version": TOKENIZER_VERSION, "name": enc.name,
           "pattern": enc._pat_str, "n_vocab": enc.n_vocab,
           "special_tokens": {s: enc.encode_single_token(s) for s in specials},
           # bytes are not JSON: the tokens are stored as base64
           "ranks": [base64.b64encode(b).decode("ascii") for b in by_rank]}
    _write_atomic(path, json.dumps(doc, indent=1))


def _write_atomic(path, text):
    # Written beside path and renamed into place (atomic in one folder): a crash never leaves half a
    # file. (files.atomic_write does the same; this file imports nothing of the project.)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(text.encode("utf-8"))
    os.replace(tmp, path)


def load_tokenizer(path):
    """tokenizer.json -> tiktoken.Encoding; a one-line ValueError names the file on any problem."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        raise ValueError(f"tokenizer file not found: {path}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a tokenizer file (invalid JSON: {e})") from None
    if isinstance(doc, dict) and doc.get("format") is None and "model" in doc:
        return _from_hf(doc, path)  # the Hugging Face tokenizer.json of an export
    if not isinstance(doc, dict) or doc.get("format") != TOKENIZER_FORMAT:
        raise ValueError(f"{path}: not a growcram tokenizer file "
                         f"(format field is not '{TOKENIZER_FORMAT}')")
    if doc.get("version") != TOKENIZER_VERSION:
        raise ValueError(f"{path}: tokenizer format version {doc.get('version')}, this data.py "
                         f"reads version {TOKENIZER_VERSION}; re-create it with `python data.py`")
    try:
        # a token's place in the list is its rank, hence its id
        ranks = {base64.b64decode(t, validate=True): i for i, t in enumerate(doc["ranks"])}
        specials = {s: int(i) for s, i in doc["special_tokens"].items()}
        enc = tiktoken.Encoding(doc["name"], pat_str=doc["pattern"], mergeable_ranks=ranks,
                                special_tokens=specials)
    except Exception as e:
        raise ValueError(f"{path}: corrupt tokenizer file ({type(e).__name__}: {e})") from None
    # the stored n_vocab and the four specials catch a file cut short or edited by hand
    missing = [s for s in SPECIAL_TOKENS if s not in enc.special_tokens_set]
    if enc.n_vocab != doc.get("n_vocab") or missing:
        raise ValueError(f"{path}: corrupt tokenizer file (n_vocab or special tokens do not match)")
    return enc


# -------------------------------------------------------------------------------------------------
# Hugging Face: the same tokenizer as a `tokenizers` byte-level BPE, for transformers' AutoTokenizer

HF_SUPPORTED = "our trained BPE (train_tokenizer, load_tokenizer), gpt2 and cl100k_base"
# how transformers finds the specials (tokenizer_config.json and special_tokens_map.json)
HF_SPECIAL_NAMES = {"pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                    "mask_token": "[MASK]"}


def save_hf_tokenizer(enc, folder, max_length=None, clean=None, causal=False):
    """folder/tokenizer.json, tokenizer_config.json and special_tokens_map.json: a fast tokenizer
    that AutoTokenizer.from_pretrained(folder) loads, with the ids of enc. tok(a) gives
    [CLS] a [SEP] and tok(a, b) [CLS] a [SEP] b [SEP], as our encoders read text (loader.py,
    evaluate_glue.py); causal=True gives [SEP] a instead, a document's start in a decoder's
    training stream; add_special_tokens=False gives enc.encode_ordinary's ids.
    clean: data.clean_text's keyword arguments (meta.json's settings["clean"]): the tokenizer
    normalizes text the same way first. Needs `tokenizers`. max_length: the model's positions,
    saved as model_max_length."""
    tok = _hf_tokenizer(enc, causal=causal)
    if clean:
        tok.normalizer = _hf_normalizer(**clean)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **HF_SPECIAL_NAMES,
              # our models have no segment embeddings, so no token_type_ids
              "model_input_names": ["input_ids", "attention_mask"],
              # decode returns the text as it was ("a ." stays "a ."), as enc.decode does
              "clean_up_tokenization_spaces": False}
    # no unk_token: every byte is a token, so nothing is unknown
    if max_length is not None:
        config["model_max_length"] = int(max_length)
    os.makedirs(folder, exist_ok=True)
    _write_atomic(os.path.join(folder, "tokenizer.json"), tok.to_str(pretty=True))
    for name, doc in [("tokenizer_config.json", config),
                      ("special_tokens_map.json", HF_SPECIAL_NAMES)]:
        _write_atomic(os.path.join(folder, name), json.dumps(doc, indent=1))


def _hf_normalizer(normalize="NFC", lowercase=False, strip_accents=False):
    """data.clean_text's steps, in its order, as a tokenizers normalizer (None: nothing to do)."""
    from tokenizers import Regex, normalizers
    forms = {"NFC": normalizers.NFC, "NFKC": normalizers.NFKC, "NFD": normalizers.NFD,
             "NFKD": normalizers.NFKD}
    steps = [forms[normalize]()] if normalize else []
    if lowercase:
        # per character, where str.lower also knows a word-final capital sigma becomes "ς"
        steps.append(normalizers.Lowercase())
    if strip_accents:
        # clean_text: NFD, drop the combining marks, back to the chosen form. tokenizers'
        # StripAccents drops a slightly different set (category Mn), so the marks are removed by
        # the set clean_text uses: every character with a nonzero combining class
        marks = normalizers.Replace(Regex(_combining_marks_class()), "")
        steps += [normalizers.NFD(), marks, forms[normalize or "NFC"]()]
    return normalizers.Sequence(steps) if steps else None


def _combining_marks_class():
    """A regex character class of every code point whose Unicode combining class is not 0
    (unicodedata.combining, as data.clean_text's accent stripping tests), as ranges."""
    marks = [c for c in range(0x110000) if unicodedata.combining(chr(c))]
    ranges, start = [], marks[0]
    for prev, c in zip(marks, marks[1:] + [None]):
        if c != prev + 1:
            ranges.append(f"\\x{{{start:x}}}-\\x{{{prev:x}}}" if prev > start
                          else f"\\x{{{start:x}}}")
            start = c
    return "[" + "".join(ranges) + "]"


def _hf_tokenizer(enc, causal=False):
    """enc as a tokenizers.Tokenizer: byte-level BPE, our split regex, our specials and ids."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )
    missing = [s for s in SPECIAL_TOKENS if s not in enc.special_tokens_set]
    if missing:
        raise ValueError(f"{enc.name}: no {' '.join(missing)}; supported: {HF_SUPPORTED}")
    vocab, merges = _hf_vocab_and_merges(enc)
    specials = sorted(enc.special_tokens_set, key=enc.encode_single_token)
    ids = {s: enc.encode_single_token(s) for s in specials}
    # an added token takes the model's id for it, else the next free one: listing the specials in
    # the vocabulary keeps our ids (and gaps, as cl100k_base has) (tokenizers added_vocabulary.rs)
    vocab.update(ids)
    # ignore_merges: a piece that is a whole token becomes that token, as in tiktoken (lib.rs)
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    try:
        split = pre_tokenizers.Split(Regex(enc._pat_str), behavior="isolated")
    except Exception as e:  # tokenizers' regex engine (Oniguruma) cannot compile the pattern
        raise ValueError(f"{enc.name}: split pattern not supported by tokenizers ({e}); "
                         f"supported: {HF_SUPPORTED}") from None
    # the regex cuts text into pieces as tiktoken does, then ByteLevel maps each byte to a character
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # [MASK] takes the spaces before it (lstrip, as RoBERTa's <mask>): in training a masked token
    # was a whole " word" with its space, and model.fill_mask drops that space the same way
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False, lstrip=s == "[MASK]")
                            for s in specials])
    cls, sep = ids["[CLS]"], ids["[SEP]"]
    if causal:
        # A decoder's training stream is documents joined by [SEP] (loader.py): a prompt starts
        # after one, and ends where the text does, with nothing appended
        tok.post_processor = processors.TemplateProcessing(
            single="[SEP] $A", pair="[SEP] $A $B:0", special_tokens=[("[SEP]", sep)])
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:0 [SEP]:0",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    # a split pattern that Oniguruma reads differently from tiktoken's fancy-regex shows up here
    probe = "It's 2024: café, 日本語 🙂 ok?!\r\n\t  x 'LL  \u00a0\u3000y  \n b \r\n\n"
    if tok.encode(probe, add_special_tokens=False).ids != enc.encode_ordinary(probe):
        raise ValueError(f"{enc.name}: tokenizers splits text differently from tiktoken; "
                         f"supported: {HF_SUPPORTED}")
    return tok


def _from_hf(doc, path):
    """The tiktoken.Encoding back from a tokenizer.json that save_hf_tokenizer wrote (or that
    transformers saved again after fine-tuning): a token's id is its rank, as written."""
    try:
        vocab = doc["model"]["vocab"]
        specials = {t["content"]: int(t["id"]) for t in doc["added_tokens"] if t["special"]}
        # the split regex is the first step of the pre-tokenizer sequence (_hf_tokenizer)
        pattern = doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
        byte_of = {c: b for b, c in _byte_to_char().items()}
        ranks = {bytes(byte_of[c] for c in token): int(i) for token, i in vocab.items()
                 if token not in specials}
        enc = tiktoken.Encoding("growcram-from-hf", pat_str=pattern, mergeable_ranks=ranks,
                                special_tokens=specials)
    except Exception as e:  # another kind of tokenizer (WordPiece, SentencePiece), or damaged
        raise ValueError(f"{path}: not a tokenizer growcram's export wrote (byte-level BPE with "
                         f"its split pattern; {type(e).__name__}: {e})") from None
    missing = [s for s in SPECIAL_TOKENS if s not in enc.special_tokens_set]
    if missing:
        raise ValueError(f"{path}: no {' '.join(missing)}; not a growcram tokenizer")
    return enc


def _hf_vocab_and_merges(enc):
    """tiktoken ranks -> a `tokenizers` BPE vocab {str: id} and merges [(str, str)], rank order."""
    ranks = {b: enc.encode_single_token(b) for b in enc.token_byte_values()}
    char = _byte_to_char()
    def text(token):
        return "".join(char[b] for b in token)
    merges = []
    # merge i of a tokenizers BPE is applied before merge i + 1, as rank r before rank r + 1
    for token in sorted(ranks, key=ranks.get):
        parts = _bpe_split(token, ranks) if len(token) > 1 else None
        if parts:
            merges.append((text(parts[0]), text(parts[1])))
    return {text(b): r for b, r in ranks.items()}, merges


def _bpe_split(token, ranks):
    """The two tokens whose merge makes token when tiktoken encodes its bytes, or None when that
    never happens (then only a piece that is exactly token gives it, in both libraries)."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        # tiktoken's byte_pair_merge (lib.rs): merge the adjacent pair whose concatenation has the
        # lowest rank, the leftmost one on a tie
        pairs = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:]))
                 if a + b in ranks]
        if not pairs:
            return None
        _, i = min(pairs)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def _byte_to_char():
    """GPT-2's bytes_to_unicode (openai/gpt-2 src/encoder.py), the alphabet of `tokenizers`'
    ByteLevel: a printable Latin-1 byte stands for itself, the other 68 for chr(256), chr(257)..."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}
