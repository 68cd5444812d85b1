"""How many tokens each step drafts: the SpeculationPolicy protocol, its records, and two policies."""
from .adaptive import AdaptiveK, AdaptiveParams
from .fixed import FixedK
from .records import BatchView, SpeculationPolicy, StepPlan, StepRecord

__all__ = ["AdaptiveK", "AdaptiveParams", "BatchView", "FixedK", "SpeculationPolicy", "StepPlan", "StepRecord"]
