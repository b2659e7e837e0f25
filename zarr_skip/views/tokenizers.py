"""Tokenizers for reading rollouts: decode token ids to text, never downloading anything.

A :class:`Decoder` is what every view needs: ``decode(ids)`` for a whole sequence and
``tokens(ids)`` for each id's surface text (to colour tokens by their log-prob).
:func:`load_tokenizer` makes one from a ``transformers`` tokenizer (anything with ``decode`` /
``batch_decode``), a ``tokenizers.Tokenizer``, or a local tokenizer directory or
``tokenizer.json``; :func:`tokenizer_for` picks the one a cache should be read with.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

from zarr_skip.errors import ConfigTypeError, MissingExtraError, TokenizerNotFoundError

__all__ = [
    "ATTR_MODEL",
    "ATTR_TOKENIZER",
    "Decoder",
    "load_tokenizer",
    "recorded_tokenizer_path",
    "surface_tokens",
    "tokenizer_for",
]

#: the experiment attributes (see :attr:`zarr_skip.Cache.attributes`) naming where the trainer's
#: tokenizer and model were; the tokenizer path wins over the model path
ATTR_TOKENIZER = "tokenizer"
ATTR_MODEL = "model"

_log = logging.getLogger(__name__)

#: recorded paths already warned about (one warning per path and process)
_WARNED: set[str] = set()

#: ids a character may span before a token's text is emitted even though incomplete
_GIVE_UP = 8


@runtime_checkable
class Decoder(Protocol):
    """Turns token ids into text."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids``; special tokens (``<|im_end|>``, padding) dropped by default."""
        ...

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """Each id's surface text, special tokens included: ``"".join(tokens(ids))`` is the
        text of ``ids`` (a character split over several ids belongs to the last of them)."""
        ...


def surface_tokens(decode: Callable[[Sequence[int]], str], ids: Sequence[int]) -> list[str]:
    """Each id's surface text, decoded incrementally with a few ids of context.

    A token's text is what decoding it adds to the text of the ids before it, so leading
    spaces (byte-level or SentencePiece tokenizers) are right; while a multi-byte character is
    incomplete (the decoder gives U+FFFD) the token's text is ``""`` and the character goes to
    the id that completes it.
    """
    ids = [int(i) for i in ids]
    out: list[str] = []
    prefix, read = 0, 0  # ids[prefix:read]: the last emitted run, the context of the next id
    for k in range(len(ids)):
        before = decode(ids[prefix:read]) if read > prefix else ""
        after = decode(ids[prefix : k + 1])
        complete = len(after) > len(before) and not after.endswith("\ufffd") and after.startswith(before)
        if complete or k + 1 - read >= _GIVE_UP:
            out.append(after[len(before) :] if after.startswith(before) else after)
            prefix, read = read, k + 1
        else:
            out.append("")
    return out


class _TokenizersDecoder:
    """A ``tokenizers.Tokenizer`` (the Rust library)."""

    def __init__(self, tokenizer: Any, source: str) -> None:
        self.tokenizer = tokenizer
        self.source = source

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens))

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        ids = [[int(i) for i in row] for row in batch]
        return list(self.tokenizer.decode_batch(ids, skip_special_tokens=skip_special_tokens))

    def tokens(self, ids: Sequence[int]) -> list[str]:
        return surface_tokens(lambda x: self.decode(x, skip_special_tokens=False), ids)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def token_id(self, token: str) -> int | None:
        found = self.tokenizer.token_to_id(token)
        return None if found is None else int(found)

    def __repr__(self) -> str:
        return f"Decoder(tokenizers, {self.source})"


class _CallableDecoder:
    """Anything with ``decode`` (and maybe ``batch_decode``): a ``transformers`` tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens))

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        ids = [[int(i) for i in row] for row in batch]
        if hasattr(self.tokenizer, "batch_decode"):
            return [str(t) for t in self.tokenizer.batch_decode(ids, skip_special_tokens=skip_special_tokens)]
        return [self.decode(row, skip_special_tokens) for row in ids]

    def tokens(self, ids: Sequence[int]) -> list[str]:
        return surface_tokens(lambda x: self.decode(x, skip_special_tokens=False), ids)

    def __repr__(self) -> str:
        return f"Decoder({type(self.tokenizer).__name__})"


def _tokenizers_module() -> Any:
    try:
        return importlib.import_module("tokenizers")
    except ImportError:
        raise MissingExtraError(
            "reading a tokenizer.json needs the 'tokenizers' package: pip install 'zarr-skip[text]'"
        ) from None


def _from_path(path: Path, trust_remote_code: bool = False) -> Decoder:
    file = path / "tokenizer.json" if path.is_dir() else path
    if file.is_file():
        tokenizers = _tokenizers_module()
        try:
            tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as exc:  # the Rust library raises a plain Exception on a bad file
            raise TokenizerNotFoundError(f"{file}: not a tokenizer.json the tokenizers library reads ({exc})") from exc
        return _TokenizersDecoder(tok, str(file))
    if path.is_dir():  # a model directory without tokenizer.json (slow tokenizer files)
        try:
            transformers = importlib.import_module("transformers")
        except ImportError:
            raise TokenizerNotFoundError(
                f"{path}: no tokenizer.json in this directory, and reading its other tokenizer files "
                "needs the 'transformers' package"
            ) from None
        try:
            # never the directory's own code (an auto_map) unless the caller asked for it
            tok = transformers.AutoTokenizer.from_pretrained(
                str(path), local_files_only=True, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError, RuntimeError) as exc:
            raise TokenizerNotFoundError(
                f"{path}: no tokenizer.json in this directory, and transformers read no other tokenizer from it "
                f"({exc!r:.300})"
            ) from exc
        return _CallableDecoder(tok)
    raise TokenizerNotFoundError(f"{path}: not a tokenizer file or directory")


def load_tokenizer(source: Any, *, trust_remote_code: bool = False) -> Decoder:
    """A :class:`Decoder` for ``source``; nothing is ever downloaded.

    Parameters
    ----------
    source : a :class:`Decoder` (returned as it is), a ``tokenizers.Tokenizer``, anything with
        ``decode`` / ``batch_decode`` (a ``transformers`` tokenizer), or the path of a local
        ``tokenizer.json`` or of a directory holding one (a model directory).
    trust_remote_code : passed to ``transformers.AutoTokenizer.from_pretrained`` for a model
        directory without ``tokenizer.json``: True runs the directory's own tokenizer code (its
        ``auto_map``); only for a path you chose. A path recorded in a cache is always loaded
        with False (:func:`tokenizer_for`).

    Raises
    ------
    TokenizerNotFoundError
        ``source`` is a string or path that does not exist locally (a hub name such as
        ``"Qwen/Qwen2.5-7B"`` is not looked up), or a file that is no tokenizer.
    MissingExtraError
        Reading a tokenizer.json needs ``tokenizers`` (``pip install 'zarr-skip[text]'``).
    """
    if not isinstance(trust_remote_code, bool):
        raise ConfigTypeError(f"trust_remote_code: expected True or False, got {trust_remote_code!r:.80}")
    if isinstance(source, (bytes, bytearray, memoryview)):  # has .decode, but is no tokenizer
        raise TokenizerNotFoundError(f"tokenizer: {source!r:.60} is bytes; pass the path as a str")
    if isinstance(source, (str, os.PathLike)):
        path = Path(source).expanduser()
        if not path.exists():
            raise TokenizerNotFoundError(
                f"tokenizer {str(source)!r} is not a local file or directory; zarr_skip never downloads "
                "tokenizers: pass the path of a tokenizer.json or of a model directory holding one"
            )
        return _from_path(path, trust_remote_code)
    if isinstance(source, (_TokenizersDecoder, _CallableDecoder)):
        return source
    if type(source).__module__.startswith("tokenizers") and hasattr(source, "decode_batch"):
        return _TokenizersDecoder(source, "in memory")
    if callable(getattr(source, "decode", None)) and callable(getattr(source, "tokens", None)):
        # already a Decoder; checked with getattr, which a wrapper's __getattr__ answers, not with
        # isinstance(source, Decoder), which looks the methods up statically from Python 3.12 on
        return cast(Decoder, source)
    if callable(getattr(source, "decode", None)):
        return _CallableDecoder(source)
    raise TokenizerNotFoundError(
        f"tokenizer: cannot decode with {type(source).__name__}: pass a path, a tokenizers.Tokenizer or a "
        "transformers tokenizer"
    )


def recorded_tokenizer_path(attributes: Mapping[str, Any]) -> str | None:
    """The tokenizer path the experiment's attributes record, when it exists on this machine."""
    for key in (ATTR_TOKENIZER, ATTR_MODEL):
        value = attributes.get(key)
        if isinstance(value, str) and value and Path(value).expanduser().exists():
            return value
    return None


def tokenizer_for(cache: Any, explicit: Any = None, *, trust_remote_code: bool = False) -> Decoder | None:
    """The tokenizer to read ``cache`` with: ``explicit`` when given, else the one its experiment
    recorded (:data:`ATTR_TOKENIZER`, else :data:`ATTR_MODEL`) when that path exists locally,
    else None (views then show token ids and say how to pass one).

    ``cache`` is a :class:`zarr_skip.Cache`, a step view loaded from one, or None. A recorded
    path is loaded with ``trust_remote_code=False`` whatever is asked (a cache written by
    someone else must not choose code to run); one that does not load (not a tokenizer, a model
    directory whose tokenizer needs a missing package) gives None and one warning naming it.
    ``trust_remote_code`` applies to ``explicit`` alone, which must load (else
    :class:`TokenizerNotFoundError`).
    """
    if explicit is not None:
        return load_tokenizer(explicit, trust_remote_code=trust_remote_code)
    attributes = _attributes_of(cache)
    path = recorded_tokenizer_path(attributes)
    if path is None:
        return None
    try:
        return load_tokenizer(path, trust_remote_code=False)
    except (TokenizerNotFoundError, MissingExtraError) as exc:
        if path not in _WARNED:
            _WARNED.add(path)
            _log.warning(
                "the tokenizer recorded in the cache, %r, does not load (%s): showing token ids; pass "
                "tokenizer= (a path, a tokenizers.Tokenizer or a transformers tokenizer; on the CLI "
                "--tokenizer PATH) to read text",
                path,
                exc,
            )
        return None


def _attributes_of(cache: Any) -> Mapping[str, Any]:
    if cache is None:
        return {}
    owner = getattr(cache, "cache", None)  # a StepView knows the Cache it came from
    if owner is not None and not hasattr(cache, "attributes"):
        cache = owner
    attributes = getattr(cache, "attributes", None)
    return attributes if isinstance(attributes, Mapping) else {}
