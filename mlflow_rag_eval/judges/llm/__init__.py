"""What every LLM judge shares: the judge (:mod:`.judge`), chat messages and replies
(:mod:`.chat`), the transport with retries, rate limit and deadline (:mod:`.transport`), token
usage and prices (:mod:`.usage`); parsing, structured output, the worker pool and settings are
private plumbing (``_`` modules)."""
