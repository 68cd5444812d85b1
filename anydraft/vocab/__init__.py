"""Vocabulary layer: token bytes, the target<->draft bridge, draft re-sync, d2t tables, bridge cache."""
from anydraft.vocab.bridge import BridgeStats, VocabBridge
from anydraft.vocab.cache import load_or_build_bridge
from anydraft.vocab.d2t import D2TError, build_d2t, build_d2t_from_ids, load_d2t, save_d2t, validate_d2t
from anydraft.vocab.resync import DraftResync, ResyncEdit, ResyncState
from anydraft.vocab.token_bytes import ByteScheme, TokenBytesTable, TokenKind, UnsupportedTokenizer

__all__ = [
    "BridgeStats", "ByteScheme", "D2TError", "DraftResync", "ResyncEdit", "ResyncState", "TokenBytesTable",
    "TokenKind", "UnsupportedTokenizer", "VocabBridge", "build_d2t", "build_d2t_from_ids", "load_d2t",
    "load_or_build_bridge", "save_d2t", "validate_d2t",
]
