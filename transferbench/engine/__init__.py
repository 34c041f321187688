"""Fine-tune loop, feature extraction, cells and executors."""
