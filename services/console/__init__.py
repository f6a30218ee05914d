"""The web console of `mtc serve` (/console)."""
