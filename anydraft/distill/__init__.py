"""Distillation of a draft of any vocabulary towards a target's next-token distribution (anydraft distill)."""
