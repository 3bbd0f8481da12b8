"""Training helpers for PyTorch loops (the `torch` extra): resumable training and the distributed context."""
