"""Speculative decoding: proposers, verification and sampling."""
