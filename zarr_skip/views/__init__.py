"""Views of what the handle holds: text and HTML reprs, decoded text and chat messages, rollout and
group views, one record per rollout and its exports. Below the handle: it imports these at module
top, and they see the handle only under ``TYPE_CHECKING``."""

from __future__ import annotations

from zarr_skip.views.text import Message, chat_messages
from zarr_skip.views.tokenizers import Decoder, load_tokenizer, tokenizer_for

__all__ = ["Decoder", "Message", "chat_messages", "load_tokenizer", "tokenizer_for"]
