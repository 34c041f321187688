"""Errors that are the user's to fix: the CLI prints them as one line and exits 2."""


class UserError(ValueError):
    """Bad input (a name, a spec, a path, missing data). The message names the problem and the fix."""


def close_matches(word: str, choices, n: int = 3) -> str:
    """'; did you mean a, b?' or '' — for one-line errors about unknown names."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.5)
    return f"; did you mean {', '.join(close)}?" if close else ""
