"""Adapters that run anydraft's draft side inside other serving engines (optional extras; the core never imports them)."""
