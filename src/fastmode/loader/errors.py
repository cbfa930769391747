class ModelLoadError(ValueError):
    """A checkpoint could not be loaded; the message names what is missing or unsupported."""
