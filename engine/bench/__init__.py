"""Engine benchmarks behind `draftline bench engine|peers|model|routing` (never imported by the server)."""


def first_line(exc: BaseException) -> str:
    """An exception as one line for a bench's error message (transformers' and httpx's run to several)."""
    text = str(exc).strip().split("\n", 1)[0] or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
