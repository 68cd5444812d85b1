"""A local Hugging Face tokenizer directory -> encode/decode, special ids, token bytes, chat template."""
from __future__ import annotations

import copy
import hashlib
import json
import re
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from anydraft.vocab.token_bytes import (ByteScheme, TokenBytesTable, TokenKind, UnsupportedTokenizer,
                                        build_token_bytes, detect_byte_scheme)

# End-of-turn / end-of-text markers that stop generation in chat models besides the configured eos.
_EXTRA_EOS_CONTENTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")


class TokenizerError(ValueError):
    """A tokenizer directory we cannot use; the message names the file and what is wrong."""


def check_text(text: str, what: str = "text") -> None:
    """Raise a ValueError naming the first character that is not valid Unicode (a lone UTF-16 surrogate, as
    JSON's "\\udcff" or Python's surrogateescape decoding make): no tokenizer can encode it."""
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} contains a lone UTF-16 surrogate (U+{ord(text[e.start]):04X} at character "
                         f"{e.start}), which is not valid Unicode and cannot be tokenized; send valid text (a "
                         f"surrogate must be one half of a pair)") from None


def _token_content(value: Any) -> str | None:
    """tokenizer_config stores special tokens as a string or as a serialized AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> tuple[bytes, dict]:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TokenizerError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        parsed = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(parsed, dict):
        raise TokenizerError(f"{path}: expected a JSON object, found {type(parsed).__name__}")
    return raw, parsed


def _fragment_json(tokenizer_json: dict, keep_normalization: bool = False) -> dict:
    """A copy that encodes a middle-of-text fragment byte-exactly: no dummy prefix space, no
    normalization that changes bytes (NFC, Prepend...), no post-processor specials. keep_normalization: keep
    every normalizer but Prepend (the text continues one the full tokenizer normalized)."""
    fragment = copy.deepcopy({k: v for k, v in tokenizer_json.items() if k != "model"})
    fragment["model"] = tokenizer_json["model"]  # large and untouched: share rather than copy

    def keep_normalizer(part: dict) -> dict | None:
        if part.get("type") == "Sequence":
            kept = [p for p in (keep_normalizer(child) for child in part.get("normalizers") or []) if p]
            return {"type": "Sequence", "normalizers": kept} if kept else None
        if keep_normalization:
            return None if part.get("type") == "Prepend" else part
        # Only the space -> ▁ replacement is reversed by the token bytes; every other step edits text.
        is_space_replace = part.get("type") == "Replace" and (part.get("pattern") or {}).get("String") == " "
        return part if is_space_replace else None

    def no_prefix(part: dict) -> None:
        if part.get("type") == "Metaspace":
            part["prepend_scheme"] = "never"
            part["add_prefix_space"] = False
        if part.get("type") == "ByteLevel":
            part["add_prefix_space"] = False
        for child in part.get("pretokenizers") or []:
            no_prefix(child)

    if isinstance(fragment.get("normalizer"), dict):
        fragment["normalizer"] = keep_normalizer(fragment["normalizer"])
    if isinstance(fragment.get("pre_tokenizer"), dict):
        no_prefix(fragment["pre_tokenizer"])
    fragment["post_processor"] = None
    return fragment


class Tokenizer:
    """One tokenizer directory (tokenizer.json + tokenizer_config.json)."""

    def __init__(self, path: Path, tokenizer_raw: bytes, tokenizer_json: dict, config_raw: bytes,
                 config: dict) -> None:
        self.path = path
        self.content_hash = hashlib.sha256(tokenizer_raw + b"\0" + config_raw).hexdigest()
        self._json = tokenizer_json
        self._config = config
        source = path / "tokenizer.json"
        try:
            self.byte_scheme: ByteScheme = detect_byte_scheme(tokenizer_json)
        except UnsupportedTokenizer as e:
            raise TokenizerError(f"{source}: unsupported tokenizer: {e}") from e
        try:
            self._hf = HFTokenizer.from_str(tokenizer_raw.decode("utf-8"))
        except Exception as e:  # the Rust side raises its own Exception type for malformed models
            raise TokenizerError(f"{source}: the tokenizers library rejects it ({e})") from e
        added = {int(a["id"]): a for a in tokenizer_json.get("added_tokens") or []}
        model_vocab = tokenizer_json["model"].get("vocab") or {}
        model_size = len(model_vocab) if isinstance(model_vocab, list) else max(model_vocab.values(), default=-1) + 1
        self.vocab_size: int = max([model_size - 1] + list(added)) + 1
        self.bos_token_id = self._config_token_id("bos_token")
        self.pad_token_id = self._config_token_id("pad_token")
        self.unk_token_id = self._config_token_id("unk_token")
        self.eos_token_ids: list[int] = self._eos_ids()
        self.special_ids: frozenset[int] = frozenset(
            [i for i, a in added.items() if a.get("special")]
            + [i for i in (self.bos_token_id, self.pad_token_id, self.unk_token_id, *self.eos_token_ids)
               if i is not None])
        template = config.get("chat_template")
        if isinstance(template, list):  # some configs store named templates: take the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        self.chat_template: str | None = template
        self._adds_bos, self._adds_eos = self._config_adds_specials()

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        path = Path(path)
        if not path.is_dir():
            raise TokenizerError(f"{path}: not a directory")
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerError(f"{tokenizer_file}: missing (need a Hugging Face 'fast' tokenizer.json)")
        tokenizer_raw, tokenizer_json = _read_json(tokenizer_file)
        config_file = path / "tokenizer_config.json"
        config_raw, config = _read_json(config_file) if config_file.is_file() else (b"", {})
        if not isinstance(tokenizer_json.get("model"), dict):
            raise TokenizerError(f"{tokenizer_file}: no 'model' object")
        return cls(path, tokenizer_raw, tokenizer_json, config_raw, config)

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.path)!r}, vocab_size={self.vocab_size}, scheme={self.byte_scheme.value})"

    # --- special ids -------------------------------------------------------------------------
    def _config_token_id(self, key: str) -> int | None:
        content = _token_content(self._config.get(key))
        return None if content is None else self._hf.token_to_id(content)

    def _eos_ids(self) -> list[int]:
        eos_ids = [i for i in [self._config_token_id("eos_token")] if i is not None]
        added_special = {a["content"]: int(a["id"]) for a in self._json.get("added_tokens") or [] if a.get("special")}
        for content in _EXTRA_EOS_CONTENTS:
            token_id = added_special.get(content)
            if token_id is not None and token_id not in eos_ids:
                eos_ids.append(token_id)
        return eos_ids

    def _config_adds_specials(self) -> tuple[bool, bool]:
        """Whether encode() must add bos/eos itself: the config asks for it and the post-processor
        in tokenizer.json does not already do it (llama2/mistral's TemplateProcessing adds <s>)."""
        with_specials = self._hf.encode("a", add_special_tokens=True).ids
        without = self._hf.encode("a", add_special_tokens=False).ids
        post_adds_bos = len(with_specials) > len(without) and with_specials[0] == self.bos_token_id
        post_adds_eos = len(with_specials) > len(without) and with_specials[-1] in self.eos_token_ids
        adds_bos = bool(self._config.get("add_bos_token")) and self.bos_token_id is not None and not post_adds_bos
        adds_eos = bool(self._config.get("add_eos_token")) and bool(self.eos_token_ids) and not post_adds_eos
        return adds_bos, adds_eos

    # --- encode / decode ---------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text; a ValueError if it is not valid Unicode (a lone surrogate), a TypeError if not a str."""
        try:
            token_ids = self._hf.encode(text, add_special_tokens=add_special_tokens).ids
        except TypeError:   # the tokenizers library's "TextInputSequence must be str": say which character
            check_text(text)
            raise
        if add_special_tokens and self._adds_bos:
            token_ids = [self.bos_token_id, *token_ids]
        if add_special_tokens and self._adds_eos:
            token_ids = [*token_ids, self.eos_token_ids[0]]
        return token_ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """encode() of many texts at once (the tokenizers library spreads them over the CPU cores)."""
        if not add_special_tokens:
            try:
                return [e.ids for e in self._hf.encode_batch(texts, add_special_tokens=False)]
            except TypeError:
                for i, text in enumerate(texts):
                    check_text(text, f"texts[{i}]")
                raise
        return [self.encode(text) for text in texts]

    @cached_property
    def _fragment_hf(self) -> HFTokenizer:
        fragment = HFTokenizer.from_str(json.dumps(_fragment_json(self._json)))
        fragment.encode_special_tokens = True  # special-token strings inside text stay text
        return fragment

    def encode_fragment(self, text: str) -> list[int]:
        """Encode a middle-of-text piece: no specials, no dummy prefix space, no normalization,
        special-token strings treated as plain text. Used by re-sync; see vocab/resync.py."""
        try:
            return self._fragment_hf.encode(text, add_special_tokens=False).ids
        except TypeError:
            check_text(text)
            raise

    @cached_property
    def _continuation_hf(self) -> HFTokenizer:
        return HFTokenizer.from_str(json.dumps(_fragment_json(self._json, keep_normalization=True)))

    def encode_continuation(self, text: str) -> list[int]:
        """Encode text that continues an encoded one: as encode() would mid-text (specials, normalization), without
        the dummy prefix space or the bos/eos of a sequence's start. The library normalizes each piece between
        added tokens on its own (a Prepend normalizer marks each), so only the piece before the first added token
        is encoded as a continuation, the rest as encode() does."""
        found = self._added_token_pattern.search(text) if self._added_token_pattern else None
        head, tail = (text[:found.start()], text[found.start():]) if found else (text, "")
        try:
            ids = self._continuation_hf.encode(head, add_special_tokens=False).ids if head else []
            return ids + (self._hf.encode(tail, add_special_tokens=False).ids if tail else [])
        except TypeError:
            check_text(text)
            raise

    @cached_property
    def _added_token_pattern(self) -> re.Pattern | None:
        contents = sorted({a["content"] for a in self._json.get("added_tokens") or [] if a.get("content")},
                          key=len, reverse=True)
        return re.compile("|".join(map(re.escape, contents))) if contents else None

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    # --- token bytes -------------------------------------------------------------------------
    @cached_property
    def token_table(self) -> TokenBytesTable:
        return build_token_bytes(self._json, self.encode_fragment)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token spells; special/added tokens give their content. Partial UTF-8 stays bytes."""
        table = self.token_table
        if not 0 <= token_id < table.vocab_size or table.token_kinds[token_id] == TokenKind.MISSING:
            raise ValueError(f"{self.path}: token id {token_id} is not in the vocabulary "
                             f"(vocab_size {self.vocab_size})")
        return table.token_bytes[token_id]

    # --- chat template -----------------------------------------------------------------------
    @cached_property
    def _compiled_chat_template(self):
        """The template compiled once (compiling it takes ~20 ms, longer than a small model's prefill)."""
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as e:
            raise TokenizerError("apply_chat_template needs jinja2 (pip install jinja2)") from e

        def raise_exception(message: str) -> None:
            raise TokenizerError(f"chat template: {message}")

        # Same environment settings as transformers so the rendered text matches it.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                            **template_vars: Any) -> str:
        if self.chat_template is None:
            raise TokenizerError(f"{self.path / 'tokenizer_config.json'}: no chat_template")
        return self._compiled_chat_template.render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=_token_content(self._config.get("bos_token")) or "",
            eos_token=_token_content(self._config.get("eos_token")) or "", **template_vars)


def same_vocabulary(a: Tokenizer, b: Tokenizer) -> bool:
    """Same tokens with the same ids, whatever the row counts (Qwen2.5-7B has 152064 rows, Qwen2.5-0.5B 151936):
    a draft can then read and write target ids directly (identity), padding rows being masked anyway."""
    if a.content_hash == b.content_hash:
        return True
    return (a.token_table.token_bytes == b.token_table.token_bytes and a.token_table.token_kinds == b.token_table.token_kinds
            and a.special_ids == b.special_ids)
