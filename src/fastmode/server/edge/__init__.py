"""The HTTP edge: what may enter and how it is refused. Errors in each dialect's format
(`errors.py`), hosts and origins (`origin.py`), body size, counts and depth (`limits.py`),
slow clients (`timeouts.py`), tiers, lanes, queue bounds (`admission.py`) and rate limits
(`ratelimit.py`), and the drain on shutdown (`shutdown.py`)."""
