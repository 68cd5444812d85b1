"""Evaluation harnesses (GSM8K)."""
