"""export.py: a growcram checkpoint as a folder that Hugging Face transformers loads.

    python export.py runs/cram/final runs/cram/hf        # or export.export(checkpoint, out)

    from transformers import AutoModelForMaskedLM, AutoTokenizer
    net = AutoModelForMaskedLM.from_pretrained("runs/cram/hf", trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained("runs/cram/hf")

OUT holds model.safetensors (our state dict with plain keys), config.json (our config keys under
"growcram", an auto_map to the classes in modeling_growcram.py), growcram_model.py (model.py's
network code, copied at export time without its command line), modeling_growcram.py (transformers'
PreTrainedModel classes around it), the tokenizer (tokenizer.save_hf_tokenizer) and a model card,
README.md. Shipping our own code is cramming's route (Geiping & Goldstein 2022: the crammed-bert
model on the Hub loads its ScriptableLM through trust_remote_code), because only two families of
our configs compute exactly what a stock transformers class computes. modeling_growcram.py answers
every Auto class a user fine-tunes with: AutoModel (the trunk), AutoModelForMaskedLM or
AutoModelForCausalLM, AutoModelForSequenceClassification and AutoModelForTokenClassification (a
fresh head from num_labels). A folder transformers saves after fine-tuning reads back here.

- ModernBERT (Warner et al. 2024) is the nearest encoder (pre-LN, no biases, GeGLU, rotary, an
  embedding norm, a final norm) and maps exactly with its two differences set: no attention norm
  in the first layer (first_attention_norm=False) and dense -> GELU -> norm between the final norm
  and the tied decoder (head_transform=True). model.ARCHITECTURES["modernbert"] (train.py --arch
  modernbert) sets both; those checkpoints export as stock "modernbert" models, every layer global,
  which load without trust_remote_code. The crammed default keeps cramming's choices (an attention
  norm in every block, no head transform: skip_head_transform) and ships its own code.
- BERT (Devlin et al. 2019): norm_position=post, positions=learned, activation=gelu,
  norm=layernorm, embedding_norm=True is BertModel's trunk exactly (q, k, v split out of qkv, zero
  biases where bias=False, a zero token-type table), but BERT's MLM head has the same dense + act +
  LayerNorm transform (act = the feed-forward's hidden_act) and its pooler uses tanh where ours
  uses GELU, so neither head maps.
- GPT-2 (Radford et al. 2019) does map: objective=clm, positions=learned, activation=gelu,
  norm=layernorm, norm_position=pre, embedding_norm=False is GPT2LMHeadModel exactly (its Conv1D
  weights are our Linear weights transposed; zero biases where bias=False). Those checkpoints are
  exported as stock "gpt2" models, which load without trust_remote_code.

load_exported(folder) reads every kind back as our model.Transformer (for train.py --init-from and
evaluate_glue.py --checkpoint).
transformers, safetensors and tokenizers stay optional for the rest of growcram: only the functions
here that need them import them.
"""
import argparse
import ast
import json
import os
import shutil
import tempfile

import torch

import model

# torch.compile keeps the model in ._orig_mod, DistributedDataParallel in .module, and their state
# dicts carry the prefix (nanoGPT strips "_orig_mod." on resume; cramming issues #9 and #34 are
# exports failing on it). Both can nest, in either order: DDP(compile(net)) or compile(DDP(net)).
WRAPPER_PREFIXES = ("_orig_mod.", "module.")
# The attribute that holds growcram's network in modeling_growcram.py's classes: a folder that
# transformers' save_pretrained wrote has every key under it.
HF_PREFIX = "growcram."
# The transformers Auto class and our wrapper class per kind of checkpoint: the one in the model
# card and config.json's "architectures"
AUTO_CLASSES = {"mlm": ("AutoModelForMaskedLM", "GrowcramForMaskedLM"),
                "clm": ("AutoModelForCausalLM", "GrowcramForCausalLM"),
                "cls": ("AutoModelForSequenceClassification",
                        "GrowcramForSequenceClassification")}
# Every export answers these Auto classes too: the trunk, and fresh heads to fine-tune
# (from_pretrained(..., num_labels=n) sizes them)
SHARED_AUTO_CLASSES = {"AutoModel": "GrowcramModel",
                       "AutoModelForSequenceClassification": "GrowcramForSequenceClassification",
                       "AutoModelForTokenClassification": "GrowcramForTokenClassification"}


def need_hf():
    """transformers and safetensors, or a one-line ValueError saying how to get them."""
    # Imported here, not at the top: growcram trains and evaluates without them, and a user who
    # only exports gets one line naming the packages rather than a traceback at import.
    try:
        import safetensors.torch  # noqa: F401
        import transformers
    except ImportError as e:
        raise ValueError(f"export needs transformers and safetensors ({e}); "
                         "pip install transformers safetensors tokenizers") from None
    return transformers


# -----------------------------------------------------------------------------
# Reading a checkpoint

def plain_keys(state):
    """The state dict with the torch.compile and DDP prefixes stripped from every key."""
    out = {}
    for key, tensor in state.items():
        while key.startswith(WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]          # both prefixes are one dotted name long
        out[key] = tensor
    return out


def read_checkpoint(folder):
    """Our plain model.Transformer from a model.py folder, whatever wrapper saved its weights; a
    one-line ValueError naming the file when something is missing or damaged."""
    if not os.path.isdir(folder):
        raise ValueError(f"{folder}: no such checkpoint folder")
    config_path, weights = os.path.join(folder, "config.json"), os.path.join(folder, "model.pt")
    for path in (config_path, weights):
        if not os.path.isfile(path):
            raise ValueError(f"{path}: missing; a checkpoint folder holds config.json and model.pt")
    try:
        with open(config_path) as f:
            cfg = model.validate_config(json.load(f))
    except ValueError as e:                     # JSONDecodeError is a ValueError too
        raise ValueError(f"{config_path}: damaged ({str(e).splitlines()[0]})") from None
    # model.load_model would do the rest, but it loads the keys as they are; the prefixes are why
    # the weights go in here. weights_only=True: tensors and plain containers, no pickled code.
    try:
        state = plain_keys(torch.load(weights, map_location="cpu", weights_only=True))
        net = model.build_model(cfg)
        net.load_state_dict(state)
    except Exception as e:                      # truncated, foreign, or another config's weights
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"{weights}: damaged or not this config's weights "
                         f"({type(e).__name__}: {first[:200]})") from None
    return net.eval()


def read_labels(folder, cfg):
    """Class names for a classifier: labels.json (evaluate_glue.py --save-model) or LABEL_i."""
    # Our checkpoints store class ids only; the names come from the task's "classes" list (the
    # GLUE TSV label strings, in evaluate_glue.py's id order), so id2label reads "entailment".
    path = os.path.join(folder, "labels.json")
    names = None
    if os.path.isfile(path):
        with open(path) as f:
            names = json.load(f)
    n = cfg["num_labels"]
    # A regression head (STS-B) has one output and no classes: labels.json holds null.
    if not isinstance(names, list) or len(names) != n:
        names = ["score"] if n == 1 else [f"LABEL_{i}" for i in range(n)]
    return [str(name) for name in names]


def kind_of(cfg):
    """mlm, clm or cls: which transformers head class a checkpoint becomes."""
    # A classifier keeps its pretraining objective in the config, but its useful output is the
    # classify() head, so the head decides (a GLUE checkpoint is "cls", whatever trunk it has).
    return "cls" if cfg["num_labels"] else cfg["objective"]


def stock_name(cfg):
    """'GPT-2' or 'ModernBERT' when the config is exactly that stock transformers model, else
    None (the export ships its own modeling code)."""
    return "GPT-2" if is_gpt2(cfg) else "ModernBERT" if is_modernbert(cfg) else None


def is_gpt2(cfg):
    """True when the config computes exactly GPT-2's function (see the module docstring)."""
    return (cfg["objective"] == "clm" and not cfg["num_labels"] and cfg["positions"] == "learned"
            and cfg["activation"] == "gelu" and cfg["norm"] == "layernorm"
            and cfg["norm_position"] == "pre" and not cfg["embedding_norm"]
            and not cfg["qk_norm"] and not cfg["value_residual"])


# -----------------------------------------------------------------------------
# The remote code

def network_source():
    """growcram_model.py: model.py's text without main() and its __main__ guard.

    transformers' dynamic-module check (dynamic_module_utils.check_imports) walks the whole syntax
    tree, function bodies included, and refuses to load a file whose imports are not installed;
    main's lazy `import tokenizer` would trip it for anyone without growcram on sys.path."""
    with open(model.__file__, encoding="utf-8") as f:
        src = f.read()
    lines = src.splitlines(keepends=True)
    # The syntax tree gives each top-level statement's exact lines; deleting from the end keeps
    # the earlier line numbers valid. Everything else is model.py byte for byte, so the exported
    # network can never drift from the one that was trained.
    for node in reversed(ast.parse(src).body):
        is_main = isinstance(node, ast.FunctionDef) and node.name == "main"
        if is_main or (isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)):
            del lines[node.lineno - 1:node.end_lineno]
    header = ("# growcram_model.py: growcram's model.py, written by export.py with its command\n"
              "# line left out. The network in this folder's model.safetensors; edit model.py, "
              "not this copy.\n")
    return header + "".join(lines).rstrip() + "\n"


# modeling_growcram.py: transformers' classes around the copied network. Kept here as text (not as
# a second module) because it imports transformers at the top, as remote code must, and growcram
# must import without transformers.
MODELING = '''"""modeling_growcram.py: growcram's Transformer (growcram_model.py) as transformers
models, one class per Auto class.

Written by growcram's export.py. Load with trust_remote_code=True; the weights in model.safetensors
are the plain growcram state dict, under the prefix "growcram." here.
"""
import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import (BaseModelOutput, CausalLMOutput, MaskedLMOutput,
                                           SequenceClassifierOutput, TokenClassifierOutput)

from .growcram_model import Block, Transformer, validate_config


class GrowcramConfig(PretrainedConfig):
    """growcram's config dict under "growcram", mirrored into the names transformers reads."""
    model_type = "growcram"

    def __init__(self, growcram=None, classifier_pooling=None, **kwargs):
        self.growcram = cfg = validate_config(growcram or {})
        self.vocab_size, self.hidden_size = cfg["vocab_size"], cfg["d_model"]
        self.num_hidden_layers, self.num_attention_heads = cfg["n_layers"], cfg["n_heads"]
        self.max_position_embeddings = cfg["max_seq_len"]
        # what a sequence classifier pools, "cls" or "mean" (ModernBERT's name for it), so that
        # from_pretrained(..., classifier_pooling="mean") chooses it
        self.classifier_pooling = classifier_pooling or cfg["pooling"]
        # the network ties its own embeddings; there is no KV cache to use
        kwargs.update(tie_word_embeddings=False, use_cache=False)
        super().__init__(**kwargs)


class GrowcramPreTrainedModel(PreTrainedModel):
    config_class = GrowcramConfig
    base_model_prefix = "growcram"
    _no_split_modules = ["Block"]

    def __init__(self, config):
        super().__init__(config)
        self.growcram = Transformer(config.growcram)

    def _init_weights(self, module):
        # The buffers left out of the state dict (the sinusoid table, ALiBi's slopes, the value
        # residual's weights) are filled here, since from_pretrained may create the modules
        # without data. Weights missing from the checkpoint (a fresh head) get growcram's own init.
        if isinstance(module, (Transformer, Block)):
            module.fill_buffers()
        elif isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, std=self.config.growcram["init_std"])
            if getattr(module, "bias", None) is not None:
                torch.nn.init.zeros_(module.bias)

    def get_input_embeddings(self):
        return self.growcram.tok_emb

    def lm_logits(self, input_ids, attention_mask, position_ids):
        """(B, T) -> (B, T, vocab_size): the padding rows of the embedding are left out."""
        h = self.growcram.encode(input_ids, attention_mask, position_ids)
        return self.growcram.logits(h)[..., :self.config.vocab_size]


class GrowcramModel(GrowcramPreTrainedModel):
    """The trunk (AutoModel, the feature-extraction pipeline): last_hidden_state (B, T, d), the
    hidden states after the final norm."""

    def __init__(self, config):
        super().__init__(config)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        h = self.growcram.encode(input_ids, attention_mask, position_ids)
        return BaseModelOutput(last_hidden_state=h)


class GrowcramForMaskedLM(GrowcramPreTrainedModel):
    """Masked LM: scores at every position (growcram's sparse prediction is for training)."""

    def __init__(self, config):
        super().__init__(config)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, position_ids=None, **kwargs):
        logits = self.lm_logits(input_ids, attention_mask, position_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(),
                                   ignore_index=-100)
        return MaskedLMOutput(loss=loss, logits=logits)


class GrowcramForCausalLM(GrowcramPreTrainedModel, GenerationMixin):
    """Causal LM. labels = input_ids, shifted here (transformers' convention). No KV cache:
    generate re-reads the last max_seq_len tokens at every step, as growcram's generate does."""

    def __init__(self, config):
        super().__init__(config)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, position_ids=None, **kwargs):
        logits = self.lm_logits(input_ids, attention_mask, position_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, -2).float(),
                                   labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        n = self.config.growcram["max_seq_len"]
        mask = None if attention_mask is None else attention_mask[:, -n:]
        return {"input_ids": input_ids[:, -n:], "attention_mask": mask}


class GrowcramForSequenceClassification(GrowcramPreTrainedModel):
    """growcram's classify(): pooled ([CLS] or mean) -> dense + GELU -> num_labels outputs
    (num_labels == 1: regression with mean squared error)."""

    def __init__(self, config):
        # The head has config.num_labels outputs (from_pretrained(..., num_labels=3) sets them): a
        # fresh head on a pretrained trunk, or the trained one of a fine-tuned model. Written back
        # into config.growcram, so save_pretrained records the head and growcram reads it.
        config.growcram = validate_config({**config.growcram, "num_labels": config.num_labels,
                                           "pooling": config.classifier_pooling})
        super().__init__(config)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        out = self.growcram.classify(input_ids, attention_mask, labels)
        return SequenceClassifierOutput(loss=out["loss"], logits=out["logits"])


class GrowcramForTokenClassification(GrowcramPreTrainedModel):
    """One label per token (NER, tagging): the final hidden states -> dropout -> a linear layer."""

    def __init__(self, config):
        super().__init__(config)
        self.classifier = torch.nn.Linear(config.growcram["d_model"], config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, position_ids=None, **kwargs):
        h = self.growcram.encode(input_ids, attention_mask, position_ids)            # (B, T, d)
        h = F.dropout(h, self.config.growcram["dropout"], self.training)
        logits = self.classifier(h).float()                                          # (B, T, n)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return TokenClassifierOutput(loss=loss, logits=logits)
'''


def remote_config(cfg, kind, labels):
    """config.json for the wrapper classes: our keys under "growcram", the auto_map, the labels."""
    # auto_map is how the Auto classes find remote code: "file.Class" inside this folder
    # (transformers' custom-models guide). Our keys go under one name, not at the top level,
    # because PretrainedConfig owns some of them (vocab_size, num_labels, derived from id2label).
    auto, wrapper = AUTO_CLASSES[kind]
    # the language model of the trunk's objective answers its Auto class, whatever the kind
    lm_auto, lm_class = AUTO_CLASSES[cfg["objective"]]
    classes = {"AutoConfig": "GrowcramConfig", **SHARED_AUTO_CLASSES, lm_auto: lm_class}
    doc = {"model_type": "growcram", "architectures": [wrapper],
           "auto_map": {name: f"modeling_growcram.{c}" for name, c in classes.items()},
           "growcram": cfg}
    # transformers names the classes in pipelines and model cards from id2label / label2id
    if labels:
        doc["id2label"] = dict(enumerate(labels))
        doc["label2id"] = {name: i for i, name in enumerate(labels)}
        doc["problem_type"] = ("regression" if len(labels) == 1 else
                               "single_label_classification")
    return doc


# -----------------------------------------------------------------------------
# GPT-2, exactly

# Our block's modules -> GPT-2's (transformers' modeling_gpt2.py: GPT2Block, GPT2Attention, GPT2MLP)
GPT2_NAMES = {"qkv": "attn.c_attn", "out": "attn.c_proj", "up": "mlp.c_fc", "down": "mlp.c_proj",
              "norm1": "ln_1", "norm2": "ln_2"}


def gpt2_weights(cfg, state):
    """Our state dict in GPT2LMHeadModel's names. Conv1D stores (in, out), nn.Linear (out, in): each
    matrix is transposed. The embedding keeps its vocab_size real rows (padding rows dropped)."""
    V = cfg["vocab_size"]
    # GPT-2's output is wte (tied) or lm_head, each with vocab_size rows; the rows we pad to a
    # multiple of 64 are never inputs and only add scores nobody reads, so they are left out.
    out = {"transformer.wte.weight": state["tok_emb.weight"][:V],
           "transformer.wpe.weight": state["pos_emb.weight"],
           "transformer.ln_f.weight": state["final_norm.weight"],
           "transformer.ln_f.bias": state["final_norm.bias"]}
    if not cfg["tie_embeddings"]:
        out["lm_head.weight"] = state["lm_head.weight"][:V]
    for i in range(cfg["n_layers"]):
        for ours, theirs in GPT2_NAMES.items():
            w = state[f"blocks.{i}.{ours}.weight"]
            out[f"transformer.h.{i}.{theirs}.weight"] = w if "norm" in ours else w.t()
            # bias=False leaves our matmuls without biases; GPT-2's are zeros then
            bias = state.get(f"blocks.{i}.{ours}.bias", torch.zeros(w.shape[0]))
            out[f"transformer.h.{i}.{theirs}.bias"] = bias
    return {k: v.contiguous() for k, v in out.items()}


def gpt2_config(cfg, ids):
    """GPT2Config's keys for cfg; ours stay under "growcram" so load_exported reads them back."""
    # activation "gelu" is the exact erf GELU (transformers' ACT2FN), as F.gelu in model.py; GPT-2's
    # own default, gelu_new, is the tanh approximation and would not match.
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
            "vocab_size": cfg["vocab_size"], "n_positions": cfg["max_seq_len"],
            "n_embd": cfg["d_model"], "n_layer": cfg["n_layers"], "n_head": cfg["n_heads"],
            "n_inner": cfg["ffn_dim"], "activation_function": "gelu",
            "layer_norm_epsilon": cfg["norm_eps"], "resid_pdrop": cfg["dropout"],
            "embd_pdrop": cfg["dropout"], "attn_pdrop": cfg["dropout"],
            "tie_word_embeddings": cfg["tie_embeddings"], "bos_token_id": ids.get("sep"),
            "eos_token_id": ids.get("sep"), "pad_token_id": ids.get("pad"), "growcram": cfg}


def from_gpt2(cfg, weights):
    """The inverse of gpt2_weights: our state dict, with zero rows for the vocabulary's padding."""
    V, padded = cfg["vocab_size"], model.padded_vocab_size(cfg)
    # Zero rows give the padding ids a score of 0: never inputs, and fill_mask/generate skip them.
    pad = lambda w: torch.cat([w, w.new_zeros(padded - V, w.shape[1])])  # noqa: E731
    state = {"tok_emb.weight": pad(weights["transformer.wte.weight"]),
             "pos_emb.weight": weights["transformer.wpe.weight"],
             "final_norm.weight": weights["transformer.ln_f.weight"],
             "final_norm.bias": weights["transformer.ln_f.bias"]}
    if not cfg["tie_embeddings"]:
        state["lm_head.weight"] = pad(weights["lm_head.weight"])
    for i in range(cfg["n_layers"]):
        for ours, theirs in GPT2_NAMES.items():
            w = weights[f"transformer.h.{i}.{theirs}.weight"]
            state[f"blocks.{i}.{ours}.weight"] = w if "norm" in ours else w.t()
            if cfg["bias"] or "norm" in ours:   # the zero biases of bias=False are dropped again
                state[f"blocks.{i}.{ours}.bias"] = weights[f"transformer.h.{i}.{theirs}.bias"]
    return state


# -----------------------------------------------------------------------------
# ModernBERT, exactly

# Our names -> ModernBertForMaskedLM's (transformers' modeling_modernbert.py). Outside the blocks:
MODERNBERT_NAMES = {"tok_emb": "model.embeddings.tok_embeddings",
                    "emb_norm": "model.embeddings.norm", "final_norm": "model.final_norm",
                    "head_dense": "head.dense", "head_norm": "head.norm"}
# and inside block i, under "model.layers.{i}." (block 0 has no norm1: ModernBERT's identity)
MODERNBERT_BLOCK_NAMES = {"norm1": "attn_norm", "qkv": "attn.Wqkv", "out": "attn.Wo",
                          "norm2": "mlp_norm", "up": "mlp.Wi", "down": "mlp.Wo"}


def is_modernbert(cfg):
    """True when the config computes exactly ModernBertForMaskedLM's function with every layer
    global (model.ARCHITECTURES["modernbert"], any size and bias setting)."""
    family = {k: v for k, v in model.ARCHITECTURES["modernbert"].items() if k != "bias"}
    return (cfg["objective"] == "mlm" and not cfg["num_labels"]
            and all(cfg[k] == v for k, v in family.items()))


def modernbert_name(ours):
    """'blocks.3.qkv.weight' -> 'model.layers.3.attn.Wqkv.weight'; 'head_norm.bias' ->
    'head.norm.bias'."""
    parts = ours.split(".")
    if parts[0] == "blocks":
        return ".".join(["model.layers", parts[1], MODERNBERT_BLOCK_NAMES[parts[2]], *parts[3:]])
    return ".".join([MODERNBERT_NAMES[parts[0]], *parts[1:]])


def modernbert_config(cfg, ids):
    """ModernBertConfig's keys for cfg; ours stay under "growcram" so load_exported reads them."""
    # Every layer global: ModernBERT's local layers see a 128-token window, which growcram's
    # attention has no counterpart for. Rotary's theta is growcram's 10,000 in both layer types.
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    return {"model_type": "modernbert", "architectures": ["ModernBertForMaskedLM"],
            # the padded vocabulary: the decoder's rows are the embedding's (tied), padding included
            "vocab_size": model.padded_vocab_size(cfg), "hidden_size": cfg["d_model"],
            "intermediate_size": cfg["ffn_dim"], "num_hidden_layers": cfg["n_layers"],
            "num_attention_heads": cfg["n_heads"], "hidden_activation": "gelu",
            "classifier_activation": "gelu", "max_position_embeddings": cfg["max_seq_len"],
            "initializer_range": cfg["init_std"], "norm_eps": cfg["norm_eps"],
            # torch's LayerNorm keeps its bias; the matmuls have biases only with bias=True
            "norm_bias": cfg["norm"] == "layernorm", "attention_bias": cfg["bias"],
            "mlp_bias": cfg["bias"], "classifier_bias": cfg["bias"], "decoder_bias": False,
            "layer_types": ["full_attention"] * cfg["n_layers"],
            "rope_parameters": {"full_attention": rope, "sliding_attention": dict(rope)},
            # the same in transformers 4.x's spelling, which reads these three instead
            "global_attn_every_n_layers": 1, "global_rope_theta": 10000.0,
            "local_rope_theta": 10000.0,
            "embedding_dropout": cfg["dropout"], "attention_dropout": cfg["dropout"],
            "mlp_dropout": cfg["dropout"], "classifier_pooling": cfg["pooling"],
            "tie_word_embeddings": True, "pad_token_id": ids.get("pad"),
            "cls_token_id": ids.get("cls"), "sep_token_id": ids.get("sep"),
            "bos_token_id": ids.get("cls"), "eos_token_id": ids.get("sep"), "growcram": cfg}


def modernbert_weights(state):
    """Our state dict in ModernBertForMaskedLM's names; the tied decoder is the embedding."""
    return {modernbert_name(k): t for k, t in state.items()}


def from_modernbert(ours, weights):
    """The inverse of modernbert_weights: our state dict, for every name in ours (the names of the
    network it loads into). A folder transformers saved from a ModernBERT classifier gives its
    trunk and its head's dense -> GELU -> norm; the classifier layer is not growcram's and is left
    out."""
    names = {modernbert_name(k): k for k in ours}
    return {names[k]: t for k, t in weights.items() if k in names}


# -----------------------------------------------------------------------------
# Writing the folder

def export(checkpoint, out, force=False):
    """Write checkpoint (a model.py folder) as a transformers folder OUT. Returns OUT's file names.
    ValueError (one line) on a missing or damaged checkpoint, on OUT existing and not empty
    (unless force), or when transformers is missing."""
    transformers = need_hf()
    from safetensors.torch import save_file
    net = read_checkpoint(checkpoint)
    cfg, kind = net.config, kind_of(net.config)
    # Refuse before writing anything: --force on the checkpoint itself would delete it.
    out, checkpoint = os.path.abspath(out), os.path.abspath(checkpoint)
    if checkpoint == out or checkpoint.startswith(out + os.sep):
        raise ValueError(f"{out}: would overwrite the checkpoint; choose another OUT")
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise ValueError(f"{out}: exists and is not empty; pass --force to replace it")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"{out}: exists and is not a folder")
    # safetensors stores contiguous tensors with no shared memory (its "torch shared tensors" rule);
    # a tied model has one embedding tensor in its state dict, so nothing is shared here.
    state = {k: t.contiguous() for k, t in net.state_dict().items()}
    ids, n_ordinary = tokenizer_ids(checkpoint)
    # Everything is written into a temporary folder beside OUT and renamed into place at the end:
    # an export that fails halfway leaves no half-written OUT (files.atomic_write's rename).
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(out)}.", suffix=".tmp")
    try:
        # The two config families that are stock architectures load without remote code.
        if is_gpt2(cfg):
            doc = gpt2_config(cfg, ids)
            save_file(gpt2_weights(cfg, state), os.path.join(tmp, "model.safetensors"),
                      metadata={"format": "pt"})
        elif is_modernbert(cfg):
            doc = modernbert_config(cfg, ids)
            save_file(modernbert_weights(state), os.path.join(tmp, "model.safetensors"),
                      metadata={"format": "pt"})
        else:
            doc = remote_config(cfg, kind, read_labels(checkpoint, cfg) if cfg["num_labels"]
                                else None)
            # pad/cls/sep/mask_token_id: what pipelines and data collators look up in the config
            doc.update({f"{name}_token_id": i for name, i in ids.items()})
            save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
            write_text(tmp, "growcram_model.py", network_source())
            write_text(tmp, "modeling_growcram.py", MODELING)
        doc["transformers_version"] = transformers.__version__
        write_text(tmp, "config.json", json.dumps(doc, indent=2))
        if kind == "clm":
            gen = generation_config(ids, n_ordinary, cfg)
            write_text(tmp, "generation_config.json", json.dumps(gen, indent=2))
        write_hf_tokenizer(checkpoint, tmp, cfg)
        write_text(tmp, "README.md", model_card(checkpoint, cfg, kind, stock_name(cfg)))
        replace_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(os.listdir(out))


def write_text(folder, name, text):
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
        f.write(text)


def replace_folder(tmp, out):
    """Rename tmp to out; an old out (force) is moved aside first and deleted after."""
    # os.replace cannot put a folder over a non-empty one, so the old one steps aside first; both
    # renames stay in OUT's parent folder (one file system), which makes each one atomic.
    old = None
    if os.path.exists(out):
        old = tempfile.mkdtemp(dir=os.path.dirname(out), prefix=".old.", suffix=".tmp")
        os.replace(out, os.path.join(old, "out"))
    os.replace(tmp, out)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def tokenizer_ids(checkpoint):
    """({"pad", "cls", "sep", "mask"} -> id, n_ordinary) from the checkpoint's tokenizer.json, or
    ({}, None) without one."""
    path = os.path.join(checkpoint, "tokenizer.json")
    if not os.path.isfile(path):
        return {}, None
    import tokenizer  # growcram's; tiktoken is a dependency of training anyway
    enc = tokenizer.load_tokenizer(path)
    return tokenizer.special_ids(enc), tokenizer.n_ordinary(enc)


def write_hf_tokenizer(checkpoint, folder, cfg):
    """tokenizer.json (the HF fast format), tokenizer_config.json, special_tokens_map.json, and
    ours as growcram_tokenizer.json, so train.py --init-from can continue from the folder."""
    path = os.path.join(checkpoint, "tokenizer.json")
    if not os.path.isfile(path):
        return
    import tokenizer
    enc = tokenizer.load_tokenizer(path)
    # model_max_length lets the tokenizer truncate to the positions the model has
    # it cleans text as the data pipeline did before tokenizing (meta.json: NFC, lowercase...),
    # so transformers gives the ids our models were trained on for any text
    meta = read_json(checkpoint, "meta.json") or {}
    clean = (meta.get("settings") or {}).get("clean", {"normalize": "NFC"})
    tokenizer.save_hf_tokenizer(enc, folder, max_length=cfg["max_seq_len"], clean=clean,
                                causal=cfg["objective"] == "clm")
    shutil.copyfile(path, os.path.join(folder, "growcram_tokenizer.json"))


def generation_config(ids, n_ordinary, cfg):
    """model.generate's defaults: greedy, stop at [SEP], never emit the other specials."""
    # model.generate scores ordinary ids and [SEP] only (model._ready): suppress_tokens puts -inf
    # on the rest, so transformers' greedy search picks what ours picks, step by step.
    specials = range(n_ordinary, cfg["vocab_size"]) if ids else ()
    return {"do_sample": False, "max_new_tokens": 20, "use_cache": False,
            "eos_token_id": ids.get("sep"), "pad_token_id": ids.get("pad"),
            "suppress_tokens": [i for i in specials if i != ids.get("sep")]}


# Three lines per kind for the card. The tokenizer adds [CLS] text [SEP], as our encoders read text;
# a causal model's tokenizer puts [SEP] before the text: a document follows one in its training
# stream.
USAGE = {
    "mlm": """from transformers import pipeline
fill = pipeline("fill-mask", model="PATH", tokenizer="PATH"{remote})
print(fill("The capital of France is [MASK]."))""",
    "clm": """from transformers import AutoModelForCausalLM as LM, AutoTokenizer
net, tok = LM.from_pretrained("PATH"{remote}), AutoTokenizer.from_pretrained("PATH")
print(tok.decode(net.generate(**tok("The cat", return_tensors="pt"))[0]))""",
    "cls": """from transformers import pipeline
classify = pipeline("text-classification", model="PATH", tokenizer="PATH"{remote})
print(classify({{"text": "A man plays.", "text_pair": "Someone plays."}}))"""}


def model_card(checkpoint, cfg, kind, stock):
    """README.md: what the model is, its data and training run, its shape, how to load it.
    stock: the stock transformers model it is ('GPT-2', 'ModernBERT'), or None."""
    meta, summary = read_json(checkpoint, "meta.json"), read_json(checkpoint, "..", "summary.json")
    auto = AUTO_CLASSES[kind][0]
    # A card makes the folder self-describing on the Hub: what it is, how it was made, how to use it
    what = {"mlm": "a masked language model (bidirectional encoder)",
            "clm": "a causal language model (decoder)",
            "cls": f"a sequence classifier ({cfg['num_labels']} output(s)) on a "
                   f"{'masked' if cfg['objective'] == 'mlm' else 'causal'} LM trunk"}[kind]
    remote = "" if stock else ", trust_remote_code=True"
    lines = [f"# growcram {kind} model", "",
             f"A growcram Transformer, {what}, trained on a wall-clock budget (cramming, Geiping & "
             f"Goldstein 2022). Exported by growcram's export.py "
             + (f"as a stock {stock} model." if stock else
                "with its own modeling code (growcram_model.py, modeling_growcram.py)."), "",
             "## Use", "", "```python", *USAGE[kind].format(remote=remote).splitlines(), "```",
             "", f"or `{auto}.from_pretrained(PATH{remote})`; AutoModel, "
             "AutoModelForSequenceClassification and AutoModelForTokenClassification load it "
             "too (a fresh head: pass num_labels). `AutoTokenizer.from_pretrained(PATH)` needs no "
             "remote code: the tokenizer is a stock PreTrainedTokenizerFast, which cleans text as "
             "the training data was cleaned.", "",
             "## Shape", "",
             f"{cfg['n_layers']} layers, d_model {cfg['d_model']}, {cfg['n_heads']} heads, "
             f"ffn {cfg['ffn_dim']} ({cfg['activation']}), {cfg['norm_position']}-{cfg['norm']}, "
             f"{cfg['positions']} positions, {cfg['max_seq_len']} tokens, vocabulary "
             f"{cfg['vocab_size']}; {model.count_params(cfg):,} parameters.", ""]
    if meta:
        lines += ["## Data", "", f"Settings: `{json.dumps(meta.get('settings'))}`; "
                  f"{meta.get('train_tokens', '?')} training tokens prepared.", ""]
    if summary:
        keys = ("elapsed_s", "steps", "tokens", "final_val_loss", "device", "status")
        lines += ["## Training run", ""] + [f"- {k}: {summary[k]}" for k in keys if k in summary]
        lines.append("")
    return "\n".join(lines)


def read_json(*parts):
    """A JSON file's content, or None when it is missing or unreadable (the card skips it)."""
    try:
        with open(os.path.join(*parts)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# -----------------------------------------------------------------------------
# Reading it back

def load_exported(folder):
    """Our model.Transformer from an exported folder (config.json + model.safetensors), in eval
    mode: for train.py --init-from, or to use an exported model with model.fill_mask/generate."""
    from safetensors.torch import load_file
    # config.json keeps our keys under "growcram" in both kinds of export, so the config comes back
    # exactly, dropout and mask_rate included, which no transformers config would record.
    doc = read_json(folder, "config.json")
    weights = os.path.join(folder, "model.safetensors")
    if not isinstance(doc, dict) or "growcram" not in doc:
        raise ValueError(f"{folder}: no config.json with growcram's keys; not written by "
                         "export.py")
    if not os.path.isfile(weights):
        raise ValueError(f"{weights}: missing")
    try:
        cfg = model.validate_config(doc["growcram"])
        state = load_file(weights)
        net = model.build_model(cfg)
        if doc.get("model_type") == "gpt2":
            state = from_gpt2(cfg, state)
        elif doc.get("model_type") == "modernbert":
            state = from_modernbert(net.state_dict(), state)
        elif any(k.startswith(HF_PREFIX) for k in state):
            # saved by transformers (save_pretrained after fine-tuning): the network is under the
            # wrappers' attribute; a token classifier's layer beside it is not growcram's
            state = {k[len(HF_PREFIX):]: t for k, t in state.items() if k.startswith(HF_PREFIX)}
        # strict loading: a file edited or written for another shape fails here, by name
        net.load_state_dict(plain_keys(state))
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"{folder}: not loadable ({type(e).__name__}: {first[:200]})") from None
    return net.eval()


def main(argv=None):
    p = argparse.ArgumentParser(description="Export a growcram checkpoint as a Hugging Face "
                                            "transformers folder.")
    p.add_argument("checkpoint", help="model.py folder: config.json, model.pt (and tokenizer.json, "
                                      "meta.json), e.g. train.py's out/final")
    p.add_argument("out", help="folder to write; must not exist or be empty")
    p.add_argument("--force", action="store_true", help="replace OUT if it holds files")
    args = p.parse_args(argv)
    try:
        files = export(args.checkpoint, args.out, args.force)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"{args.out}: {', '.join(files)}")


if __name__ == "__main__":
    main()
