"""How events and entities read to people: the CLI, the demos, the console and ``make stack``.

Presentation, not the library: ``shared`` keeps the domain and its ports; what a user sees
lives here, beside the CLI and the console that use it.
"""
