"""Task specs of the toy plugin."""
