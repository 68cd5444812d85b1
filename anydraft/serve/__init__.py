"""The OpenAI-compatible server: protocol, API server, async engine wrapper, metrics."""
