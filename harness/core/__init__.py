"""The shared core of the driver side: the user error type, a model's files and vocabulary, engine environments."""
