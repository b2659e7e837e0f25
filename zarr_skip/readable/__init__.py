"""Readable rollouts: tokenizers, decoded text and chat messages, exports for other tools."""

from __future__ import annotations

from zarr_skip.readable.text import Message, chat_messages
from zarr_skip.readable.tokenizers import Decoder, load_tokenizer, tokenizer_for

__all__ = ["Decoder", "Message", "chat_messages", "load_tokenizer", "tokenizer_for"]
