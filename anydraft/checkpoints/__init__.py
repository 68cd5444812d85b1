"""Writing and reshaping checkpoints: growth into real architectures' shapes (shapes.py, grow.py), the grown
checkpoints' writer and cache (grown_checkpoint.py), and the speculators-format drafter writer. Loading and
running a model is anydraft.model's concern."""
